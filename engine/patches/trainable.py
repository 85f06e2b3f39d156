"""make_trainable: the engine's one call that makes a loaded ComfyUI model safe to train.

In every training process, after the model is loaded and BEFORE LoRA injection, checkpointing,
block swap or compile wrap its blocks:
1. set the host's training flag (engine/patches/host.py);
2. for each block class of the model, take its verdict from the cache, or probe it
   (engine/patches/probe.py) with upstream's forward: safe -> use it as it is;
3. for an unsafe class, try PipeTrain's out-of-place forwards written for this ComfyUI version
   (engine/patches/fixes.py), admitting one only when the probe sees upstream's own output and
   correct gradients with it; then probe every class once more with the chosen fixes installed;
4. refuse, before any training step, naming the block class, the ComfyUI version and what to do,
   when neither upstream nor a fix is safe;
5. add the first-call guard (engine/patches/guard.py) as a last net.
"""
from __future__ import annotations

import logging
import os

import torch
from torch import nn

from . import fixes as fix_registry
from .fixes import Fix
from .guard import guard_blocks
from .host import comfy_version, set_training_mode
from .probe import Captured, capture, on_device, probe, reference_output
from .verdicts import VerdictStore, verdict_key

log = logging.getLogger("pipetrain.patches")


class UnsafeBlock(RuntimeError):
    """A block class trains wrongly with ComfyUI's forward and PipeTrain has no admitted fix for it."""


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def first_blocks(diffusion_model: nn.Module) -> dict[type, nn.Module]:
    """The first block of each block class, in model order (engine/memory/blocks.py finds the blocks)."""
    from ..memory.blocks import blocks

    out: dict[type, nn.Module] = {}
    for block in blocks(diffusion_model):
        out.setdefault(type(block), block)
    return out


def _refuse_wrapped(diffusion_model: nn.Module) -> None:
    from ..memory.blocks import blocks

    wrapped = [i for i, b in enumerate(blocks(diffusion_model)) if "forward" in vars(b)]
    if wrapped:
        raise RuntimeError(f"{len(wrapped)} blocks (first: block {wrapped[0]}) already have a wrapped forward "
                           "(activation checkpointing, block swap or compile); call "
                           "engine.patches.make_trainable before wrapping them, or a class fix never reaches them.")


def _refusal(cls: type, version: str, reason: str, tried: list[str]) -> str:
    known = fix_registry.fixes_for(cls)
    text = f"{_name(cls)} cannot be trained on ComfyUI {version}: {reason}."
    if tried:
        text += " " + " ".join(tried)
    elif known:
        ranges = "; ".join(f"'{f.name}' for {f.range_text()}" for f in known)
        text += f" PipeTrain's out-of-place forwards for it were written for other ComfyUI releases ({ranges})."
    else:
        text += " PipeTrain has no out-of-place forward for this block class."
    return text + (" What to do: train this model on a ComfyUI release PipeTrain supports for it "
                   "(docs/comfyui-versions.md), or update PipeTrain; if another custom node changed this block, "
                   "disable that node for training.")


def _decide(captured: dict[type, Captured], version: str) -> dict[type, dict]:
    """Verdicts for the captured classes, measured with nothing of ours installed at the start."""
    references = {cls: reference_output(cap) for cls, cap in captured.items()}
    upstream = {cls: probe(cap) for cls, cap in captured.items()}  # every class before any fix goes in
    chosen: dict[type, list[Fix]] = {}
    refused: dict[type, str] = {}
    for cls, cap in captured.items():
        if upstream[cls].safe or cls in chosen:
            continue
        # Fixes add up (an in-place block that also calls a fused op without backward needs two):
        # each stays in while the next is tried; none stays when the class is still unsafe.
        tried, added = [], []
        for fix in [f for f in fix_registry.fixes_for(cls) if f.written_for(version)]:
            if fix not in fix_registry.active():
                fix_registry.install(fix)
                added.append(fix)
            outcome = probe(cap, references[cls])
            if outcome.safe:
                for f in added:
                    for c in captured:
                        if f.covers(c):
                            chosen.setdefault(c, []).append(f)
                break
            tried.append(f"PipeTrain's out-of-place forward '{fix.name}' ({fix.range_text()}) does not fit: "
                         f"{outcome.reason}.")
        else:
            for f in added:
                fix_registry.uninstall(f)
            refused[cls] = _refusal(cls, version, upstream[cls].reason, tried)
    # The chosen fixes together: every class must still give upstream's output and train correctly.
    if chosen:
        names = ", ".join(sorted({f.name for fs in chosen.values() for f in fs}))
        for cls, cap in captured.items():
            outcome = probe(cap, references[cls]) if cls not in refused else None
            if outcome is not None and not outcome.safe:
                refused[cls] = _refusal(cls, version, f"with PipeTrain's out-of-place forwards ({names}) installed, "
                                        f"{outcome.reason}", [])
    verdicts = {}
    for cls in captured:
        if cls in refused:
            verdicts[cls] = {"use": None, "reason": refused[cls]}
        elif cls in chosen:
            why = upstream[cls].reason or "its module's functions are replaced for another block class"
            verdicts[cls] = {"use": [f.name for f in chosen[cls]], "reason": f"ComfyUI's forward: {why}"}
        else:
            verdicts[cls] = {"use": "upstream", "reason": "ComfyUI's forward passed the probe"}
    return verdicts


