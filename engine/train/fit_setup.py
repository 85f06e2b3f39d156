"""memory.plan 'fit' in the train loop: probe the model, plan, agree over the ranks, save and report the
plan; then measure the first step against it.

The plan is a 'memory_plan' event and <run_dir>/memory_plan.json (figures included). A resumed run reuses
the saved plan: its fp8 base and optimizer are part of what the checkpoint trained. Nothing fitting stops
the run before step 1 (NothingFits, the planner's message: the budget, the smallest need, what to change).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
from pathlib import Path

import torch

from ..atomic_files import write_text
from ..config.run import RunConfig
from ..config.sections import MemorySpec
from ..events import EventLog
from ..memory import fit_plan, fit_probe
from ..models.gguf_file import is_gguf
from ..memory.meter import PeakMeter, device_bytes
from ..memory.options import unswappable_weight
from . import distributed as dist

PLAN_FILE = "memory_plan.json"
FP8_BASE = "float8_e4m3fn"  # the fp8 format the plan picks: more precision than e5m2 (docs/memory.md)


class NothingFits(RuntimeError):
    """No candidate fits memory.vram_gib: the message names the budget, the smallest need and the fixes."""


@contextlib.contextmanager
def whole_model_load(cfg: RunConfig, device: torch.device):
    """Around the first model load of a 'fit' run: the probe needs the whole model on the GPU once, so a GPU
    smaller than its weights runs out of memory there. That becomes NothingFits with what to do instead."""
    if cfg.memory.plan != "fit":
        yield
        return
    try:
        yield
    except torch.cuda.OutOfMemoryError:
        free = torch.cuda.mem_get_info(device)[0] / fit_plan.GIB if device.type == "cuda" else 0.0
        raise NothingFits(
            f"memory plan 'fit' probes the whole model on the GPU once, and {Path(cfg.model_path).name} did not fit "
            f"there ({free:.1f} GiB free after the attempt): set plan to 'manual' and choose the memory options "
            "yourself (a model larger than the GPU needs block_swap, with activation_checkpointing on or "
            "cpu_offload; an fp8 base_dtype halves a bf16 model; docs/memory.md), or use a GPU with more "
            "memory.") from None


def fit_memory(cfg: RunConfig, model: torch.nn.Module, dataset, device: torch.device, events: EventLog,
               resuming: bool) -> tuple[MemorySpec, dict]:
    """(the memory settings the run trains with: cfg.memory with the plan's choices, the plan's record)."""
    path = Path(cfg.run_dir) / PLAN_FILE
    saved = _saved_plan(path) if resuming else None
    # every node keeps its own copy (no shared filesystem needed); a node without one makes all probe anew
    if resuming and not dist.any_true(saved is None, device):
        events.emit("memory_plan", reused=True, **saved)
        return chosen_spec(cfg.memory, saved["chosen"]), saved
    from .objective import DiffusionObjective

    model.to(device)  # the probe measures the whole model on the device (a manual block_swap loads it on the CPU)
    t = cfg.train
    objective = DiffusionObjective(model, seed=t.seed, timestep_sampling=t.timestep_sampling,
                                   t_range=(t.min_t, t.max_t), objective=cfg.objective)
    latents, conds = largest_batch(dataset, t.batch_size, device)

    def run_step() -> None:
        objective(latents, conds, list(range(len(conds)))).backward()

    result, figures = plan_from_probe(model, run_step, device, cfg.memory, offer_fp8(cfg, model))
    record = {**result.to_dict(), "figures": figures_record(figures)}
    if dist.local_rank() == 0:  # the same record on every node: the figures were agreed
        write_text(path, json.dumps(record, indent=1))
    events.emit("memory_plan", reused=False, **record)
    if result.chosen is None:
        raise NothingFits(result.message)
    return chosen_spec(cfg.memory, record["chosen"]), record


def _saved_plan(path: Path) -> dict | None:
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and saved.get("chosen") else None


def plan_from_probe(model: torch.nn.Module, run_step, device: torch.device, memory: MemorySpec,
                    fp8: bool) -> tuple[fit_plan.FitPlan, fit_plan.Figures]:
    """Probe (engine/memory/fit_probe.py), agree over the ranks, plan; on a GPU also measure cpu_offload when
    the plan needs block swap or nothing fits (offloaded block inputs may fit with less swapping).
    `run_step`: one forward + backward on the largest batch. benchmarks/fit_plan.py calls this too."""
    repeats = 2 if device.type == "cuda" else 1  # timed passes per mode, after one that warms up
    figures = agree(fit_probe.probe(model, run_step, device, memory.optimizer, fp8, repeats=repeats), device)
    if unswappable_weight(model.diffusion_model) is not None:  # a quantized file: no block swap candidates
        figures = dataclasses.replace(figures, block_weights=())
    budget = -int(dist_max([-fit_probe.budget_bytes(memory.vram_gib, device)], device)[0])  # the smallest GPU's
    result = fit_plan.plan(figures, budget, memory.vram_margin, memory.optimizer)
    if device.type == "cuda" and (result.chosen is None or result.chosen.block_swap):
        figures = agree(fit_probe.with_mode(figures, model, "cpu_offload", run_step, device, repeats), device)
        result = fit_plan.plan(figures, budget, memory.vram_margin, memory.optimizer)
    return result, figures


def release_memory(device: torch.device) -> None:
    """Free what a dropped model held (reference cycles included) before the next one loads."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def chosen_spec(spec: MemorySpec, chosen: dict) -> MemorySpec:
    out = dataclasses.replace(spec, activation_checkpointing=chosen["checkpointing"],
                              block_swap=int(chosen["block_swap"]), optimizer=chosen["optimizer"],
                              base_dtype=FP8_BASE if chosen["fp8"] else spec.base_dtype)
    out.validate()
    return out


