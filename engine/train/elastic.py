"""Elastic resume: a checkpoint continues on another number of data-parallel replicas.

Nothing of a data-parallel checkpoint is per replica: DeepSpeed (no ZeRO) writes the trained weights,
the optimizer and the scheduler once, from the first replica (mp_rank_00_model_states.pt), and every
rank of the resumed run reads that file; the EMA is whole in every node's folder (engine/train/ema.py);
the sample order is a function of (seed, step) (engine/train/sample_order.py). What a new number of
replicas must keep is the global batch: engine/config/global_batch.py refuses a resume that changes it
unless accepted. This module says that the run moved, in events.jsonl and train.log.

A pipelined checkpoint is per stage: each stage's LoRA layers (layer_<i>-model_states.pt) and its own
optimizer (mp_rank_<stage>_model_states.pt). A pipelined run resumes one of as many stages (any number of
replicas: DeepSpeed's pipeline load is agnostic to them); a data-parallel run reads any, the stages'
parts put together here (load_stages); anything else is refused before a file is read (check_stages).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from ..events import EventLog


def report(events: EventLog, step: int, before: int, replicas: int, world: int) -> str:
    """The 'world_changed' event and a train.log line (rank 0): the run continues on `replicas` instead of
    `before` data-parallel replicas, on `world` ranks. Returns the line."""
    line = (f"resumed at step {step}: the run continues on {replicas} data-parallel "
            f"{'replica' if replicas == 1 else 'replicas'} instead of {before} ({world} "
            f"{'rank' if world == 1 else 'ranks'})")
    events.emit("world_changed", step=step, replicas=replicas, before=before, world_size=world, message=line)
    print(line, file=sys.stderr, flush=True)
    return line


def saved_stages(folder: Path) -> int:
    """The pipeline stages that wrote the checkpoint folder (DeepSpeed's layer_<i>-model_states.pt files and one
    mp_rank_<stage> file per stage); 0 for a data-parallel one."""
    if not any(folder.glob("layer_*-model_states.pt")):
        return 0
    return len(list(folder.glob("mp_rank_*_model_states.pt")))


def check_stages(folder: Path, stages: int) -> None:
    """Refuse a checkpoint whose pipeline layout this run cannot read: each stage's optimizer state is its own
    file, so a pipelined run resumes only a checkpoint of as many stages; a data-parallel run reads any."""
    saved = saved_stages(folder)
    if stages == 1 or saved == stages:
        return
    made = f"a {saved}-stage pipeline" if saved else "a data-parallel run (pipeline_stages 1)"
    also = f"pipeline_stages {saved} or " if saved else ""
    raise ValueError(f"the checkpoint {folder} was written by {made}; a run with pipeline_stages {stages} cannot "
                     f"continue it: resume with {also}pipeline_stages 1 (data parallel reads every checkpoint), or "
                     "start a new run.")


def load_stages(engine, folder: Path, layers: list[torch.nn.Module], optimizer_factory) -> dict[str, Any]:
    """Load a pipelined run's checkpoint into a data-parallel engine; returns its client state (step, signature).

    `layers`: the adapter's stage layers over this run's model (adapter.layers(model)), which share its
    parameters; stage <s> held the trained parameters of a run of consecutive layers, in layer order, and its
    optimizer state (mp_rank_<s>) numbers them so. The weights come from the layer files, each parameter's
    optimizer state from the stage that trained it (read through `optimizer_factory`, the optimizer of the
    run, over that stage's parameters), the schedule from stage 0. Read weights-only."""
    load = engine.checkpoint_engine.load  # weights-only since checkpoints.resume (patches/deepspeed.py)
    trained = [[p for p in layer.parameters() if p.requires_grad] for layer in layers]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            if trained[i]:
                saved = load(str(folder / f"layer_{i:02d}-model_states.pt"), map_location="cpu")
                for name, p in layer.named_parameters():
                    if p.requires_grad:
                        p.copy_(saved[f"layer.{name}"])  # the stage layer wraps it (pipeline._BoundarySafe)
    flat = [p for ps in trained for p in ps]
    stages = [load(str(f), map_location="cpu") for f in sorted(folder.glob("mp_rank_*_model_states.pt"))]
    mine, at = engine.optimizer, 0
    for state in stages:
        count = sum(len(g["params"]) for g in state["optimizer"]["param_groups"])
        stage = optimizer_factory(flat[at:at + count])
        stage.load_state_dict(state["optimizer"])  # checks the group sizes against this stage's parameters
        for group in mine.param_groups:
            held = [p for p in group["params"] if p in stage.state]
            if held:
                mine.state.update({p: stage.state[p] for p in held})
                theirs = next(g for g in stage.param_groups if any(q is held[0] for q in g["params"]))
                group.update({k: v for k, v in theirs.items() if k != "params"})
        at += count
    if at != len(flat):
        raise ValueError(f"the checkpoint {folder} holds optimizer state for {at} weights, this model's LoRA has "
                         f"{len(flat)}: resume with the model and LoRA settings it was trained with.")
    first = stages[0]
    engine.lr_scheduler.load_state_dict(first["lr_scheduler"])
    engine.global_steps, engine.global_samples = first["global_steps"], first["global_samples"]
    engine.skipped_steps = first.get("skipped_steps", 0)
    return first


def stage_reader(model, optimizer_factory):
    """checkpoints.resume's `from_stages` for a data-parallel run of `model`: load_stages over the stage layers
    of its family's pipeline adapter (engine/models)."""
    def read(engine, folder: Path) -> dict[str, Any]:
        from ..models import adapter_for

        return load_stages(engine, folder, adapter_for(model).layers(model), optimizer_factory)
    return read
