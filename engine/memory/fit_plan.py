"""The fit-to-VRAM planner: measured figures + a budget -> the memory settings a run trains with.

A pure function of numbers (no torch), so its choices are tested on figures alone. The figures come
from engine/memory/fit_probe.py: weight bytes counted from the model's tensors, the activation peak
and step time measured per checkpointing mode, the host->device copy rate measured on one block.

Predicted peak of a candidate (bytes on one GPU):
    frozen weights (less fp8's saving) - the swapped blocks' weights + the two swapped blocks in flight
    + LoRA weights + optimizer state + the measured activation peak of its checkpointing mode
(block swap holds at most two swapped blocks on the GPU: docs/memory.md). Predicted s/step: the
mode's measured step (never below a cheaper mode's), slowed by fp8's casts, or the time the swapped
blocks take to copy in (forward and backward) when that is longer, the copies overlapping compute.
The planner picks the fastest candidate predicted to fit under budget * (1 - margin); of equally fast
ones the first in CHECKPOINTING order, own optimizer before 8-bit, own dtype before fp8, fewest swapped.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

from ..config.choices import CHECKPOINTING

GIB = 2**30
FP8_SLOWDOWN = 1.05  # a cast per layer per use (docs/memory.md: "a cast per layer", a few %)
EIGHT_BIT = "adamw8bit"


@dataclass(frozen=True)
class Figures:
    """What the probe found on one GPU (every rank's maximum, so every rank plans alike). Bytes, seconds."""

    weights: int  # frozen weights (parameters and buffers) on the device with nothing swapped
    block_weights: tuple[int, ...]  # frozen bytes of each block, in block order (block swap takes the last ones)
    trainable: int  # the LoRA weights, always on the device
    optimizer_state: Mapping[str, int]  # optimizer name -> its state bytes on the device for these LoRA weights
    activations: Mapping[str, int | None]  # checkpointing mode -> peak above the weights in forward+backward
    #                                        (gradients included); None: the probe step ran out of memory
    seconds: Mapping[str, float]  # checkpointing mode -> measured forward+backward seconds
    copy_bytes_per_s: float  # host -> device copy rate of one block's weights
    fp8_saving: int = 0  # bytes an fp8 base saves (block linear weights at 1 byte); 0 = not offered


@dataclass(frozen=True)
class Candidate:
    checkpointing: str
    block_swap: int
    fp8: bool
    optimizer: str
    peak: int  # predicted bytes
    seconds: float  # predicted s/step

    def label(self) -> str:
        parts = [f"checkpointing {self.checkpointing}", f"block_swap {self.block_swap}"]
        return ", ".join(parts + (["fp8 base"] if self.fp8 else []) + [f"optimizer {self.optimizer}"])


@dataclass(frozen=True)
class FitPlan:
    budget: int  # bytes per GPU
    usable: int  # budget less the margin
    chosen: Candidate | None
    tried: tuple[Candidate, ...] = ()  # per mode/optimizer/dtype: the least swap that fits, else the most
    unmeasured: tuple[str, ...] = ()  # checkpointing modes left out, and why
    message: str = ""  # the plan in one paragraph, or why nothing fits and what to change

    def to_dict(self) -> dict:
        return {"budget_gib": _gib(self.budget), "usable_gib": _gib(self.usable),
                "chosen": _candidate_dict(self.chosen) if self.chosen else None,
                "tried": [_candidate_dict(c) for c in self.tried], "unmeasured": list(self.unmeasured),
                "message": self.message}


def _gib(n: float) -> float:
    return round(n / GIB, 6)  # MiB-sized caps (CPU tests) stay readable


def _candidate_dict(c: Candidate) -> dict:
    out = asdict(c)
    out["peak_gib"] = _gib(out.pop("peak"))
    out["seconds"] = round(c.seconds, 4)
    out["label"] = c.label()
    return out


def predict(f: Figures, mode: str, swap: int, fp8: bool, optimizer: str) -> Candidate:
    """The candidate with its predicted peak and s/step (the formulas in the module docstring)."""
    blocks = f.block_weights
    scale = 1.0 - (f.fp8_saving / sum(blocks) if fp8 and sum(blocks) else 0.0)  # fp8 shrinks the blocks' linears
    swapped = list(blocks[len(blocks) - swap:]) if swap else []
    in_flight = sum(sorted(swapped, reverse=True)[:2])
    weights = f.weights - (f.fp8_saving if fp8 else 0) - scale * (sum(swapped) - in_flight)
    peak = weights + f.trainable + f.optimizer_state[optimizer] + (f.activations[mode] or 0)
    compute = _mode_seconds(f, mode) * (FP8_SLOWDOWN if fp8 else 1.0)
    copies = 2 * scale * sum(swapped) / f.copy_bytes_per_s if swapped else 0.0
    return Candidate(mode, swap, fp8, optimizer, int(peak), max(compute, copies))


def _mode_seconds(f: Figures, mode: str) -> float:
    """The mode's measured time, at least that of every cheaper mode measured: checkpointing repeats the
    forward and offloading adds copies, so a mode measured faster than one before it is timing noise."""
    cheaper = CHECKPOINTING[:CHECKPOINTING.index(mode) + 1]
    return max(f.seconds[m] for m in cheaper if m in f.seconds and f.activations.get(m) is not None)


def plan(f: Figures, budget: int, margin: float, optimizer: str) -> FitPlan:
    """The fastest candidate predicted to fit budget * (1 - margin) bytes, or a plan with chosen None and a
    message naming the smallest need. `optimizer`: the run's; adamw may become adamw8bit when its state
    bytes are in the figures."""
    usable = int(budget * (1.0 - margin))
    optimizers = [optimizer] + ([EIGHT_BIT] if optimizer == "adamw" and EIGHT_BIT in f.optimizer_state else [])
    modes = [m for m in CHECKPOINTING if m in f.activations]
    unmeasured = [f"{m}: not measured" for m in CHECKPOINTING if m not in f.activations]
    unmeasured += [f"{m}: the probe step ran out of memory" for m in modes if f.activations[m] is None]
    tried: list[Candidate] = []
    for mode in (m for m in modes if f.activations[m] is not None):
        for opt in optimizers:
            # an fp8 base without checkpointing keeps its cast copies until backward (docs/memory.md)
            for fp8 in [False] + ([True] if f.fp8_saving > 0 and mode != "off" else []):
                options = [predict(f, mode, n, fp8, opt) for n in range(len(f.block_weights) + 1)]
                fitting = [c for c in options if c.peak <= usable]
                tried.append(fitting[0] if fitting else min(options, key=lambda c: c.peak))
    fits = [c for c in tried if c.peak <= usable]
    chosen = min(fits, key=lambda c: c.seconds) if fits else None  # min keeps the first of equal times
    return FitPlan(budget, usable, chosen, tuple(tried), tuple(unmeasured),
                   _message(f, budget, margin, usable, chosen, tried))


def _message(f: Figures, budget: int, margin: float, usable: int, chosen: Candidate | None,
             tried: list[Candidate]) -> str:
    room = f"{_gib(budget)} GiB per GPU, {margin:.0%} kept free: {_gib(usable)} GiB usable"
    if chosen is not None:
        return (f"fit to VRAM ({room}): {chosen.label()}; predicted peak {_gib(chosen.peak)} GiB, "
                f"{chosen.seconds:.3f} s/step (forward + backward).")
    fix = ("train fewer or smaller buckets (a lower resolution, fewer frames or a smaller batch), split the model "
           "over more GPUs with pipeline_stages (memory plan 'manual'), or give a larger vram_gib")
    if not tried:
        return (f"nothing fits in {room}: no probe step completed (each ran out of memory); the weights alone "
                f"take {_gib(f.weights + f.trainable)} GiB. To fit: {fix}.")
    least = min(tried, key=lambda c: c.peak)
    return (f"nothing fits in {room}: the smallest need measured is {_gib(least.peak)} GiB ({least.label()}; "
            f"activations {_gib(f.activations[least.checkpointing] or 0)} GiB, weights on the GPU "
            f"{_gib(least.peak - (f.activations[least.checkpointing] or 0))} GiB). To fit: {fix}.")
