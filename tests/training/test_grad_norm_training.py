"""The gradient norm of each step (engine/train/grad_norm.py) in real engine runs on the tiny UNet: step 1's
equals the norm of an in-process first step (same seed, same batch) before clipping, with clipping on and
off, on DeepSpeed and on the plain backend, in the step events and in TensorBoard."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engine_runs import assert_same_lora, final_lora, make_config, run_all_to_end

pytestmark = pytest.mark.slow


def first_step_norm(cfg) -> float:
    """The gradient norm of step 1 computed here as engine/train/loop.py computes the step: the same model
    setup, LoRA seed, samples, noise and accumulation, on the CPU, before any clipping."""
    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.memory.options import apply_memory_options
    from PipeTrain.engine.models.loading import load_base_model
    from PipeTrain.engine.patches.probe_batch import probe_forward
    from PipeTrain.engine.patches.trainable import make_trainable
    from PipeTrain.engine.train.lora import inject_lora, lora_parameters
    from PipeTrain.engine.train.objective import DiffusionObjective, apply_timestep_shift
    from PipeTrain.engine.train.sample_order import SampleStream, collate

    t, cpu = cfg.train, torch.device("cpu")
    dataset = CachedDataset(cfg.cache_dir)
    stream = SampleStream([dataset.repeats(i) for i in range(len(dataset))], seed=t.seed, buckets=dataset.buckets(),
                          batch=t.batch_size)
    model = load_base_model(cfg, cpu)
    apply_timestep_shift(model, t.timestep_shift)
    run_forward, context = probe_forward(DiffusionObjective(model, seed=t.seed), dataset, cpu)
    make_trainable(model.diffusion_model, run_forward, device=cpu, context=context)
    torch.manual_seed(t.seed)
    inject_lora(model.diffusion_model, cfg.lora)
    apply_memory_options(model, cfg.memory, cpu)
    objective = DiffusionObjective(model, seed=t.seed, timestep_sampling=t.timestep_sampling,
                                   t_range=(t.min_t, t.max_t), objective=cfg.objective)
    for micro in range(t.grad_accum):
        positions = SampleStream.positions(0, micro, 0, 1, t.grad_accum, t.batch_size)
        latents, conds, ids = collate(dataset, stream, positions, cpu)
        torch.manual_seed(t.seed * 1_000_003 + positions[0])
        (objective(latents, conds, ids) / t.grad_accum).backward()
    grads = [p.grad.flatten() for p in lora_parameters(model.diffusion_model) if p.grad is not None]
    return torch.linalg.vector_norm(torch.cat(grads).double()).item()


def _tensorboard_scalars(run_dir: str, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(run_dir) / "tensorboard"))
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]


def test_step_one_reports_the_norm_before_clipping_on_both_backends(tmp_path, comfy_root, demo_base, cache_dir):
    base = make_config(tmp_path / "ref", comfy_root, demo_base, cache_dir, steps=2, grad_accum=2, grad_clip=0.0)
    reference = first_step_norm(base)
    assert reference > 0

    def variant(name, backend, clip):
        return dataclasses.replace(base, run_dir=str(tmp_path / name), run_name=name,
                                   train=dataclasses.replace(base.train, grad_clip=clip),
                                   launch=dataclasses.replace(base.launch, backend=backend))

    clip = reference / 10  # clipping is on in step 1: a norm measured after it would be `clip`
    runs = run_all_to_end(variant("ds_off", "deepspeed", 0.0), variant("ds_clip", "deepspeed", clip),
                          variant("plain_off", "plain", 0.0), variant("plain_clip", "plain", clip))
    for run in runs:
        norms = run.grad_norms()
        assert len(norms) == 2 and all(n > 0 for n in norms), (run.cfg.run_name, norms)
        assert norms[0] == pytest.approx(reference, rel=1e-4), (run.cfg.run_name, norms[0], reference)
        assert _tensorboard_scalars(run.cfg.run_dir, "train/grad_norm") == pytest.approx(norms, rel=1e-6)
    # both backends clip by that norm (DeepSpeed's own clipping is off: engine/patches/deepspeed.py), so their
    # LoRAs agree; the clipped one differs from the unclipped, so leaving the clipping out could not pass
    ds_off, ds_clip, _, plain_clip = (run.cfg.run_dir for run in runs)
    assert_same_lora(plain_clip, ds_clip, rtol=1e-4, atol=1e-6)
    unclipped, clipped = final_lora(ds_off), final_lora(ds_clip)
    assert max((unclipped[k] - clipped[k]).abs().max().item() for k in clipped) > 1e-4
