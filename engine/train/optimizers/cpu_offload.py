"""AdamW whose state lives in CPU RAM and whose step runs on the CPU.

For each trainable weight the CPU holds a float32 master copy and both AdamW moments (12 bytes
per weight); the accelerator keeps only the weight in its training dtype and its gradient. A step
copies all gradients to pinned host buffers at once, waits for them, runs AdamW on the masters,
and sends the updated weights back with non-blocking copies that overlap the next forward pass.
The master copy also means a bfloat16 LoRA accumulates its updates in float32.
Without CUDA the same code runs with the "device" being the CPU (no pinned memory then).
"""
from __future__ import annotations

import torch

from .base import ExactStateMixin, adamw_direction

_CPU = torch.device("cpu")


class CPUOffloadAdamW(ExactStateMixin, torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self._staging: dict[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] = {}  # not state: rebuilt on demand

    def _state_device(self, param: torch.Tensor) -> torch.device:
        return _CPU

    def _buffers(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Host buffers (gradient in, weight out) in the parameter's dtype; pinned when it is on a GPU."""
        if p not in self._staging:
            pin = p.device.type == "cuda"
            self._staging[p] = (torch.empty(p.shape, dtype=p.grad.dtype, pin_memory=pin),
                                torch.empty(p.shape, dtype=p.dtype, pin_memory=pin))
        return self._staging[p]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        todo = [(group, p) for group in self.param_groups for p in group["params"] if p.grad is not None]
        for _, p in todo:  # queue every device-to-host gradient copy before waiting for any
            self._buffers(p)[0].copy_(p.grad, non_blocking=True)
        for device in {p.device for _, p in todo if p.device.type == "cuda"}:
            torch.cuda.current_stream(device).synchronize()
        for group, p in todo:
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["master"] = p.detach().to(_CPU, torch.float32, copy=True)
                state["exp_avg"] = torch.zeros_like(state["master"])
                state["exp_avg_sq"] = torch.zeros_like(state["master"])
            grad_host, weight_host = self._buffers(p)
            grad = grad_host.float()
            beta1, beta2 = group["betas"]
            state["step"] += 1
            state["exp_avg"].lerp_(grad, 1.0 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
            master = state["master"]
            master.mul_(1.0 - group["lr"] * group["weight_decay"])
            master.sub_(adamw_direction(state["exp_avg"], state["exp_avg_sq"], state["step"], (beta1, beta2),
                                        group["eps"]), alpha=group["lr"])
            # The next step's synchronize (after its backward) orders these copies before the
            # host buffers are written again.
            weight_host.copy_(master)
            p.copy_(weight_host, non_blocking=True)
        return loss
