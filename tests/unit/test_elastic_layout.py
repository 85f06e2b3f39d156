"""Which checkpoint layouts a resume on another layout reads (engine/train/elastic.py): DeepSpeed's file
names of a data-parallel and of a pipelined checkpoint, checked without training (the real resumes are
tests/training/test_elastic_resume.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.revisions import check_resume, record
from PipeTrain.engine.train import elastic


def _folder(tmp_path: Path, name: str, files: list[str]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for f in files:
        (folder / f).write_bytes(b"")
    return folder


def test_the_stages_of_a_checkpoint_are_read_from_its_files(tmp_path):
    data_parallel = _folder(tmp_path, "dp", ["mp_rank_00_model_states.pt"])
    piped = _folder(tmp_path, "pp", [f"layer_{i:02d}-model_states.pt" for i in range(6)]
                    + ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"])
    assert (elastic.saved_stages(data_parallel), elastic.saved_stages(piped)) == (0, 2)
    for folder, stages in ((data_parallel, 1), (piped, 1), (piped, 2)):
        elastic.check_stages(folder, stages)  # data parallel reads every checkpoint, a pipeline its own
    with pytest.raises(ValueError, match=r"written by a 2-stage pipeline; a run with pipeline_stages 4 cannot "
                                         r"continue it: resume with pipeline_stages 2 or pipeline_stages 1"):
        elastic.check_stages(piped, 4)
    with pytest.raises(ValueError, match=r"written by a data-parallel run \(pipeline_stages 1\); a run with "
                                         r"pipeline_stages 2 cannot continue it: resume with pipeline_stages 1"):
        elastic.check_stages(data_parallel, 2)


def test_a_pipeline_resumed_data_parallel_is_no_change_other_stage_counts_are(tmp_path):
    piped = {"train": {"batch_size": 1, "grad_accum": 2}, "memory": {"pipeline_stages": 2, "pipeline_split": "3"},
             "launch": {"num_gpus": 2}}
    record(tmp_path, piped, 0)  # 1 replica at grad_accum 2
    data_parallel = {"train": {"batch_size": 1, "grad_accum": 1}, "memory": {"pipeline_stages": 1, "pipeline_split": ""},
                     "launch": {"num_gpus": 2}}
    assert check_resume(tmp_path, data_parallel) == []  # 2 replicas at grad_accum 1: the same global batch
    with pytest.raises(ConfigError, match=r"memory\.pipeline_stages: 2 -> 4"):
        check_resume(tmp_path, {**piped, "memory": {"pipeline_stages": 4, "pipeline_split": "3"},
                                "launch": {"num_gpus": 4}, "train": {"batch_size": 1, "grad_accum": 2}})
