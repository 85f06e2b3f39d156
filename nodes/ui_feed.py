"""What the browser sees of a run: PromptServer messages keyed by node id, and two HTTP routes.

The TrainPipeline node's relay forwards every engine event to the browser as a `pipetrain.run`
message ({"node", "run", "type": "reset" | "event" | "samples" | "status", ...}); web/pipetrain.js
draws them on the node. A page reloaded mid-run asks GET /pipetrain/run_state?node=<id> and
gets the same messages back (the run's events re-read from events.jsonl, plus the decoded
samples), so the chart and strip come back as they were. That snapshot stays the same size however
long the run: at most SNAPSHOT_POINTS step (and eval) events, each bucket's lowest and highest loss
so spikes stay visible, the newest RECENT events whole, the last KEEP_PER_KIND of every other kind,
and the newest KEEP_SAMPLES samples (what the node's strip shows); a failed run also keeps the last
LOG_LINES lines of its train.log (each cut to LOG_LINE_CHARS), shown under the error. Every event
stays in events.jsonl and every sample in the run folder.

POST /pipetrain/finish {"node": <id>} is the node's Stop & save button: that node's running launch ends after
its current step as a finished run (nodes/relay.py finish_runs).
"""
from __future__ import annotations

import logging
import math
import threading
from collections import defaultdict, deque
from collections.abc import Iterable
from typing import Any

from ..engine.events import iter_events
from ..engine.launch.launcher import log_tail
from . import compat

log = logging.getLogger("PipeTrain")
MESSAGE = "pipetrain.run"
_KEEP_FINISHED = 8  # finished runs whose state a reloaded page can still fetch
KEEP_SAMPLES = 8  # sample steps a run's state keeps (web/pipetrain.js shows the newest 8 images)
SNAPSHOT_POINTS = 600  # step events in a snapshot: ~2 per pixel of a default-width node's chart
RECENT = 64  # newest events a snapshot keeps whole: the status and the ETA's window (50 steps)
KEEP_PER_KIND = 16  # of every other kind (sampling, sample, saved, checkpoint, warning ...), the newest
LOG_LINES = 12  # of a failed run's train.log, in the status message and the snapshot
LOG_LINE_CHARS = 300
_SERIES = ("step", "eval")  # downsampled, not cut: the chart draws all of them

_lock = threading.Lock()
_runs: dict[str, dict[str, Any]] = {}  # node id -> run state (see RunFeed)


def _lean(event: dict) -> dict:
    """An event without its traceback (the node error carries that), for the browser, with a non-finite
    loss as null: a NaN step would make the whole message or snapshot invalid JSON for the page."""
    return {k: _finite(v) for k, v in event.items() if k != "traceback"}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class RunFeed:
    """One launch of a run, as the browser sees it."""

    def __init__(self, node_id: str | None, run_name: str, run_dir: str, total: int, events_start: int):
        self.node = str(node_id) if node_id is not None else ""
        self.state = {"node": self.node, "run": run_name, "run_dir": run_dir, "total": total,
                      "events_start": events_start, "samples": [], "status": "loading", "reason": "", "log": []}
        if self.node:
            with _lock:
                _runs.pop(self.node, None)
                _runs[self.node] = self.state
                for old in [k for k, v in _runs.items() if v["status"] in ("done", "cancelled", "failed")][:-_KEEP_FINISHED]:
                    _runs.pop(old, None)
        self.send("reset", total=total, status="loading")

    def send(self, kind: str, **fields: Any) -> None:
        server = compat.prompt_server()
        if server is None or not self.node:
            return
        try:
            server.send_sync(MESSAGE, {"node": self.node, "run": self.state["run"], "type": kind, **fields})
        except Exception as e:  # noqa: BLE001 - a display problem must never stop training
            log.debug("PipeTrain: could not send a UI message: %s", e)

    def event(self, event: dict) -> None:
        self.send("event", event=_lean(event))

    def samples(self, step: int, images: list[dict], prompts: list[str]) -> None:
        entry = {"step": step, "images": images, "prompts": prompts}
        self.state["samples"] = (self.state["samples"] + [entry])[-KEEP_SAMPLES:]  # all stay in samples/
        self.send("samples", **entry)

    def status(self, status: str, reason: str = "") -> None:
        log_lines = last_log_lines(self.state["run_dir"]) if status == "failed" else []
        self.state.update(status=status, reason=reason, log=log_lines)
        self.send("status", status=status, reason=reason, log=log_lines)


def last_log_lines(run_dir: str) -> list[str]:
    """The end of a run's train.log, bounded (LOG_LINES lines of at most LOG_LINE_CHARS characters)."""
    try:
        text = log_tail(run_dir, LOG_LINES)
    except OSError:
        return []
    return [line if len(line) <= LOG_LINE_CHARS else line[:LOG_LINE_CHARS - 1] + "…" for line in text.splitlines()]


