"""Every optimizer trains the tiny LoRA through the real engine: in-process on the plain backend
for all of them, and real DeepSpeed gloo ranks for those that are not torch's own (client
optimizers inside DeepSpeed's engine, with its gradient clipping, checkpoint and resume)."""
from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pytest
import torch

from engine_runs import final_lora, make_config, rewound_copy, run_to_end
from PipeTrain.engine.config.choices import OPTIMIZERS
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec
from PipeTrain.engine.events import EVENTS_FILE, EventLog

pytestmark = pytest.mark.slow

LEARNING_RATES = {"prodigy": 1.0, "adafactor": 0.1}  # the others: AdamW-like, 2e-3 here


def _config(tmp_path, comfy_root, demo_base, cache_dir, optimizer: str, name: str, processes: int = 1,
            **train) -> RunConfig:
    lora = LoraSpec(rank=4, targets="attention_mlp", dtype="bfloat16" if optimizer == "adamw8bit_kahan" else "float32")
    train = {"steps": 24, "batch_size": 4, "learning_rate": LEARNING_RATES.get(optimizer, 2e-3), "grad_clip": 0.5,
             **train}
    return make_config(tmp_path / name, comfy_root, demo_base, cache_dir, processes=processes, lora=lora,
                       memory=MemorySpec(optimizer=optimizer, base_dtype="float32"), **train)


def _train_in_process(cfg: RunConfig) -> list[float]:
    """engine.train.loop.train in this process, the plain backend: the same code a rank runs after setup."""
    from PipeTrain.engine.train.loop import train

    cfg = dataclasses.replace(cfg, launch=LaunchSpec(num_gpus=1, backend="plain"))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    threads = torch.get_num_threads()
    # One thread: on a busy 2-core machine two threads stalled on each other (10x slower steps).
    torch.set_num_threads(1)
    try:  # train() installs its Cancel handlers; give pytest its own back
        assert train(cfg, torch.device("cpu"), EventLog(cfg.run_dir)) == 0
    finally:
        torch.set_num_threads(threads)
        for s, h in handlers.items():
            signal.signal(s, h)
    events = [json.loads(line) for line in (Path(cfg.run_dir) / EVENTS_FILE).read_text().splitlines()]
    assert events[-1]["event"] == "done", events[-1]
    return [e["loss"] for e in events if e["event"] == "step"]


def _falls(losses: list[float], factor: float = 0.85) -> None:
    first, last = sum(losses[:6]) / 6, sum(losses[-6:]) / 6
    assert last < factor * first, f"loss did not fall: first 6 steps {first:.4f}, last 6 {last:.4f}"


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_each_optimizer_trains_the_lora_on_the_plain_backend(optimizer, tmp_path, comfy_root, demo_base, cache_dir):
    losses = _train_in_process(_config(tmp_path, comfy_root, demo_base, cache_dir, optimizer, optimizer))
    assert len(losses) == 24
    _falls(losses)


@pytest.mark.parametrize("optimizer", ["adamw8bit", "prodigy"])
def test_deepspeed_ranks_train_with_library_optimizers(optimizer, tmp_path, comfy_root, demo_base, cache_dir):
    """2 gloo ranks, the optimizer as DeepSpeed's client optimizer, DeepSpeed's gradient clipping."""
    run = run_to_end(_config(tmp_path, comfy_root, demo_base, cache_dir, optimizer, "ds", processes=2, steps=6,
                             batch_size=2))
    assert run.of("started")[0]["world_size"] == 2
    assert all(loss == loss for loss in run.losses()), run.losses()
    assert any(v.abs().sum() > 0 for k, v in final_lora(run.cfg.run_dir).items() if k.endswith("lora_B.weight"))
    states = torch.load(Path(run.cfg.run_dir) / "checkpoints" / "step000006" / "mp_rank_00_model_states.pt",
                        map_location="cpu", weights_only=True)
    assert states["optimizer"]["state"], "DeepSpeed saved no optimizer state"


@pytest.mark.parametrize("optimizer", ["adamw8bit_kahan", "adamw_cpu_offload"])
def test_deepspeed_ranks_resume_our_optimizers_exactly(optimizer, tmp_path, comfy_root, demo_base, cache_dir):
    """Our own state formats (8-bit codes + bf16 compensation; CPU masters) through DeepSpeed's
    checkpoints: resuming at step 3 repeats steps 4-6 exactly, on 2 gloo ranks."""
    full = run_to_end(_config(tmp_path, comfy_root, demo_base, cache_dir, optimizer, "full", processes=2, steps=6,
                              batch_size=2, checkpoint_every=3))
    assert full.of("started")[0]["world_size"] == 2
    resumed_dir = rewound_copy(full.cfg.run_dir, tmp_path / "resumed", "step000006", "step000003")
    resumed = run_to_end(dataclasses.replace(full.cfg, run_dir=str(resumed_dir), resume=True))
    assert [e["step"] for e in resumed.of("step")] == [4, 5, 6]
    assert resumed.losses() == pytest.approx(full.losses()[3:], rel=1e-6, abs=1e-8)
    a, b = final_lora(full.cfg.run_dir), final_lora(resumed_dir)
    assert any(v.abs().sum() > 0 for k, v in a.items() if k.endswith("lora_B.weight")), "LoRA B never trained"
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
