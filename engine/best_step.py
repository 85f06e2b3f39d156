"""The eval history of a run and its best saved step: which LoRA file had the lowest held-out eval loss.

After every eval the loop records (step, eval loss, the LoRA file saved at that step or None). The
best saved step is the lowest eval loss among evals whose step has a saved file: an eval at a step
with no save is kept in the history (it counts for early stopping) but can never be "best", because
there is no file to hand out. Evals line up with saves when eval_every divides save_every (or
equals it); the last step always has the final file.

Early stop: an eval "improves" when its loss is below every earlier eval's loss (saved or not).
After `early_stop` evals in a row without improvement the run ends normally (final file saved).

The history lives in <run>/best.json (written temp-then-rename), read back on resume, and cut
to the steps at or before the resumed step. Pure data here: no torch.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from .atomic_files import write_text

FILE = "best.json"


def record(history: list[dict], step: int, loss: float, file: str | None) -> list[dict]:
    """The history with this eval added (an earlier entry of the same step is replaced)."""
    kept = [e for e in history if e["step"] != step]
    return sorted(kept + [{"step": int(step), "eval_loss": float(loss), "file": file}], key=lambda e: e["step"])


def attach_file(history: list[dict], step: int, file: str) -> list[dict]:
    """The history with `file` recorded as the LoRA saved at `step` (e.g. the final file of an early stop)."""
    return [{**e, "file": file} if e["step"] == step else e for e in history]


def best(history: list[dict]) -> dict | None:
    """The entry with the lowest eval loss among those with a saved file (the earliest on a tie)."""
    saved = [e for e in history if e.get("file") and math.isfinite(e["eval_loss"])]
    return min(saved, key=lambda e: (e["eval_loss"], e["step"])) if saved else None


def evals_without_improvement(history: list[dict]) -> int:
    """How many evals in a row, up to the last, did not beat every eval before them."""
    lowest, stale = math.inf, 0
    for e in history:
        if e["eval_loss"] < lowest:
            lowest, stale = e["eval_loss"], 0
        else:
            stale += 1
    return stale


def should_stop(history: list[dict], early_stop: int) -> bool:
    return early_stop > 0 and evals_without_improvement(history) >= early_stop


def stop_message(step: int, early_stop: int, history: list[dict]) -> str:
    b = best(history)
    where = f"best step {b['step']}" if b else "no saved step had an eval"
    return f"stopped early at step {step}: no eval improvement in {early_stop} evals, {where}"


def summary(history: list[dict]) -> dict:
    """best.json's content: the best saved step (step, eval_loss, file; null without one) and the history."""
    b = best(history)
    return {**({"step": b["step"], "eval_loss": b["eval_loss"], "file": b["file"]} if b else
               {"step": None, "eval_loss": None, "file": None}), "history": history}


def write(run_dir: Path, history: list[dict]) -> dict:
    content = summary(history)
    write_text(Path(run_dir) / FILE, json.dumps(content, indent=1) + "\n")
    return content


def read(run_dir: Path, up_to_step: int | None = None) -> list[dict]:
    """The recorded history (empty without best.json), without evals after `up_to_step` (a resume from an
    earlier checkpoint redoes those steps)."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return []
    try:
        history = json.loads(path.read_text(encoding="utf-8")).get("history", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [e for e in history if up_to_step is None or e["step"] <= up_to_step]
