"""An exponential moving average (EMA) of the trained weights (train.ema_decay, ema_start_step): the LoRA
adapters, or a full fine-tune's block weights.

After optimizer step s: ema = weights for s <= ema_start_step, else ema = decay * ema + (1 - decay) *
weights. The copy is fp32, each rank holding the weights it trains (pipelined: its stage's). For a LoRA it
lives on the device of the weights (small next to the model; updating it there costs no transfer). A full
fine-tune's is a second copy of every trained weight, which would not fit beside the model on most GPUs:
it lives in CPU memory (4 bytes per trained weight) and each step copies the weights over. It changes no
trained weight. It is saved beside each LoRA or model file as <name>_ema.safetensors (engine/lora_files.py)
and in each checkpoint as EMA_FILE, every tensor by its module path as the files name them, so a resume
continues it exactly, on any layout of ranks.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..atomic_files import write_safetensors

EMA_FILE = "pipetrain_ema.safetensors"  # in a checkpoint folder, beside the engine's own files


def ema_update(average: torch.Tensor, weight: torch.Tensor, decay: float) -> None:
    """average <- decay * average + (1 - decay) * weight, in place (the weight brought to the average's device)."""
    average.lerp_(weight.to(average.device, average.dtype), 1.0 - decay)


class WeightEma:
    def __init__(self, params: dict[str, torch.nn.Parameter], decay: float, start_step: int,
                 device: torch.device | None = None):
        """device: where the averages live (None: beside each weight)."""
        self.params, self.decay, self.start_step = params, decay, start_step
        self.average = {n: p.detach().to(device or p.device, torch.float32, copy=True) for n, p in params.items()}

    @torch.no_grad()
    def update(self, step: int) -> None:
        """After optimizer step `step` (1 for the first)."""
        for name, p in self.params.items():
            if step <= self.start_step:
                self.average[name].copy_(p.detach())
            else:
                ema_update(self.average[name], p.detach(), self.decay)

    def tensors(self) -> dict[str, torch.Tensor]:
        """This rank's averages by module path on the CPU: copies of those on a GPU, the averages themselves
        where they live on the CPU (no second copy of a full fine-tune's; write them before the next update)."""
        return {n: t.to("cpu").contiguous() for n, t in self.average.items()}

    def load(self, saved: dict[str, torch.Tensor], source: Path) -> None:
        missing = sorted(set(self.average) - set(saved))
        if missing:
            raise ValueError(f"the EMA in {source} has no {missing[0]} ({len(missing)} missing): it was saved for "
                             "other LoRA targets. Resume with the LoRA settings of that run, or start a new run.")
        with torch.no_grad():
            for name, t in self.average.items():
                t.copy_(saved[name])


def start_ema(train, params: dict[str, torch.nn.Parameter], checkpoint: Path | None, step: int, events,
              device: torch.device | None = None):
    """The run's WeightEma (None without train.ema_decay), continued from `checkpoint` (the folder resumed
    from) when that holds one; else it starts from the weights at `step` (a resume that turned EMA on,
    which engine/config/revisions.py lets through only with accept_changes). device: see WeightEma."""
    if train.ema_decay <= 0:
        return None
    ema = WeightEma(params, train.ema_decay, train.ema_start_step, device)
    if checkpoint is None:
        return ema
    path = checkpoint / EMA_FILE
    if path.is_file():
        from safetensors.torch import load_file

        ema.load(load_file(str(path)), path)
    else:
        events.emit("warning", step=step, message=f"the checkpoint {checkpoint.name} holds no EMA (the run trained "
                    f"without ema_decay until step {step}): the EMA starts from the weights of step {step}.")
    return ema


def write_state(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The EMA into a checkpoint folder (temp-then-rename)."""
    write_safetensors(folder / EMA_FILE, tensors)
