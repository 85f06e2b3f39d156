"""Run folders under ComfyUI's output folder (`output/pipetrain/<run>/`) and the RUN result.

A new run never reuses a folder: if the name is taken it gets a numbered suffix. Resuming
continues an existing folder that holds a checkpoint.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..engine.config import RUN_NAME_RE, ConfigError

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
    status: str  # "done" or "cancelled"

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
    """A fresh folder for run_name; run_name_2, run_name_3, ... if it is taken."""
    if not RUN_NAME_RE.match(run_name):
        raise ConfigError(f"run_name {run_name!r}: use letters, digits, '_', '-' or '.', starting with a letter "
                          "or digit (no slashes, no '..').")
    root = runs_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    candidate, n = root / run_name, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            base = re.sub(r"_\d+$", "", run_name)
            candidate = root / f"{base}_{n}"


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


def summary_text(result: RunResult) -> str:
    verb = "trained" if result.status == "done" else "stopped (cancelled) at"
    return (f"{result.run_name}: {verb} {result.steps}/{result.total_steps} steps, final loss "
            f"{result.final_loss:.4f}\nLoRA: {result.lora_path}\nrun folder: {result.run_dir}")
