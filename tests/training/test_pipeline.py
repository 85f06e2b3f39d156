"""Pipeline parallelism (Wan adapter): the stage layers equal ComfyUI's forward, and a 2-stage
DeepSpeed pipeline (2 gloo processes) trains exactly like one process at gas 1, 4 and 8."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import tiny_wan
from engine_runs import assert_same_lora, rewound_copy, run_all_to_end, run_to_end, stage_layers_forward
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec


@pytest.fixture(scope="module")
def wan_files(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("tiny-wan")
    model = tiny_wan.write_model(root / "tiny_wan.safetensors")
    return str(model), tiny_wan.write_cache(root / "data")


def test_stage_layers_equal_comfyui_forward(wan_files):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    import comfy.sd

    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.train.sample_order import SampleStream, collate
    from PipeTrain.engine.train.objective import DiffusionObjective

    model = comfy.sd.load_diffusion_model(wan_files[0]).model
    dataset = CachedDataset(wan_files[1])
    objective = DiffusionObjective(model, seed=3)
    latents, conds, ids = collate(dataset, SampleStream([1] * len(dataset), 3), [0, 1], torch.device("cpu"))
    prepared = objective.prepare(latents, conds, ids)
    with torch.no_grad():
        reference = model.apply_model(prepared.xt, prepared.sigma, transformer_options={}, **prepared.kwargs)
        acts = stage_layers_forward(model, prepared)
    assert torch.equal(acts, reference)


def _config(run_dir: Path, comfy_root: str, wan_files, processes: int, stages: int, grad_accum: int,
            steps: int = 3, checkpoint_every: int = 0, **train) -> RunConfig:
    cfg = RunConfig(run_name=run_dir.name, run_dir=str(run_dir), comfyui_root=comfy_root, model_path=wan_files[0],
                    cache_dir=wan_files[1], lora=LoraSpec(rank=4, targets="attention_mlp"),
                    memory=MemorySpec(pipeline_stages=stages),
                    train=TrainSpec(steps=steps, learning_rate=1e-3, batch_size=1, grad_accum=grad_accum, seed=1,
                                    scheduler="cosine", warmup_steps=1, checkpoint_every=checkpoint_every, **train),
                    launch=LaunchSpec(num_gpus=processes))
    cfg.validate()
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("grad_accum", [1, 4, 8])
def test_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, wan_files, grad_accum):
    plain, piped = run_all_to_end(_config(tmp_path / "plain", comfy_root, wan_files, 1, 1, grad_accum),
                                  _config(tmp_path / "piped", comfy_root, wan_files, 2, 2, grad_accum))
    assert plain.losses() == pytest.approx(piped.losses(), rel=1e-5, abs=1e-7)
    # The gradient norm over both stages (stage 1's alone would be smaller).
    assert plain.grad_norms() == pytest.approx(piped.grad_norms(), rel=1e-4)
    # A missing stage shows up as missing keys, a gas scaling error on one stage as a factor of gas.
    a = assert_same_lora(plain.cfg.run_dir, piped.cfg.run_dir, rtol=1e-4, atol=1e-6)
    moved = [k for k in a if k.endswith("lora_B.weight") and a[k].abs().sum() > 0]
    assert len(moved) == len([k for k in a if k.endswith("lora_B.weight")]), "a stage's LoRA never trained"


@pytest.mark.slow
def test_pipeline_resume_from_a_mid_run_checkpoint_equals_uninterrupted(tmp_path, comfy_root, wan_files):
    """Also the EMA of the LoRA, gathered from both stages into the LoRA files and each checkpoint."""
    full = run_to_end(_config(tmp_path / "full", comfy_root, wan_files, 2, 2, 2, steps=4, checkpoint_every=2,
                              ema_decay=0.5))
    resumed_dir = rewound_copy(full.cfg.run_dir, tmp_path / "resumed", "step000004", "step000002")
    resumed = run_to_end(dataclasses.replace(full.cfg, run_dir=str(resumed_dir), resume=True))
    assert [e["step"] for e in resumed.of("step")] == [3, 4]
    assert resumed.losses() == pytest.approx(full.losses()[2:], rel=1e-5, abs=1e-7)
    plain = assert_same_lora(full.cfg.run_dir, resumed_dir, rtol=1e-5, atol=1e-7)
    ema = assert_same_lora(full.cfg.run_dir, resumed_dir, rtol=1e-5, atol=1e-7, name="lora_final_ema.safetensors")
    assert ema.keys() == plain.keys()  # every stage's part
    assert any(not torch.equal(ema[k], plain[k]) for k in ema)
