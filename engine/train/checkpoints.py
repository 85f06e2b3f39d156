"""Training checkpoints of a run: <run_dir>/checkpoints/step<N>/, the newest named by `latest`.

Every rank writes its part (DeepSpeed's rule); the plain backend writes one state file
(engine/train/plain.py); with train.ema_decay the EMA of the LoRA is written first, as
pipetrain_ema.safetensors (engine/train/ema.py). A resume loads the newest one and refuses a
checkpoint made with another backend, model or LoRA shape, and reads only tensors and plain data
(never arbitrary pickled objects). The newest KEEP_CHECKPOINTS stay on each node, and always the
one `latest` names.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import torch.distributed as tdist

from ..atomic_files import write_text
from ..patches.deepspeed import load_tensors_only
from . import elastic
from .checkpoint_space import failed_save
from .ema import write_state as write_ema

KEEP_CHECKPOINTS = 2


def tag_for(step: int) -> str:
    return f"step{step:06d}"


def save_checkpoint(engine, root: Path, tag: str, client_state: dict[str, Any], deepspeed: bool,
                    ema: dict | None = None) -> None:
    """engine.save_checkpoint, with `latest` naming the tag only once every rank has written its part.
    `ema`: the whole EMA of the LoRA (engine/train/ema.py), written first by whoever passes it (each
    node's first rank), so a checkpoint that `latest` names always holds it.

    DeepSpeed's rank 0 writes `latest` right after its own files, before the closing barrier: a
    node lost at that moment leaves `latest` naming a checkpoint without that node's stages. Here
    it is written (temp-then-rename) after DeepSpeed's barrier instead. A failed write leaves no
    partial folder, and a full disk reads as one (engine/train/checkpoint_space.py).
    """
    try:
        if ema is not None:
            write_ema(root / tag, ema)
        if not deepspeed:  # the plain trainer writes its own `latest`, and is one process
            engine.save_checkpoint(str(root), tag=tag, client_state=client_state, exclude_frozen_parameters=True)
            return
        engine.save_checkpoint(str(root), tag=tag, client_state=client_state, exclude_frozen_parameters=True,
                               save_latest=False)
        if tdist.get_rank() == 0:
            write_text(root / "latest", tag)
    except Exception as e:
        explained = failed_save(e, root, tag)
        if explained is None:
            raise
        raise explained from e


def resume(engine, root: Path, backend: str, signature: dict[str, Any], stages: int = 1,
           from_stages: Callable[[Any, Path], dict[str, Any]] | None = None) -> int:
    """Load the newest checkpoint under `root` into the engine; returns its step. `stages`: this run's
    pipeline_stages; `from_stages(engine, folder)` reads a pipelined run's checkpoint into this data-parallel
    run (elastic.load_stages), which DeepSpeed's own load cannot."""
    check_backend(root, backend)
    folder = latest_folder(root)
    if backend == "deepspeed":
        load_tensors_only(engine)  # the plain backend reads its state file weights-only itself
        elastic.check_stages(folder, stages)
    if backend == "deepspeed" and stages == 1 and elastic.saved_stages(folder):
        client = from_stages(engine, folder)
    else:
        _, client = engine.load_checkpoint(str(root), load_module_strict=False)
    if client.get("signature") != signature:
        raise ValueError(f"checkpoint in {root} was made for {client.get('signature')}, this run is "
                         f"{signature}: resume with the same model and LoRA settings, or start a new run.")
    return int(client["step"])


def latest_folder(root: Path) -> Path:
    """The checkpoint folder `latest` names."""
    return root / (root / "latest").read_text().strip()


def check_backend(root: Path, backend: str) -> None:
    """Refuse a checkpoint written by the other backend (DeepSpeed's layout vs the plain state file)."""
    from .plain import STATE_FILE

    tag = (root / "latest").read_text().strip()
    plain = (root / tag / STATE_FILE).is_file()
    if plain != (backend == "plain"):
        writer = "without DeepSpeed" if plain else "with DeepSpeed"
        raise ValueError(f"the checkpoint {root / tag} was written {writer}; this run uses backend '{backend}'. "
                         "Resume with the same backend, or start a new run.")


def step_of(folder: Path) -> int | None:
    """The step of a checkpoint folder named step<N>, else None."""
    name = folder.name
    return int(name[4:]) if name.startswith("step") and name[4:].isdigit() else None


def prune(root: Path, current: str, keep: int = KEEP_CHECKPOINTS) -> list[Path]:
    """Delete old checkpoints after `current` (the tag just written) was saved; returns what went.

    Kept: the newest `keep` checkpoints up to `current`, and always the one `latest` names (on
    another node `latest` may still name the previous one while rank 0 has not yet moved it).
    Removed: older ones, and folders of steps after `current`: what a kill or a full disk left
    half-written before the run was resumed from an earlier checkpoint.
    """
    latest = (root / "latest").read_text().strip() if (root / "latest").is_file() else ""
    now = step_of(root / current)
    folders = sorted((f for f in root.glob("step*") if f.is_dir() and step_of(f) is not None), key=step_of)
    leftovers = [f for f in folders if step_of(f) > now]
    older = [f for f in folders if step_of(f) <= now]
    doomed = [f for f in older[:-keep] + leftovers if f.name not in (latest, current)]
    for folder in doomed:
        shutil.rmtree(folder, ignore_errors=True)
    return doomed
