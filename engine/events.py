"""events.jsonl: the engine's one-way report to whoever launched it (the node, or a shell user).

One JSON object per line, appended and flushed by rank 0 only. Kinds: started, step, saved,
checkpoint, cancelled, done, error. The reader side (`EventTail`) is used by the node that
tails a running engine; it only ever returns complete lines.
"""
from __future__ import annotations

import json
import os
import time
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