def run_state(node_id: str) -> dict | None:
    """Everything a freshly loaded page needs to redraw the node's run, or None."""
    with _lock:
        state = dict(_runs.get(str(node_id)) or {})
    if not state:
        return None
    events = [_lean(e) for e in condense(iter_events(state["run_dir"], state["events_start"]))]
    return {"node": state["node"], "run": state["run"], "total": state["total"], "status": state["status"],
            "reason": state["reason"], "log": list(state.get("log", [])), "events": events,
            "samples": list(state["samples"])}


def condense(events: Iterable[dict]) -> list[dict]:
    """The events a reloaded page replays, in their order, bounded however many steps and samples the run
    has had (see the module's docstring); one pass, so a long run's events.jsonl is never all in memory.
    The page's reducer (web/chart.js) draws the same chart and status from them."""
    recent: deque = deque(maxlen=RECENT)
    series = {kind: _Spread(SNAPSHOT_POINTS) for kind in _SERIES}
    others: dict[str, deque] = defaultdict(lambda: deque(maxlen=KEEP_PER_KIND))
    for order, ev in enumerate(events):
        if len(recent) == RECENT:  # the oldest of the recent ones leaves them
            old = recent[0]
            kind = str(old[1].get("event"))
            if kind in series:
                series[kind].add(*old)
            else:
                others[kind].append(old)
        recent.append((order, ev))
    kept = [p for spread in series.values() for p in spread.points()] + [p for d in others.values() for p in d]
    return [ev for _, ev in sorted(kept, key=lambda p: p[0])] + [ev for _, ev in recent]


class _Spread:
    """A series downsampled in one pass to about `limit` points (at least half of that once it has more):
    its first point, and buckets of `width` neighbours that keep their lowest and highest loss; when the
    buckets are full, neighbouring buckets merge and the width doubles."""

    def __init__(self, limit: int):
        self.most = max(1, limit // 2)  # buckets
        self.width = 2
        self.buckets: list[list] = []  # [lowest, highest, count]; lowest/highest: (loss, order, event)
        self.first: tuple | None = None  # where the line starts

    def add(self, order: int, event: dict) -> None:
        value = event.get("loss")
        item = (float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0, order, event)
        self.first = self.first or item
        last = self.buckets[-1] if self.buckets else None
        if last is not None and last[2] < self.width:
            last[0], last[1], last[2] = min(last[0], item, key=_rank), max(last[1], item, key=_rank), last[2] + 1
        elif len(self.buckets) < self.most:
            self.buckets.append([item, item, 1])
        else:
            pairs = [self.buckets[i:i + 2] for i in range(0, len(self.buckets), 2)]
            self.buckets = [[min((b[0] for b in p), key=_rank), max((b[1] for b in p), key=_rank),
                             sum(b[2] for b in p)] for p in pairs]
            self.width *= 2
            self.add(order, event)

    def points(self) -> list[tuple[int, dict]]:
        """(order, event) of the first one and of each bucket's lowest and highest loss."""
        items = {item[1]: item[2] for lo, hi, _ in self.buckets for item in (lo, hi)}
        if self.first is not None:
            items[self.first[1]] = self.first[2]
        return list(items.items())


def _rank(item: tuple) -> tuple[float, int]:
    """Loss, then order: of equal losses the lowest is the earliest, the highest the latest (both stay)."""
    return item[0], item[1]


def register_routes() -> None:
    server = compat.prompt_server()
    if server is None or getattr(server, "_pipetrain_routes", False):
        return
    from aiohttp import web

    @server.routes.get("/pipetrain/run_state")
    async def _run_state(request):
        node = request.rel_url.query.get("node", "")
        state = run_state(node) if node else None
        if state is None:
            return web.json_response({"error": f"no PipeTrain run for node {node!r} since this ComfyUI started"},
                                     status=404)
        return web.json_response(state)

    @server.routes.post("/pipetrain/finish")
    async def _finish(request):
        # Stop & save: {"node": "<id>"} ends that node's running launch after its current step, as a finished run.
        # Only the node id is read: the run folder is the one this ComfyUI launched for it.
        from .relay import finish_runs  # the relay imports this module

        try:
            body = await request.json()
        except ValueError:
            body = None
        node = str(body.get("node", "")) if isinstance(body, dict) else ""
        names = finish_runs(node) if node else []
        if not names:
            return web.json_response({"error": f"Stop & save: node {node!r} has no PipeTrain run training now "
                                               "(it ended, or has not started yet)"}, status=404)
        return web.json_response({"ok": True, "run": ", ".join(names)})

    server._pipetrain_routes = True
