"""Optimizers (by name, from the registry in engine/optimizers/) and learning-rate schedules."""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..config.sections import TrainSpec
from .optimizers import OPTIMIZERS, build_optimizer, param_groups

__all__ = ["OPTIMIZERS", "build_optimizer", "param_groups", "lr_multiplier", "build_scheduler"]


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