def offer_fp8(cfg: RunConfig, model: torch.nn.Module) -> bool:
    """An fp8 base only where the user left the precision to PipeTrain, a LoRA trains (a full fine-tune trains
    the block weights), no base LoRA is merged and the file is not quantized already."""
    from ..models.loading import is_quantized_file

    return (cfg.memory.base_dtype in ("auto", "bfloat16", "float16") and cfg.lora.kind != "full"
            and not cfg.base_loras and not is_quantized_file(model) and not is_gguf(cfg.model_path))



def largest_batch(dataset, batch_size: int, device: torch.device):
    """(latents, conds) of batch_size copies of the first item with the cache's largest latent."""
    from .sample_order import batch_items

    keys = dataset.buckets()
    index = max(range(len(keys)), key=lambda i: _latent_elements(keys[i])) if keys else 0
    return batch_items([dataset[index]] * batch_size, device)


def _latent_elements(bucket: str) -> int:
    """Elements of the latent shape in a bucket key ("cross_attn=1x77x64 latent=16x1x8x8")."""
    for part in bucket.split():
        name, _, dims = part.partition("=")
        if name == "latent" and dims:
            return math.prod(int(d) for d in dims.split("x") if d.isdigit())
    return 0


def dist_max(values: list[float], device: torch.device) -> list[float]:
    """Each value's maximum over the ranks (every rank plans from the same, worst, figures)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return t.tolist()


def agree(f: fit_plan.Figures, device: torch.device) -> fit_plan.Figures:
    """The figures with every number at its maximum over the ranks (copy rate: its minimum); a mode that ran
    out of memory on any rank counts as out of memory."""
    modes, optimizers = sorted(f.activations), sorted(f.optimizer_state)
    flat = [f.weights, f.trainable, f.fp8_saving, -f.copy_bytes_per_s, *f.block_weights,
            *(f.optimizer_state[o] for o in optimizers),
            *(math.inf if f.activations[m] is None else f.activations[m] for m in modes),
            *(f.seconds[m] for m in modes)]
    out = dist_max([float(v) for v in flat], device)
    n = len(f.block_weights)
    blocks, rest = out[4:4 + n], out[4 + n:]
    states, acts, secs = rest[:len(optimizers)], rest[len(optimizers):len(optimizers) + len(modes)], rest[-len(modes):]
    return fit_plan.Figures(
        weights=int(out[0]), trainable=int(out[1]), fp8_saving=int(out[2]), copy_bytes_per_s=-out[3],
        block_weights=tuple(int(b) for b in blocks), optimizer_state=dict(zip(optimizers, map(int, states))),
        activations={m: None if math.isinf(a) else int(a) for m, a in zip(modes, acts)},
        seconds=dict(zip(modes, secs)))


def figures_record(f: fit_plan.Figures) -> dict:
    gib = fit_plan.GIB
    return {"weights_gib": round(f.weights / gib, 6), "trainable_gib": round(f.trainable / gib, 6),
            "blocks": len(f.block_weights), "largest_block_gib": round(max(f.block_weights, default=0) / gib, 6),
            "fp8_saving_gib": round(f.fp8_saving / gib, 6),
            "optimizer_state_gib": {o: round(b / gib, 6) for o, b in f.optimizer_state.items()},
            "activation_gib": {m: None if a is None else round(a / gib, 6) for m, a in f.activations.items()},
            "seconds": {m: round(s, 4) for m, s in f.seconds.items()},
            "copy_gib_per_s": round(f.copy_bytes_per_s / gib, 3)}


class FirstStepCheck:
    """The first step of a fit run measured (the plan confirmed on the real step): a 'memory_plan_check'
    event with the measured and predicted peak, and a warning when it passes the budget."""

    def __init__(self, model: torch.nn.Module, applied, device: torch.device, record: dict):
        self.model, self.applied, self.device = model, applied, device  # applied: memory.options.MemoryPlan
        self.predicted_gib, self.budget_gib = record["chosen"]["peak_gib"], record["budget_gib"]
        self.meter = PeakMeter(device)
        self.before = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            self.before = torch.cuda.memory_allocated(self.device)
        else:  # the model's tensors on the device, less block swap's host copies
            swapper = self.applied.swapper
            hosts = tuple(slot.host for slot in swapper.slots.values()) if swapper is not None else ()
            self.before = device_bytes(self.model, self.device, exclude=hosts)
        self.meter.start()

    def finish(self, events: EventLog, step: int) -> None:
        self.meter.stop()
        measured = (self.before + self.meter.peak) / fit_plan.GIB
        events.emit("memory_plan_check", step=step, measured_peak_gib=round(measured, 6),
                    predicted_peak_gib=self.predicted_gib, budget_gib=self.budget_gib,
                    seconds=round(self.meter.seconds, 4))
        if measured > self.budget_gib:
            events.emit("warning", step=step, message=(
                f"memory plan 'fit': the first step peaked at {measured:.2f} GiB, over the {self.budget_gib:.2f} GiB "
                f"budget (predicted {self.predicted_gib:.2f} GiB): raise vram_margin so the plan keeps more free."))
