"""The fit-to-VRAM probe: the figures engine/memory/fit_plan.py plans from, found on the run's own model.

Counted from the tensors: the frozen weights on the device, each block's share (block swap), what an
fp8 base saves (block linear weights at 1 byte), the LoRA weights and each optimizer's state (bytes
per LoRA weight, engine/config/choices.py OPTIMIZER_NOTES). Measured: the peak above the weights and
the time of real forward + backward passes on the largest batch, per checkpointing mode (the
blocks wrapped for the measurement and unwrapped after, gradients dropped: the run starts untouched),
and the host -> device copy rate of the largest block. A measurement that runs out of GPU memory is
recorded as not fitting. The probe needs the model's frozen weights on the device once.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import time
from typing import Callable

import torch
from torch import nn

from .blocks import blocks
from .fit_plan import EIGHT_BIT, Figures
from .meter import PeakMeter

# Optimizer state bytes per trained weight on the device (OPTIMIZER_NOTES): adamw8bit_kahan adds 2 bytes
# of compensation for a bfloat16 LoRA, counted always; adafactor's factored moment is well under 1.
STATE_BYTES = {"adamw": 8, "adamw8bit": 2, "adamw8bit_kahan": 4, "adafactor": 1, "prodigy": 16,
               "adamw_cpu_offload": 0}
_WIDE = (torch.float32, torch.bfloat16, torch.float16)


def frozen_bytes(module: nn.Module) -> int:
    """Bytes of the module's frozen parameters and buffers, each tensor once."""
    seen, total = set(), 0
    for t in [*module.parameters(), *module.buffers()]:
        if t.requires_grad or id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def fp8_saving(all_blocks: list[nn.Module]) -> int:
    """What an fp8 base saves: the blocks' linear weights stored in 1 byte instead of their own width."""
    seen, total = set(), 0
    for block in all_blocks:
        for m in block.modules():
            w = getattr(m, "weight", None)
            if isinstance(m, nn.Linear) and w is not None and not w.requires_grad and w.dtype in _WIDE \
                    and id(w) not in seen:
                seen.add(id(w))
                total += w.numel() * (w.element_size() - 1)
    return total


def eight_bit_available(device: torch.device) -> bool:
    """bitsandbytes' 8-bit AdamW runs on CUDA only."""
    return device.type == "cuda" and importlib.util.find_spec("bitsandbytes") is not None


def budget_bytes(vram_gib: float, device: torch.device) -> int:
    """memory.vram_gib in bytes; 0: the device's memory less what other processes hold now (a CPU: its RAM)."""
    if vram_gib > 0:
        return int(vram_gib * 2**30)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        others = total - free - torch.cuda.memory_reserved(device)
        return int(total - max(0, others))
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf: no cap from the probe
        return 2**50


def measure_mode(diffusion_model: nn.Module, mode: str, run_step: Callable[[], None], trainable: list[torch.Tensor],
                 device: torch.device, repeats: int = 1) -> tuple[int | None, float]:
    """(peak bytes above the start, seconds of the last pass) of 1 + `repeats` forward + backward passes with
    the blocks checkpointed in `mode` (the first pass pays one-time costs: it counts for the peak, not the
    time); (None, 0) when the GPU ran out of memory."""
    from .activation_checkpointing import enable_checkpointing

    all_blocks = blocks(diffusion_model)
    forwards = [b.__dict__.get("forward") for b in all_blocks]  # None: the class's own forward
    meter, peak, out_of_memory = PeakMeter(device), 0, False
    try:
        if mode != "off":
            enable_checkpointing(diffusion_model, mode)
        for _ in range(1 + repeats):
            with meter.measuring():
                run_step()
            peak = max(peak, meter.peak)
            _drop_grads(trainable)
    except torch.cuda.OutOfMemoryError:
        out_of_memory = True  # handled below, once the exception (and the activations its frames hold) is gone
    finally:
        for block, forward in zip(all_blocks, forwards):
            if forward is None:
                block.__dict__.pop("forward", None)
            else:
                block.forward = forward
        _drop_grads(trainable)
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
    return (None, 0.0) if out_of_memory else (peak, meter.seconds)


def _drop_grads(trainable: list[torch.Tensor]) -> None:
    for p in trainable:
        p.grad = None


def copy_rate(nbytes: int, device: torch.device, repeats: int = 3) -> float:
    """Bytes per second of a host -> device copy of `nbytes` (at least 1 MiB; pinned, as block swap's)."""
    nbytes = max(1 << 20, nbytes)
    cuda = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        copy = host.to(device, non_blocking=True) if cuda else host.clone()
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - began)
        del copy
    return nbytes / max(best, 1e-9)


def probe(model: nn.Module, run_step: Callable[[], None], device: torch.device, optimizer: str, offer_fp8: bool,
          modes: tuple[str, ...] = ("off", "on"), repeats: int = 1) -> Figures:
    """The figures of ComfyUI's BaseModel `model` (LoRA injected, on `device`) for the planner.
    `run_step` runs one forward + backward on the largest batch."""
    dm = model.diffusion_model
    all_blocks = blocks(dm)
    trainable = [p for p in model.parameters() if p.requires_grad]
    count = sum(p.numel() for p in trainable)
    optimizers = {optimizer} | ({EIGHT_BIT} if optimizer == "adamw" and eight_bit_available(device) else set())
    measured = {m: measure_mode(dm, m, run_step, trainable, device, repeats) for m in modes}
    block_weights = tuple(frozen_bytes(b) for b in all_blocks)
    return Figures(weights=frozen_bytes(model), block_weights=block_weights,
                   trainable=sum(p.numel() * p.element_size() for p in trainable),
                   optimizer_state={o: STATE_BYTES[o] * count for o in sorted(optimizers)},
                   activations={m: v[0] for m, v in measured.items()},
                   seconds={m: v[1] for m, v in measured.items()},
                   copy_bytes_per_s=copy_rate(max(block_weights, default=0), device),
                   fp8_saving=fp8_saving(all_blocks) if offer_fp8 else 0)


def with_mode(figures: Figures, model: nn.Module, mode: str, run_step: Callable[[], None], device: torch.device,
              repeats: int = 1) -> Figures:
    """The figures with one more checkpointing mode measured (the planner asked for it)."""
    from dataclasses import replace

    trainable = [p for p in model.parameters() if p.requires_grad]
    peak, seconds = measure_mode(model.diffusion_model, mode, run_step, trainable, device, repeats)
    return replace(figures, activations={**figures.activations, mode: peak},
                   seconds={**figures.seconds, mode: seconds})
