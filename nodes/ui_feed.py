"""What the browser sees of a run: PromptServer messages keyed by node id, and one HTTP route.

The TrainPipeline node's relay forwards every engine event to the browser as a `pipetrain.run`
message ({"node", "run", "type": "reset" | "event" | "samples" | "status", ...}); web/pipetrain.js
draws them on the node. A page reloaded mid-run asks GET /pipetrain/run_state?node=<id> and
gets the same messages back (the run's events re-read from events.jsonl, plus the decoded
samples), so the chart and strip come back as they were.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from ..engine.events import read_events
from . import compat

log = logging.getLogger("PipeTrain")
MESSAGE = "pipetrain.run"
_KEEP_FINISHED = 8  # finished runs whose state a reloaded page can still fetch

_lock = threading.Lock()
_runs: dict[str, dict[str, Any]] = {}  # node id -> run state (see RunFeed)


def _lean(event: dict) -> dict:
    """An event without its traceback (the node error carries that), for the browser."""
    return {k: v for k, v in event.items() if k != "traceback"}


class RunFeed:
    """One launch of a run, as the browser sees it."""

    def __init__(self, node_id: str | None, run_name: str, run_dir: str, total: int, events_start: int):
        self.node = str(node_id) if node_id is not None else ""
        self.state = {"node": self.node, "run": run_name, "run_dir": run_dir, "total": total,
                      "events_start": events_start, "samples": [], "status": "loading", "reason": ""}
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
        self.state["samples"].append(entry)
        self.send("samples", **entry)

    def status(self, status: str, reason: str = "") -> None:
        self.state.update(status=status, reason=reason)
        self.send("status", status=status, reason=reason)


def run_state(node_id: str) -> dict | None:
    """Everything a freshly loaded page needs to redraw the node's run, or None."""
    with _lock:
        state = dict(_runs.get(str(node_id)) or {})
    if not state:
        return None
    events = [_lean(e) for e in read_events(state["run_dir"], state["events_start"])]
    return {"node": state["node"], "run": state["run"], "total": state["total"], "status": state["status"],
            "reason": state["reason"], "events": events, "samples": list(state["samples"])}


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

    server._pipetrain_routes = True
