"""Optimizers and learning-rate schedules, chosen by name from small registries."""
from __future__ import annotations

import math
from typing import Callable

import torch

from .config import ConfigError, TrainSpec


def _adamw(params: list[torch.nn.Parameter], train: TrainSpec) -> torch.optim.Optimizer:
    # Weight decay only on matrices: decaying 1-D tensors (biases, norms) hurts and is not standard.
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": train.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    # A torch optimizer, not DeepSpeed's "Adam": that one JIT-builds FusedAdam (~1 min on CPU).
    return torch.optim.AdamW(groups, lr=train.learning_rate, betas=(0.9, 0.999), eps=1e-8)


OPTIMIZERS: dict[str, Callable[[list[torch.nn.Parameter], TrainSpec], torch.optim.Optimizer]] = {
    "adamw": _adamw,
}


def build_optimizer(name: str, params: list[torch.nn.Parameter], train: TrainSpec) -> torch.optim.Optimizer:
    if name not in OPTIMIZERS:
        raise ConfigError(f"optimizer {name!r} is not available: choose one of {', '.join(OPTIMIZERS)}.")
    return OPTIMIZERS[name](params, train)


def lr_multiplier(scheduler: str, warmup: int, total: int) -> Callable[[int], float]:
    """Multiplier on the base learning rate for optimizer step `step` (0-based)."""
    def constant(progress: float) -> float:
        return 1.0

    def linear(progress: float) -> float:
        return 1.0 - progress

    def cosine(progress: float) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    shape = {"constant": constant, "linear": linear, "cosine": cosine}[scheduler]

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return shape(progress)

    return f


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainSpec, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(train.scheduler, train.warmup_steps, total_steps))
