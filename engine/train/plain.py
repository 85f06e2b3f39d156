"""Single-process training without DeepSpeed (Windows, minimal installs, one GPU).

`PlainTrainer` offers the part of DeepSpeed's engine interface the train loop uses
(forward, backward, step, save_checkpoint, load_checkpoint) with the same semantics:
backward divides the loss by the accumulation steps, step() measures the gradient norm, applies
clipping, the optimizer and the LR schedule once every `grad_accum` micro steps.

Checkpoint layout (its own, documented): <root>/<tag>/pipetrain_state.pt holds the trainable
weights, optimizer and scheduler state and the client state; <root>/latest names the newest tag,
as in DeepSpeed's layout. Written temp-then-rename; read back with torch.load(weights_only=True).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..atomic_files import replacing, write_text
from .grad_norm import norm_and_clip

STATE_FILE = "pipetrain_state.pt"


class PlainTrainer:
    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler, grad_accum: int,
                 grad_clip: float):
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.grad_accum = grad_accum
        self.grad_clip = grad_clip
        self.micro_steps = 0
        self.pipetrain_grad_norm: torch.Tensor | None = None
        self.trainable = [p for p in module.parameters() if p.requires_grad]

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.grad_accum).backward()

    def step(self) -> None:
        self.micro_steps += 1
        if self.micro_steps % self.grad_accum:
            return
        self.pipetrain_grad_norm = norm_and_clip(self.trainable, self.grad_clip)  # the norm before clipping
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu() for n, p in self.module.named_parameters() if p.requires_grad}

    def save_checkpoint(self, save_dir: str, tag: str, client_state: dict[str, Any],
                        exclude_frozen_parameters: bool = True) -> None:
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True, exist_ok=True)
        state = {"module": self._trainable_state(), "optimizer": self.optimizer.state_dict(),
                 "lr_scheduler": self.lr_scheduler.state_dict(), "micro_steps": self.micro_steps,
                 "client_state": client_state}
        with replacing(folder / STATE_FILE) as tmp:
            torch.save(state, tmp)
        write_text(Path(save_dir) / "latest", tag)

    def load_checkpoint(self, load_dir: str, load_module_strict: bool = False) -> tuple[str, dict[str, Any]]:
        tag = (Path(load_dir) / "latest").read_text().strip()
        path = Path(load_dir) / tag / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {path} is missing: it was written by another backend "
                                    "(DeepSpeed) or deleted; resume with the backend that wrote it, or start anew.")
        state = torch.load(path, map_location="cpu", weights_only=True)
        params = dict(self.module.named_parameters())
        with torch.no_grad():
            for name, value in state["module"].items():
                params[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.micro_steps = int(state["micro_steps"])
        return str(path.parent), state["client_state"]
