"""events.jsonl: the engine's one-way report to whoever launched it (the node, or a shell user).

One JSON object per line, appended and flushed by rank 0 only. Kinds: started, step, sampling,
sample, saved, checkpoint, warning, cancelled, finish_requested (Stop & save: its step is the
run's last), done, error; memory_plan and memory_plan_check for memory
plan 'fit' (engine/train/fit_setup.py). A step carries its loss, lr and grad_norm
(the LoRA's gradient norm before clipping, engine/train/grad_norm.py); saved and done name the EMA
file too when train.ema_decay keeps one (ema_path; lora_ema, or model_ema for a full fine-tune). The reader side (`EventTail`) is used
by the node that tails a running engine; it only ever returns complete lines. `read_events` and
`history` read a whole run back (the run-dir reader nodes), `iter_events` one event at a time (the
UI's snapshot after a page reload).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


class EventLog:
    def __init__(self, run_dir: str | os.PathLike, enabled: bool = True):
        self.path = Path(run_dir) / EVENTS_FILE
        self.enabled = enabled

    def emit(self, kind: str, **fields: Any) -> None:
        if not self.enabled:
            return
        record = {"event": kind, "time": round(time.time(), 3), **fields}
        line = json.dumps(record, default=str) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()


class EventTail:
    """Incrementally reads complete lines appended to events.jsonl."""

    def __init__(self, run_dir: str | os.PathLike, start_at_end: bool = False):
        self.path = Path(run_dir) / EVENTS_FILE
        self.offset = self.path.stat().st_size if start_at_end and self.path.exists() else 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an incomplete last line waits for the next read
        events = []
        for raw in lines:
            if raw.strip():
                try:
                    events.append(json.loads(raw))
                except json.JSONDecodeError:
                    continue  # a line from a killed writer: skip it rather than fail the run
        return events


def iter_events(run_dir: str | os.PathLike, start: int = 0) -> Iterator[dict[str, Any]]:
    """The complete events of a run from byte offset `start`, one at a time (a long run's file is never
    all in memory): a reloaded page's snapshot reads it this way."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.exists():
        return
    with open(path, "rb") as f:
        f.seek(start)
        for raw in f:
            if not raw.endswith(b"\n"):
                return  # the line being written
            if raw.strip():
                try:
                    yield json.loads(raw)
                except json.JSONDecodeError:
                    continue  # a line from a killed writer


def read_events(run_dir: str | os.PathLike, start: int = 0) -> list[dict[str, Any]]:
    """Every complete event of a run, from byte offset `start` (a relaunch's first byte)."""
    tail = EventTail(run_dir)
    tail.offset = start
    return tail.read_new()


def history(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's events condensed for plots and the UI.

    steps: [[step, loss, lr, time], ...] (a resumed run's repeated steps keep the newest value);
    samples: [{"step", "path", "prompts"}, ...]; status: what the run is doing or how it ended
    (loading, training, sampling, done, cancelled, failed); reason: the error or warning text.
    """
    steps: dict[int, list] = {}
    samples: list[dict[str, Any]] = []
    out: dict[str, Any] = {"total": 0, "status": "loading", "reason": "", "warnings": []}
    for ev in events:
        kind = ev.get("event")
        if "total" in ev:
            out["total"] = int(ev["total"])
        if kind == "started":
            out["status"] = "training"
        elif kind == "step" and isinstance(ev.get("loss"), (int, float)):
            steps[int(ev["step"])] = [int(ev["step"]), float(ev["loss"]), float(ev.get("lr", 0.0)),
                                      float(ev.get("time", 0.0))]
            out["status"] = "training"
        elif kind == "sampling":
            out["status"] = "sampling"
        elif kind == "sample":
            samples.append({"step": int(ev["step"]), "path": ev.get("path", ""), "prompts": ev.get("prompts", [])})
            out["status"] = "training"
        elif kind == "warning":
            out["warnings"].append(ev.get("message", ""))
        elif kind in ("done", "cancelled"):
            out["status"] = kind
        elif kind == "error":
            out["status"], out["reason"] = "failed", ev.get("message", "")
    out["steps"] = [steps[k] for k in sorted(steps)]
    out["samples"] = samples
    return out
