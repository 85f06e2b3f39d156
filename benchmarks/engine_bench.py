"""Run PipeTrain's real engine (launcher -> DeepSpeed ranks -> events.jsonl) on a synthetic cache, and time it.

Shared by benchmarks/pipeline.py and benchmarks/throughput.py. The cache holds random latents and
random text conditioning of the shape's real sizes (model_shapes.Shape), so the engine does the same
work as on a real dataset; the model file is a random-init full-size file (model_shapes.write_random).
"""
from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from model_shapes import Shape


def write_cache(root: Path, shape: Shape, size: int, frames: int = 1, items: int = 16, height: int = 0) -> str:
    """A latent cache of `items` random samples at width size x height (default size; x frames); returns its folder."""
    import torch
    from PipeTrain.engine.cache.legacy import write_manifest
    from PipeTrain.engine.cache.writer import write_item
    from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec

    from shape_cond import sample_cond

    latent = shape.latent(size, frames, height)
    gen = torch.Generator().manual_seed(0)
    cache = root / f"cache_{shape.family}_{size}x{height or size}x{frames}"
    entries = []
    for i in range(items):
        # the family's conditioning in the cache's form (model_shapes.sample_cond), batched as ComfyUI returns it
        cond = sample_cond(shape, seed=i, size=size, frames=frames, height=height)
        extras: dict[str, Any] = {k: v.unsqueeze(0) if isinstance(v, torch.Tensor) else v
                                  for k, v in cond["extras"].items()}
        write_item(cache, i, torch.randn((1, *latent), generator=gen), cond["cross_attn"].unsqueeze(0), extras,
                   f"item{i}.png", f"caption {i}", 1)
        entries.append({"file": f"items/{i:06d}.safetensors", "source": f"item{i}.png", "repeats": 1})
    spec = DatasetSpec(folders=(FolderSpec(str(root)),), resolution=size)
    write_manifest(cache, "0" * 16, spec, entries, list(latent), ["cross_attn", *sorted(extras)],
                   {"benchmark": "random"})
    return str(cache)


def run_engine(name: str, model: str, cache: str, out: Path, *, gpus: int, steps: int, grad_accum: int = 1,
               stages: int = 1, split: str = "", memory: dict[str, Any] | None = None,
               lora: dict[str, Any] | None = None, batch_size: int = 1) -> dict[str, Any]:
    """One training run through engine.launch.launcher; step times from its events (median after 2 warm-up steps).
    memory / lora: MemorySpec / LoraSpec fields over the defaults (LoRA rank 32 on every block linear).
    batch_size: samples per micro-batch (the cache needs at least batch_size x grad_accum items)."""
    import torch
    from PipeTrain.engine.launch import launcher
    from PipeTrain.engine.config.launch import LaunchSpec
    from PipeTrain.engine.config.run import RunConfig
    from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec
    from PipeTrain.engine.events import EventTail

    run_dir = out / name
    if run_dir.exists():  # a fresh run: old events would be read as this run's
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    fields = dict(memory or {})
    cfg = RunConfig(run_name=name, run_dir=str(run_dir), comfyui_root=os.environ["COMFYUI_PATH"], model_path=model,
                    cache_dir=cache, lora=LoraSpec(**{"rank": 32, "targets": "all_linear", **(lora or {})}),
                    memory=MemorySpec(base_dtype=fields.pop("base_dtype", "bfloat16"), pipeline_stages=stages,
                                      pipeline_split=split, **fields),
                    train=TrainSpec(steps=steps, learning_rate=1e-4, batch_size=batch_size, grad_accum=grad_accum,
                                    seed=0),
                    launch=LaunchSpec(num_gpus=gpus))
    cfg.save(run_dir / "run.json")
    started = time.time()
    proc = launcher.spawn(RunConfig.load(run_dir / "run.json"), run_dir / "run.json", cuda=torch.cuda.is_available())
    proc.wait()
    events = EventTail(run_dir).read_new()
    step_events = [e for e in events if e["event"] == "step"]
    if proc.returncode != 0 or not step_events:
        tail = launcher.log_tail(run_dir, 30)
        print(tail, flush=True)
        return {"run": name, "gpus": gpus, "stages": stages, "grad_accum": grad_accum, "batch_size": batch_size,
                "error": (tail.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:160]}
    timed = step_events[2:] if len(step_events) > 3 else step_events[-1:]
    step_s = statistics.median(e["seconds"] for e in timed)
    samples = batch_size * grad_accum * (gpus // stages)
    return {"run": name, "gpus": gpus, "stages": stages, "grad_accum": grad_accum, "batch_size": batch_size,
            "step_s": step_s,
            "samples_per_step": samples, "samples_per_s": samples / step_s, "ms_per_sample": 1000 * step_s / samples,
            "launch_to_first_step_s": step_events[0]["time"] - started,  # until the first loss is shown
            "first_step_s": step_events[0]["seconds"],  # compiling included
            "setup_phases": next((e.get("setup_phases", {}) for e in events if e["event"] == "started"), {}),
            "launch_to_started_s": next((e["time"] for e in events if e["event"] == "started"), started) - started,
            "peak_gib": max((e.get("peak_gib", 0.0) for e in step_events), default=0.0),
            "losses": [round(e["loss"], 5) for e in step_events]}


def lora_drift(run_a: Path, run_b: Path) -> float:
    """Largest |difference| between two runs' final LoRAs, relative to the largest |weight|."""
    from safetensors.torch import load_file

    a, b = (load_file(str(d / "lora" / "lora_final.safetensors")) for d in (run_a, run_b))
    scale = max(t.float().abs().max().item() for t in b.values())
    return max((a[k].float() - b[k].float()).abs().max().item() for k in b) / max(scale, 1e-12)
