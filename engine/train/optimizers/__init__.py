"""The optimizer registry: name (memory.optimizer) -> builder.

Every builder takes the trainable parameters and the TrainSpec and returns a torch Optimizer
whose state_dict()/load_state_dict() restore it exactly (resume), for both backends: DeepSpeed's
engine takes it as a client optimizer, PlainTrainer steps it directly; both clip gradients
(train.grad_clip) before calling step(). Weight decay applies to matrices only: every 1-D
tensor (bias, norm scale) sits in a group with weight_decay 0.

Adding an optimizer = one builder here + its name in OPTIMIZERS / OPTIMIZER_NOTES (and a
learning-rate range in OPTIMIZER_LR_RANGES), all in engine/config/choices.py.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...config.checks import ConfigError
from ...config.sections import TrainSpec

BETAS = (0.9, 0.999)
EPS = 1e-8

Builder = Callable[[list[torch.nn.Parameter], TrainSpec], torch.optim.Optimizer]


def param_groups(params: list[torch.nn.Parameter], weight_decay: float) -> list[dict]:
    """Matrices decay, 1-D tensors (biases, norms) do not: decaying them hurts and is not standard."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}] if decay else []
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def _adamw(params, train: TrainSpec) -> torch.optim.Optimizer:
    # A torch optimizer, not DeepSpeed's "Adam": that one JIT-builds FusedAdam (~1 min on CPU).
    # On GPUs torch's fused kernel: one launch per parameter group instead of a few per tensor
    # (a Flux LoRA has ~1,000 tensors). CPU runs keep the default (foreach) implementation.
    fused = bool(params) and all(p.is_cuda for p in params)
    return torch.optim.AdamW(param_groups(params, train.weight_decay), lr=train.learning_rate, betas=BETAS, eps=EPS,
                             fused=fused or None)


def _adamw8bit(params, train: TrainSpec) -> torch.optim.Optimizer:
    import bitsandbytes as bnb

    return bnb.optim.AdamW8bit(param_groups(params, train.weight_decay), lr=train.learning_rate, betas=BETAS,
                               eps=EPS)


def _adamw8bit_kahan(params, train: TrainSpec) -> torch.optim.Optimizer:
    from .adamw8bit_kahan import AdamW8bitKahan

    return AdamW8bitKahan(param_groups(params, train.weight_decay), lr=train.learning_rate, betas=BETAS, eps=EPS)


def _adafactor(params, train: TrainSpec) -> torch.optim.Optimizer:
    # torch's Adafactor: lr is a relative step (a fraction of each weight tensor's RMS), 1e-2 typical.
    return torch.optim.Adafactor(param_groups(params, train.weight_decay), lr=train.learning_rate)


def _prodigy(params, train: TrainSpec) -> torch.optim.Optimizer:
    from pytorch_optimizer import Prodigy

    # Prodigy estimates the step size d itself; learning_rate (~1.0) scales that estimate. With
    # warmup the safeguard keeps the tiny warmup lrs from inflating d.
    return Prodigy(param_groups(params, train.weight_decay), lr=train.learning_rate, betas=BETAS,
                   weight_decouple=True, safeguard_warmup=train.warmup_steps > 0)


def _adamw_cpu_offload(params, train: TrainSpec) -> torch.optim.Optimizer:
    from .cpu_offload import CPUOffloadAdamW

    return CPUOffloadAdamW(param_groups(params, train.weight_decay), lr=train.learning_rate, betas=BETAS, eps=EPS)


OPTIMIZERS: dict[str, Builder] = {
    "adamw": _adamw,
    "adamw8bit": _adamw8bit,
    "adamw8bit_kahan": _adamw8bit_kahan,
    "adafactor": _adafactor,
    "prodigy": _prodigy,
    "adamw_cpu_offload": _adamw_cpu_offload,
}


def build_optimizer(name: str, params: list[torch.nn.Parameter], train: TrainSpec) -> torch.optim.Optimizer:
    if name not in OPTIMIZERS:
        raise ConfigError(f"memory.optimizer {name!r} is not available: choose one of {', '.join(OPTIMIZERS)}.")
    try:
        return OPTIMIZERS[name](params, train)
    except ImportError as e:
        raise ConfigError(f"memory.optimizer {name!r} needs the package {e.name!r}, which is not installed: "
                          f"pip install -r requirements.txt (in ComfyUI's Python), or pick another optimizer.") from e
