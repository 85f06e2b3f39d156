"""LoadDataset's batch_sizes (a batch size per resolution) in a real ComfyUI server, through POST /prompt:
a 64 px and a 128 px copy of every image, batches of 4 and of 1, one micro step per batch."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tools.comfy_server import ComfyError
from tools.demo import training_prompt

pytestmark = [pytest.mark.slow]


def _prompt(demo_base, tmp_path, run_name: str, **train) -> tuple[dict, dict]:
    prompt = training_prompt(demo_base, steps=0, processes=1, run_name=run_name, batch_size=2, epochs=1.0,
                             sample_prompts="", **train)
    ids = {v["class_type"]: k for k, v in prompt.items()}
    folder = tmp_path / "set"
    shutil.copytree(demo_base["dataset"], folder, ignore=shutil.ignore_patterns(".pipetrain_cache"))
    prompt[ids["PipeTrainLoadDataset"]]["inputs"].update(folders=str(folder), extra_resolutions="128",
                                                          batch_sizes="64:4, 128:1")
    return prompt, ids


def test_each_resolution_trains_in_batches_of_its_own_size(comfy_server, demo_base, tmp_path):
    prompt, ids = _prompt(demo_base, tmp_path, "batch_sizes")
    entry = comfy_server.run(prompt, timeout=600)
    report = entry["outputs"][ids["PipeTrainLoadDataset"]]["text"]
    assert "batch size per resolution: 64 px: 4, 128 px: 1 (other resolutions: Train Pipeline's batch_size)." in \
        report, report
    run_dir = Path(demo_base["base_dir"]) / "output" / "pipetrain" / "batch_sizes"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["event"] == "started")
    # 8 images at 64 px in 2 batches of 4 + 8 at 128 px in 8 batches of 1: one epoch is 10 micro steps, where
    # batch_size 2 everywhere would make it 16 samples / 2 = 8 steps
    assert started["samples"] == 16 and started["total"] == 10, started
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert len(losses) == 10 and all(math.isfinite(x) for x in losses)
    assert any(e["event"] == "done" for e in events)


def test_batch_sizes_with_pipeline_stages_are_refused_before_launch(comfy_server, demo_base, tmp_path):
    prompt, ids = _prompt(demo_base, tmp_path, "batch_sizes_piped", num_gpus=2)
    prompt[ids["PipeTrainMemoryOptions"]]["inputs"]["pipeline_stages"] = 2
    with pytest.raises(ComfyError, match="set pipeline_stages to 1, or clear batch_sizes"):
        comfy_server.run(prompt, timeout=300)
    assert not (Path(demo_base["base_dir"]) / "output" / "pipetrain" / "batch_sizes_piped" / "run.json").exists()
