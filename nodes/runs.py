"""Run folders under ComfyUI's output folder (`output/pipetrain/<run>/`) and the RUN result.

A new run never reuses a folder: if the name is taken it gets a numbered suffix. Resuming
continues an existing folder that holds a checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..engine.config import revisions
from ..engine.config.checks import MAX_NAME_CHARS, ConfigError, check_run_name
from ..engine.config.objective import ObjectiveSpec
from ..engine.config.run import RunConfig
from ..engine.model_files import newest_model

RESUME_OFF = "off"
RESUME_LATEST = "latest"


@dataclass(frozen=True)
class RunResult:
    """PIPETRAIN_RUN: a finished (or cancelled) run, as plain data."""

    run_dir: str
    run_name: str
    lora_path: str
    steps: int
    total_steps: int
    final_loss: float
    model_name: str
    status: str  # "done" (also after Stop & save or early_stop: steps < total_steps) or "cancelled"
    ema_path: str = ""  # the EMA of lora_path's weights (train.ema_decay), "" when the run kept none
    # A Wan 2.2 experts pair (nodes/expert_pair.py): this result is the high-noise run, low_noise the low-noise one
    low_noise: "RunResult | None" = None

    def to_dict(self) -> dict:
        return asdict(self)


def runs_root(output_dir: str) -> Path:
    return Path(output_dir) / "pipetrain"


def resumable_runs(output_dir: str) -> list[str]:
    """Names of runs that have a checkpoint, newest first."""
    root = runs_root(output_dir)
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if (p / "checkpoints" / "latest").is_file()]
    runs.sort(key=lambda p: (p / "checkpoints" / "latest").stat().st_mtime, reverse=True)
    return [p.name for p in runs]


def new_run_dir(output_dir: str, run_name: str) -> Path:
    """A fresh folder for run_name; run_name_2, run_name_3, ... if it is taken (an existing run's
    files are never touched). mkdir is atomic, so two ComfyUIs sharing the output folder cannot both
    get the same folder."""
    check_run_name(run_name)
    root = runs_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    candidate, n = root / run_name, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            suffix = f"_{n}"
            candidate = root / (run_name[: MAX_NAME_CHARS - len(suffix)] + suffix)  # stays a valid run_name


def resume_run_dir(output_dir: str, resume: str) -> Path:
    runs = resumable_runs(output_dir)
    if resume == RESUME_LATEST:
        if not runs:
            raise ConfigError(f"resume is 'latest' but no run in {runs_root(output_dir)} has a checkpoint yet: "
                              "set resume to 'off' to start a new run.")
        return runs_root(output_dir) / runs[0]
    if resume not in runs:
        raise ConfigError(f"resume: run {resume!r} has no checkpoint in {runs_root(output_dir)}; pick one of "
                          f"{runs[:10] or 'none (set resume to off)'}.")
    return runs_root(output_dir) / resume


def checkpoint_step(run_dir: str | Path) -> int | None:
    """The step of a run's newest checkpoint (`checkpoints/latest` names its tag, e.g. step000120)."""
    try:
        tag = (Path(run_dir) / "checkpoints" / "latest").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    found = re.fullmatch(r"step(\d+)", tag)
    return int(found.group(1)) if found else None


def check_resume(run_dir: Path, cfg: RunConfig, keep_objective: bool = True) -> RunConfig:
    """Before a resumed run's run.json is replaced: refuse what the checkpoint cannot continue, and a change
    of settings that would make it differ from an uninterrupted run (engine/config/revisions.py). Returns
    the config to run: with the run's own objective settings unless keep_objective is off (the node's
    Objective Options input connected: cfg's are the user's)."""
    if keep_objective:
        cfg = dataclasses.replace(cfg, objective=resumed_objective(run_dir))
        cfg.validate()
    done = checkpoint_step(run_dir)
    steps = cfg.train.steps
    if done is not None and 0 < steps <= done:
        raise ConfigError(f"resume: run {run_dir.name!r} is already at step {done} and steps is {steps}, so there "
                          f"is nothing left to train: raise steps above {done} to train further (steps counts "
                          "the total), or set resume to 'off' for a new run.")
    try:
        old = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        old_model, old_lora = Path(old["model_path"]).name, old["lora"]
    except (OSError, ValueError, KeyError, TypeError):
        return cfg  # the engine compares the checkpoint's own record of model and LoRA
    changed = [f"model {old_model} -> {Path(cfg.model_path).name}"] if old_model != Path(cfg.model_path).name else []
    for key in ("rank", "targets", "target_regex"):
        if old_lora.get(key) != getattr(cfg.lora, key):
            changed.append(f"lora {key} {old_lora.get(key)!r} -> {getattr(cfg.lora, key)!r}")
    if changed:
        raise ConfigError(f"resume: run {run_dir.name!r} was trained with other settings ({'; '.join(changed)}); "
                          "its checkpoint only continues with the same model and LoRA layout. Restore them, or set "
                          "resume to 'off' for a new run.")
    revisions.check_resume(run_dir, cfg.to_dict(), before=old)  # runs of older versions kept no history
    return cfg


def resumed_objective(run_dir: Path) -> ObjectiveSpec:
    """The objective settings a run was trained with (a run from before them: guidance 0, its old behaviour)."""
    try:
        before = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = None
    values = revisions.trained_section(run_dir, "objective", before=before if isinstance(before, dict) else None)
    try:
        return ObjectiveSpec(**values)
    except TypeError as e:
        raise ConfigError(f"resume: run {run_dir.name!r} has objective settings this PipeTrain does not know "
                          f"({e}): connect a PipeTrain Objective Options node to set them.") from None


def summary_text(result: RunResult) -> str:
    verb = "stopped (cancelled) at"
    if result.status == "done":  # ended before its steps: Stop & save or early_stop (the relay adds which)
        verb = "trained" if result.steps >= result.total_steps else "ended early at"
    ema = f"\nEMA LoRA: {result.ema_path}" if result.ema_path else ""
    saved = f"LoRA: {result.lora_path}"
    if not result.lora_path:  # a full fine-tune (lora.kind full) saves the model instead (engine/model_files.py)
        saved = f"model: {newest_model(result.run_dir) or 'none saved'}"
    return (f"{result.run_name}: {verb} {result.steps}/{result.total_steps} steps, final loss "
            f"{result.final_loss:.4f}\n{saved}{ema}\nrun folder: {result.run_dir}")
