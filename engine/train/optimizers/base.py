"""What PipeTrain's own optimizers share: the AdamW arithmetic and an exact state restore."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch


def adamw_direction(exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, step: int, betas: tuple[float, float],
                    eps: float) -> torch.Tensor:
    """Adam's bias-corrected step direction m_hat / (sqrt(v_hat) + eps), in float32, before the lr."""
    beta1, beta2 = betas
    denom = (exp_avg_sq.sqrt() / math.sqrt(1.0 - beta2 ** step)).add_(eps)
    return exp_avg.div(denom).div_(1.0 - beta1 ** step)


class ExactStateMixin:
    """`load_state_dict` that gives back every state tensor as it was saved.

    torch's default casts floating state to the parameter's dtype and device. That is lossy for
    optimizers whose state is deliberately not in the parameter's format: float32 block scales
    next to bfloat16 weights, or float32 master weights kept in CPU RAM for a GPU parameter.
    Here each tensor keeps its dtype and goes where `_state_device` says.
    """

    def _state_device(self, param: torch.Tensor) -> torch.device:
        return param.device

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, self.param_groups)):
            raise ValueError("the saved optimizer state was made for other trainable weights (a different LoRA "
                             "rank, targets or optimizer): resume with the same settings, or start a new run.")
        by_saved_id = {saved: p for s, g in zip(saved_groups, self.param_groups)
                       for saved, p in zip(s["params"], g["params"])}
        state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
        for saved_id, values in state_dict["state"].items():
            param = by_saved_id[saved_id]
            device = self._state_device(param)
            state[param] = {k: v.detach().to(device=device, copy=True) if torch.is_tensor(v) else v
                            for k, v in values.items()}
        self.state = state
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
