"""AdamW with 8-bit moments and Kahan-compensated updates of low-precision weights.

Two savings, each with its fix:
- Both Adam moments are stored block-wise in 8 bits (blockwise8bit.py): ~2 bytes of state per
  weight instead of 8. The second moment is stored as its square root, which halves the range of
  magnitudes the code must cover, so an entry whose gradient is small next to its block's
  largest one does not round to a zero denominator while its first moment is still non-zero.
- A LoRA kept in bfloat16 (lora.dtype) has 8 significant bits: an update smaller than half a
  unit in the last place of a weight rounds away, every step, and the weight stops learning.
  Kahan summation keeps what rounding dropped in a bfloat16 "compensation" buffer and adds it to
  the next update, so the weight follows the float32 trajectory to within one rounding.
  On float32 weights there is nothing to compensate: this is then plain 8-bit AdamW.
Tensors smaller than `min_8bit_size` keep float32 moments (as bitsandbytes does): they cost
nothing and quantising them gains nothing.
"""
from __future__ import annotations

import torch

from .base import ExactStateMixin, adamw_direction
from .blockwise8bit import BLOCK, blocks_for, dequantize, quantize_

MIN_8BIT_SIZE = 4096


class AdamW8bitKahan(ExactStateMixin, torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, min_8bit_size: int = MIN_8BIT_SIZE, kahan: bool = True):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.min_8bit_size = min_8bit_size
        self.kahan = kahan

    def _init_state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        state["step"] = 0
        if p.numel() >= self.min_8bit_size:
            n = blocks_for(p.numel())
            for name in ("exp_avg", "exp_avg_sqrt"):
                state[f"{name}_codes"] = torch.zeros(n * BLOCK, dtype=torch.uint8, device=p.device)
                state[f"{name}_scales"] = torch.zeros(n, dtype=torch.float32, device=p.device)
        else:
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            state["exp_avg_sqrt"] = torch.zeros_like(p, dtype=torch.float32)
        if self.kahan and p.dtype != torch.float32:
            state["compensation"] = torch.zeros_like(p)
        return state

    @staticmethod
    def _load_moment(state: dict, name: str, p: torch.Tensor, signed: bool) -> torch.Tensor:
        if name in state:
            return state[name]
        return dequantize(state[f"{name}_codes"], state[f"{name}_scales"], p, signed)

    @staticmethod
    def _store_moment(state: dict, name: str, value: torch.Tensor, signed: bool) -> None:
        if name not in state:  # float32 moments were updated in place
            quantize_(value, state[f"{name}_codes"], state[f"{name}_scales"], signed)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p] or self._init_state(p)
                state["step"] += 1
                grad = p.grad.float()
                exp_avg = self._load_moment(state, "exp_avg", p, signed=True)
                exp_avg_sqrt = self._load_moment(state, "exp_avg_sqrt", p, signed=False)
                exp_avg.lerp_(grad, 1.0 - beta1)
                exp_avg_sq = exp_avg_sqrt.square().mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                exp_avg_sqrt.copy_(exp_avg_sq.sqrt())
                self._store_moment(state, "exp_avg", exp_avg, signed=True)
                self._store_moment(state, "exp_avg_sqrt", exp_avg_sqrt, signed=False)
                update = adamw_direction(exp_avg, exp_avg_sq, state["step"], (beta1, beta2), group["eps"])
                weight = p.float()
                delta = update.mul_(-lr).sub_(weight, alpha=lr * wd)  # decoupled weight decay, as AdamW
                _apply(p, weight, delta, state.get("compensation"))
        return loss


def _apply(p: torch.Tensor, weight: torch.Tensor, delta: torch.Tensor, compensation: torch.Tensor | None) -> None:
    if compensation is None:
        p.copy_(weight.add_(delta))
        return
    wanted = delta.add_(compensation.float())  # this step's update plus what earlier roundings dropped
    rounded = (weight + wanted).to(p.dtype)
    compensation.copy_(wanted.sub_(rounded.float().sub_(weight)))  # the part that did not land
    p.copy_(rounded)
