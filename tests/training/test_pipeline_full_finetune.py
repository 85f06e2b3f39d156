"""A full fine-tune (lora.kind = "full") on a 2-stage DeepSpeed pipeline (2 gloo processes, tiny Wan):
each stage trains its own blocks, and the run equals one plain process: the same losses and gradient norms,
and the saved diffusion-model file (rank 0 takes the other stage's trained weights over its own copy) and the
EMA model beside it hold the same weights; a resume from a mid-run checkpoint of the pipeline repeats the uninterrupted run, also as
2-way data parallel."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import tiny_wan
from engine_runs import rewound_copy, run_all_to_end, run_to_end
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wan_files(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("tiny-wan-full")
    return str(tiny_wan.write_model(root / "tiny_wan.safetensors")), tiny_wan.write_cache(root / "data")


def _config(run_dir: Path, comfy_root: str, wan_files, processes: int, stages: int, steps: int = 3,
            checkpoint_every: int = 0, grad_accum: int = 2, ema_decay: float = 0.0) -> RunConfig:
    cfg = RunConfig(run_name=run_dir.name, run_dir=str(run_dir), comfyui_root=comfy_root, model_path=wan_files[0],
                    cache_dir=wan_files[1], lora=LoraSpec(kind="full", targets="attention_mlp"),
                    memory=MemorySpec(pipeline_stages=stages),
                    train=TrainSpec(steps=steps, learning_rate=1e-3, batch_size=1, grad_accum=grad_accum, seed=1,
                                    checkpoint_every=checkpoint_every, ema_decay=ema_decay),
                    launch=LaunchSpec(num_gpus=processes))
    cfg.validate()
    return cfg


def _model(run, name: str = "model_final.safetensors") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(run.cfg.run_dir) / "model" / name))


def test_two_stage_full_finetune_trains_like_one_process(tmp_path, comfy_root, wan_files):
    from safetensors.torch import load_file

    plain, piped = run_all_to_end(_config(tmp_path / "plain", comfy_root, wan_files, 1, 1, ema_decay=0.5),
                                  _config(tmp_path / "piped", comfy_root, wan_files, 2, 2, ema_decay=0.5))
    assert "pipeline stage 2/2" in piped.log()
    assert plain.losses() == pytest.approx(piped.losses(), rel=1e-5, abs=1e-7)
    assert plain.grad_norms() == pytest.approx(piped.grad_norms(), rel=1e-4)
    want, got, base = _model(plain), _model(piped), load_file(wan_files[0])
    assert got.keys() == want.keys() == base.keys()
    # Trained weights of both stages (the first and the last of the tiny Wan's 4 blocks) moved from the base;
    # the file equals the plain run's to bf16 rounding (the weights train in float32 and are saved in bf16).
    moved = {k for k in got if not torch.equal(got[k], base[k].to(got[k].dtype))}
    assert any(k.startswith("blocks.0.") for k in moved) and any(k.startswith("blocks.3.") for k in moved)
    for key in want:  # float32 sums in another order, then bf16: at most one bf16 step apart
        torch.testing.assert_close(got[key].float(), want[key].float(), rtol=2 ** -7, atol=1e-6, msg=key)
    # The EMA of both stages' weights (each stage's rank keeps its own; rank 0 writes them all)
    want_ema, got_ema = _model(plain, "model_final_ema.safetensors"), _model(piped, "model_final_ema.safetensors")
    assert any(not torch.equal(got_ema[k], got[k]) for k in moved)
    for key in want_ema:
        torch.testing.assert_close(got_ema[key].float(), want_ema[key].float(), rtol=2 ** -7, atol=1e-6, msg=key)


def test_pipeline_full_finetune_resume_equals_uninterrupted(tmp_path, comfy_root, wan_files):
    """Resumed from its step-2 checkpoint as the same 2-stage pipeline, and as 2-way data parallel (1 replica at
    grad_accum 2 -> 2 replicas at 1: the same global batch; engine/train/elastic.py)."""
    whole = run_to_end(_config(tmp_path / "whole", comfy_root, wan_files, 2, 2, steps=4, checkpoint_every=2))
    resumed_dir = rewound_copy(whole.cfg.run_dir, tmp_path / "resumed", "step000004", "step000002")
    resumed = run_to_end(dataclasses.replace(whole.cfg, run_dir=str(resumed_dir), resume=True))
    assert [e["step"] for e in resumed.of("step")] == [3, 4]
    assert resumed.losses() == pytest.approx(whole.losses()[2:], rel=1e-5, abs=1e-7)
    want, got = _model(whole), _model(resumed)
    assert all(torch.equal(got[k], want[k]) for k in want)
    dp_dir = rewound_copy(whole.cfg.run_dir, tmp_path / "dp", "step000004", "step000002")
    dp = run_to_end(dataclasses.replace(_config(dp_dir, comfy_root, wan_files, 2, 1, steps=4, checkpoint_every=2,
                                                grad_accum=1), resume=True))
    assert [e["step"] for e in dp.of("step")] == [3, 4] and dp.of("world_changed")
    assert dp.losses() == pytest.approx(whole.losses()[2:], rel=1e-4, abs=1e-6)
    got = _model(dp)
    for key in want:  # float32 sums in another order, then bf16: at most one bf16 step apart
        torch.testing.assert_close(got[key].float(), want[key].float(), rtol=2 ** -7, atol=1e-6, msg=key)
