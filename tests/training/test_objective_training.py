"""The objective settings (run.json `objective`) through the real engine on the demo's tiny SD1.5 UNet: the
loss a run reports is the one its settings define, and a setting the model cannot use stops the run
before it trains, with the fix."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from PipeTrain.engine.config.objective import ObjectiveSpec
from engine_runs import EngineRun, build_cache, make_config, run_to_end

pytestmark = pytest.mark.slow


def _first_batch_loss(cfg, spec: ObjectiveSpec) -> float:
    """The loss of step 1's batch (stream positions 0..batch-1) on the base model, which is what the run's
    step 1 sees (LoRA B starts at 0), computed in this process."""
    import comfy.sd

    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.sample_order import SampleStream, collate

    t = cfg.train
    dataset = CachedDataset(cfg.cache_dir)
    stream = SampleStream([dataset.repeats(i) for i in range(len(dataset))], seed=t.seed, buckets=dataset.buckets(),
                          batch=t.batch_size)
    latents, conds, ids = collate(dataset, stream, SampleStream.positions(0, 0, 0, 1, 1, t.batch_size),
                                  torch.device("cpu"))
    model = comfy.sd.load_diffusion_model(cfg.model_path).model
    with torch.no_grad():
        return DiffusionObjective(model, seed=t.seed, objective=spec)(latents, conds, ids).item()


@pytest.mark.core
def test_huber_and_min_snr_reach_the_runs_loss(tmp_path, comfy_root, demo_base):
    cache = build_cache(comfy_root, demo_base)
    spec = ObjectiveSpec(loss="huber", huber_delta=0.5, min_snr_gamma=5.0)
    cfg = dataclasses.replace(make_config(tmp_path / "huber", comfy_root, demo_base, cache, steps=1), objective=spec)
    run = run_to_end(cfg)
    saved = json.loads((Path(cfg.run_dir) / "run.json").read_text(encoding="utf-8"))
    assert saved["objective"]["loss"] == "huber" and saved["objective"]["min_snr_gamma"] == 5.0
    (reported,) = run.losses()
    expected = _first_batch_loss(cfg, spec)
    assert reported == pytest.approx(expected, rel=1e-4)
    assert abs(reported - _first_batch_loss(cfg, ObjectiveSpec())) > 1e-3 * abs(reported)  # mse gives another


def test_a_setting_the_model_cannot_use_stops_the_run_with_the_fix(tmp_path, comfy_root, demo_base):
    cache = build_cache(comfy_root, demo_base)
    cfg = dataclasses.replace(make_config(tmp_path / "refused", comfy_root, demo_base, cache, steps=1),
                              objective=ObjectiveSpec(resolution_shift=True))
    refused = EngineRun(cfg)
    assert refused.wait(timeout=300) != 0
    message = " ".join(e.get("message", "") for e in refused.of("error"))
    assert "Flux-style schedule" in message and "turn resolution_shift off" in message, message
    assert not refused.of("step")


def test_cfg_augment_reaches_the_runs_loss_and_needs_the_empty_caption(tmp_path, comfy_root, demo_base):
    """objective.cfg_augment through a real rank: refused before training while the cache has no empty caption
    (with the fix), then step 1's reported loss is the CFG-augmented one computed here (collate with the empty
    caption beside each sample's own, engine/train/cfg_augment.py), not the plain one."""
    import comfy.sd

    from PipeTrain.engine.cache.caption_store import write_empty_caption
    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.sample_order import SampleStream, collate
    from tools.tiny_assets import load_tiny_encoders

    cache = build_cache(comfy_root, demo_base)
    spec = ObjectiveSpec(cfg_augment=4.0)
    empty = Path(cache) / "empty_caption.safetensors"
    if empty.exists():  # another test's caption_dropout put it there: start without it
        empty.unlink()
    refused = EngineRun(dataclasses.replace(make_config(tmp_path / "no_empty", comfy_root, demo_base, cache, steps=1),
                                            objective=spec))
    assert refused.wait(timeout=300) != 0
    message = " ".join(e.get("message", "") for e in refused.of("error"))
    assert "empty caption" in message and "caption_dropout" in message, message

    models = Path(demo_base["base_dir"]) / "models"
    _, clip = load_tiny_encoders(str(models / "vae" / demo_base["vae"]), str(models / "text_encoders" / demo_base["clip"]))
    write_empty_caption(cache, clip)
    cfg = dataclasses.replace(make_config(tmp_path / "cfg", comfy_root, demo_base, cache, steps=1), objective=spec)
    (reported,) = run_to_end(cfg).losses()
    t = cfg.train
    dataset = CachedDataset(cfg.cache_dir)
    stream = SampleStream([dataset.repeats(i) for i in range(len(dataset))], seed=t.seed, buckets=dataset.buckets(),
                          batch=t.batch_size)
    positions = SampleStream.positions(0, 0, 0, 1, 1, t.batch_size)
    model = comfy.sd.load_diffusion_model(cfg.model_path).model
    with torch.no_grad():
        latents, conds, ids = collate(dataset, stream, positions, torch.device("cpu"), uncond=True)
        expected = DiffusionObjective(model, seed=t.seed, objective=spec)(latents, conds, ids).item()
    assert reported == pytest.approx(expected, rel=1e-4)
    assert abs(reported - _first_batch_loss(cfg, ObjectiveSpec())) > 1e-3 * abs(reported)
