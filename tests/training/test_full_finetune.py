"""A full fine-tune (lora.kind = "full") of the tiny UNet through the real engine, plain backend (one process,
no DeepSpeed launch): only the selected block weights change, the saved model file loads through ComfyUI's own
loader and denoises better than the base model, the EMA model files average the per-step ones, and a resume
from a mid-run checkpoint repeats the uninterrupted run, its EMA included. Activation checkpointing is on: the
trained weights get their gradients through it."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from PipeTrain.engine.config.sections import LoraSpec, MemorySpec
from engine_runs import build_cache, make_config, run_to_end

pytestmark = pytest.mark.slow

LORA = LoraSpec(targets="attention", target_regex=r"output_blocks", kind="full")


def _model_file(run_dir, name: str = "model_final.safetensors") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(run_dir) / "model" / name))


def _denoising_loss(model, cache_dir: str) -> float:
    """The objective at fixed noise and timesteps on the whole demo cache (the same draws for every model)."""
    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.sample_order import batch_items

    dataset = CachedDataset(cache_dir)
    latents, conds = batch_items([dataset[i] for i in range(len(dataset))], torch.device("cpu"))
    with torch.no_grad():
        return float(DiffusionObjective(model, seed=7)(latents.float(), conds, list(range(len(conds)))))


def test_full_finetune_trains_saves_and_resumes(tmp_path, comfy_root, demo_base):
    import comfy.sd

    from PipeTrain.engine.train.full_tune import select_full_params

    cache_dir = build_cache(comfy_root, demo_base)
    cfg = make_config(tmp_path / "whole", comfy_root, demo_base, cache_dir, lora=LORA, steps=6, checkpoint_every=3,
                      learning_rate=2e-3, memory=MemorySpec(activation_checkpointing="on"),  # gradients through it
                      save_every=1, ema_decay=0.5, ema_start_step=1)
    whole = run_to_end(dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, backend="plain")))
    assert whole.of("done")[-1]["model"].endswith("model_final.safetensors")
    assert whole.of("done")[-1]["model_ema"].endswith("model_final_ema.safetensors")
    assert not (Path(whole.cfg.run_dir) / "lora").exists()  # no LoRA file for a full fine-tune

    base = comfy.sd.load_diffusion_model(whole.cfg.model_path)
    base_sd = base.model.diffusion_model.state_dict()
    selected = set(select_full_params(base.model.diffusion_model, LORA))
    assert selected and all(".output_blocks." in f".{n}" and "attn" in n for n in selected)
    saved = _model_file(whole.cfg.run_dir)
    assert saved.keys() == base_sd.keys()  # the whole diffusion model, ComfyUI's keys
    assert all(t.dtype == torch.bfloat16 for t in saved.values() if t.is_floating_point())
    changed = {k for k in saved if not torch.equal(saved[k], base_sd[k].to(saved[k].dtype))}
    assert changed and changed <= selected  # only the selected weights moved; the rest bit for bit the base's

    trained = comfy.sd.load_diffusion_model(str(Path(whole.cfg.run_dir) / "model" / "model_final.safetensors"))
    loaded = trained.model.diffusion_model.state_dict()
    assert all(torch.equal(loaded[k].to(torch.bfloat16), saved[k]) for k in changed)  # the trained weights
    assert _denoising_loss(trained.model, cache_dir) < _denoising_loss(base.model, cache_dir)

    # The EMA (kept in CPU memory, saved beside each model file): step 1's weights, then 0.5 * ema + 0.5 * weights;
    # the other tensors are the base's. Files are bf16 and the EMA averages the float32 weights: bf16 rounding.
    w1, w2 = (_model_file(whole.cfg.run_dir, f"model_step00000{i}.safetensors") for i in (1, 2))
    e1, e2, e_final = (_model_file(whole.cfg.run_dir, name) for name in (
        "model_step000001_ema.safetensors", "model_step000002_ema.safetensors", "model_final_ema.safetensors"))
    assert e_final.keys() == saved.keys()
    assert all(torch.equal(e_final[k], saved[k]) for k in saved if k not in changed)
    for k in changed:
        assert torch.equal(e1[k], w1[k])
        torch.testing.assert_close(e2[k].float(), 0.5 * w1[k].float() + 0.5 * w2[k].float(), rtol=1e-2, atol=1e-3)
    assert any(not torch.equal(e_final[k], saved[k]) for k in changed), "the EMA is the last weights"

    # Resume: the copy as it stood at step 3 repeats steps 4-6 and saves the same model.
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(whole.cfg.run_dir, resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "step000006")
    shutil.rmtree(resumed_dir / "model")
    (resumed_dir / "checkpoints" / "latest").write_text("step000003")
    resumed = run_to_end(dataclasses.replace(whole.cfg, run_dir=str(resumed_dir), resume=True))
    assert [e["step"] for e in resumed.of("step")] == [4, 5, 6]
    assert resumed.losses() == pytest.approx(whole.losses()[3:], rel=1e-5, abs=1e-7)
    again, again_ema = _model_file(resumed_dir), _model_file(resumed_dir, "model_final_ema.safetensors")
    for k in changed:
        torch.testing.assert_close(again[k].float(), saved[k].float(), rtol=1e-2, atol=1e-3)
        torch.testing.assert_close(again_ema[k].float(), e_final[k].float(), rtol=1e-2, atol=1e-3)
