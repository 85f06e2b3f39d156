"""Helpers for the memory-option tests: the tiny Wan files, and the real engine loop run in-process.

`train_in_process` calls engine.train.loop.train with the DeepSpeed-free backend on the CPU: the same
code path as a launched rank (model loading, LoRA, memory options, loop, LoRA file), without the
launcher's start-up cost, so several option sets can be compared within the time budget.
"""
from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import torch

from engine_runs import final_lora
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec
from PipeTrain.engine.events import EventLog, EventTail


def wan_config(run_dir: Path, comfy_root: str, model: str, cache: str, memory: MemorySpec | None = None,
               processes: int = 1, backend: str = "plain", **train) -> RunConfig:
    defaults = dict(steps=8, learning_rate=2e-3, batch_size=2, grad_accum=1, seed=3)
    cfg = RunConfig(run_name=run_dir.name, run_dir=str(run_dir), comfyui_root=comfy_root, model_path=model,
                    cache_dir=cache, lora=LoraSpec(rank=4, targets="all_linear", dropout=0.1),
                    memory=memory or MemorySpec(base_dtype="float32"),
                    train=TrainSpec(**{**defaults, **train}), launch=LaunchSpec(num_gpus=processes, backend=backend))
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.save(run_dir / "run.json")
    return RunConfig.load(run_dir / "run.json")  # through validation and the JSON round trip, as the engine reads it


def with_memory(cfg: RunConfig, run_dir: Path, **changes) -> RunConfig:
    run_dir.mkdir(parents=True, exist_ok=True)
    out = dataclasses.replace(cfg, run_dir=str(run_dir), run_name=run_dir.name,
                              memory=dataclasses.replace(cfg.memory, **changes))
    out.validate()
    return out


@dataclasses.dataclass
class InProcessRun:
    cfg: RunConfig
    events: list[dict]

    def losses(self) -> list[float]:
        return [e["loss"] for e in self.events if e["event"] == "step"]

    def lora(self) -> dict[str, torch.Tensor]:
        return final_lora(self.cfg.run_dir)


def train_in_process(cfg: RunConfig) -> InProcessRun:
    from PipeTrain.engine.train.loop import train

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        train(cfg, torch.device("cpu"), EventLog(cfg.run_dir))
    finally:
        for s, h in handlers.items():  # the loop installs its own stop handlers
            signal.signal(s, h)
    events = EventTail(cfg.run_dir).read_new()
    assert any(e["event"] == "done" for e in events), events[-3:]
    return InProcessRun(cfg, events)