def make_trainable(diffusion_model: nn.Module, run_forward, *, cache_file: str | os.PathLike | None = None,
                   device: torch.device | None = None, context: str = "") -> dict[str, str]:
    """Make `diffusion_model` (ComfyUI's, freshly loaded, nothing wrapped) safe to train.

    run_forward: runs one forward of the whole model on a small input (the probe captures the
    blocks' inputs from it). device: where to run that forward when the weights are still on the
    CPU (block swap, pipeline stages). cache_file: where verdicts are kept between runs.
    context: what about the call decides code paths beyond the block itself (conditioning kinds).
    Returns {block class: "upstream" or the fixes' names joined by " + "}. Raises UnsafeBlock.
    """
    from ..memory.blocks import blocks

    set_training_mode(True)
    _refuse_wrapped(diffusion_model)
    version = comfy_version()
    firsts = first_blocks(diffusion_model)
    where = device if device is not None else next((p.device for p in diffusion_model.parameters()), "cpu")
    keys = {cls: verdict_key(cls, block, version, where, context) for cls, block in firsts.items()}
    store = VerdictStore(cache_file)
    known = {cls: store.get(keys[cls]) for cls in firsts}
    by_name = {f.name: f for f in fix_registry.all_fixes()}
    known = {cls: v for cls, v in known.items()
             if v and (v["use"] in (None, "upstream") or all(name in by_name for name in v["use"]))}
    todo = {cls: block for cls, block in firsts.items() if cls not in known}
    verdicts = dict(known)
    # Fixes other models of this process were given stay in: each is proven to give upstream's output.
    before = fix_registry.active()
    if todo:
        fix_registry.uninstall_all()  # measure upstream's own forwards
        # The probe seeds its own draws; the caller's random state (LoRA init, noise) stays as it was,
        # so a run draws the same numbers whether its verdicts came from the probe or the cache.
        cuda = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
        try:
            with torch.random.fork_rng(devices=cuda), \
                    on_device(diffusion_model, blocks(diffusion_model), device, keep=list(todo.values())):
                captured = capture(run_forward, todo)
                measured = _decide(captured, version)
        except BaseException:
            fix_registry.uninstall_all()
            for fix in before:
                fix_registry.install(fix)
            raise
        for cls, verdict in measured.items():
            store.put(keys[cls], verdict)
            verdicts[cls] = verdict
        store.save()
        for cls in set(todo) - set(captured):  # never called by this forward: nothing to decide on
            verdicts[cls] = {"use": "upstream", "reason": "not called by the probe's forward"}
    fix_registry.uninstall_all()
    for fix in before:
        fix_registry.install(fix)
    refused = [v["reason"] for v in verdicts.values() if v["use"] is None]
    if refused:
        raise UnsafeBlock("\n".join(refused))
    for verdict in verdicts.values():
        if verdict["use"] != "upstream":
            for name in verdict["use"]:
                fix_registry.install(by_name[name])
    guard_blocks(diffusion_model)
    result = {_name(cls): v["use"] if v["use"] == "upstream" else " + ".join(v["use"]) for cls, v in verdicts.items()}
    diffusion_model._pipetrain_forwards = result  # is_trainable() reads it
    log.info("PipeTrain block forwards on ComfyUI %s: %s", version, result)
    return result


def is_trainable(diffusion_model: nn.Module) -> bool:
    """Whether make_trainable ran on this model (and no fix it relies on was taken out since)."""
    chosen = getattr(diffusion_model, "_pipetrain_forwards", None)
    if chosen is None:
        return False
    active = {f.name for f in fix_registry.active()}
    return all(use == "upstream" or set(use.split(" + ")) <= active for use in chosen.values())


def stale_blocks(diffusion_model: nn.Module) -> list[str]:
    """Modules whose instance-level forward (a wrapper made before make_trainable) still calls an
    upstream function that an installed fix replaced: the class fix never reaches them."""
    originals = fix_registry.upstream_functions()

    def underlying(fn):
        while hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        return getattr(fn, "__func__", fn)
    return [name for name, module in diffusion_model.named_modules()
            if "forward" in vars(module) and underlying(vars(module)["forward"]) in originals]
