"""What a reloaded page fetches of a long run (GET /pipetrain/run_state, nodes/ui_feed.py) stays the same
size however many steps and samples the run has had, and still draws the same chart and status."""
from __future__ import annotations

import json
import tracemalloc

from PipeTrain.nodes import ui_feed

STEPS = 20_000
SPIKE = 12_345


def _write_long_run(run_dir, steps: int = STEPS) -> int:
    """events.jsonl of a run with a sample every 5 steps, an eval every 100, one warning per sample
    (a VAE that cannot decode them: each message names its step) and a loss spike; returns its size."""
    lines = [{"event": "started", "time": 1.0, "step": 0, "total": steps}]
    for s in range(1, steps + 1):
        loss = 9.0 if s == SPIKE else 0.1 + (s % 97) / 1000
        lines.append({"event": "step", "time": 1e9 + s / 10, "step": s, "total": steps, "loss": loss, "lr": 1e-4,
                      "seconds": 0.09})
        if s % 5 == 0:
            lines += [{"event": "sampling", "step": s, "prompts": 2},
                      {"event": "sample", "step": s, "path": f"/out/samples/step{s:06d}.safetensors",
                       "prompts": ["a red circle on a blue background", "a green square"], "seconds": 0.3},
                      {"event": "warning", "step": s, "message": f"could not decode the samples of step {s}"}]
        if s % 100 == 0:
            lines.append({"event": "eval", "step": s, "loss": 0.2, "losses": [0.1, 0.2, 0.2, 0.3, 0.2]})
    lines.append({"event": "done", "step": steps, "total": steps, "loss": 0.1, "traceback": "x" * 1000})
    text = "".join(json.dumps(e) + "\n" for e in lines)
    (run_dir / "events.jsonl").write_text(text, encoding="utf-8")
    return len(text)


def _feed(run_dir, node: str = "77") -> ui_feed.RunFeed:
    return ui_feed.RunFeed(node, "long", str(run_dir), STEPS, 0)  # no PromptServer here: nothing is sent


def test_a_long_runs_snapshot_is_bounded_and_keeps_what_the_chart_and_status_need(tmp_path):
    written = _write_long_run(tmp_path)
    _feed(tmp_path).status("done")
    state = ui_feed.run_state("77")
    size = len(json.dumps(state))
    events = state["events"]
    by_kind = {}
    for e in events:
        by_kind.setdefault(e["event"], []).append(e)
    steps = [e["step"] for e in by_kind["step"]]
    print(f"events.jsonl {written} bytes, {STEPS} steps; snapshot {size} bytes, {len(events)} events, "
          f"{len(steps)} step events")
    # Before: every event (32,202 of them, 3.7 MB of JSON for 20,000 steps), growing with each step and sample.
    assert size < 150_000, f"the snapshot of a {STEPS}-step run is {size} bytes"
    assert ui_feed.SNAPSHOT_POINTS // 2 <= len(steps) <= ui_feed.SNAPSHOT_POINTS + 1 + ui_feed.RECENT
    assert len(by_kind["eval"]) <= ui_feed.SNAPSHOT_POINTS + ui_feed.RECENT
    for kind in ("sampling", "sample", "warning"):
        assert len(by_kind[kind]) <= ui_feed.KEEP_PER_KIND + ui_feed.RECENT, kind
    # What the page draws: the steps in order, the first and the last, the spike, the newest steps whole
    # (status line and ETA), the newest warning, and how the run ended.
    assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] == STEPS and SPIKE in steps
    assert steps[-30:] == list(range(STEPS - 29, STEPS + 1))
    assert by_kind["warning"][-1]["message"] == f"could not decode the samples of step {STEPS}"
    assert events[0]["event"] == "started" and events[-1]["event"] == "done"
    assert all("traceback" not in e for e in events)


def test_a_short_runs_snapshot_is_every_event(tmp_path):
    _write_long_run(tmp_path, steps=12)
    _feed(tmp_path, "78")
    events = ui_feed.run_state("78")["events"]
    all_events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("step")) for e in events] == [(e["event"], e.get("step")) for e in all_events]


def test_the_snapshot_reads_events_jsonl_without_holding_all_of_it(tmp_path):
    """The server's memory: a reload of a long run must not parse its whole events file into memory at once
    (before: 32 MiB of allocations for this 3.5 MiB file; 100,000 steps took a process from 700 to 833 MiB RSS)."""
    written = _write_long_run(tmp_path)
    _feed(tmp_path, "79")
    tracemalloc.start()
    try:
        ui_feed.run_state("79")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"peak {peak / 2**20:.1f} MiB of Python allocations reading {written / 2**20:.1f} MiB of events")
    assert peak < written / 2, f"reading a {written} byte events.jsonl peaked at {peak} bytes"


def test_a_run_state_keeps_the_newest_samples_only(tmp_path):
    feed = _feed(tmp_path, "80")
    for step in range(5, 205, 5):
        feed.samples(step, [{"filename": f"step{step:06d}_p0.png", "subfolder": "x", "type": "output"}], ["a"])
    kept = [s["step"] for s in feed.state["samples"]]
    assert kept == list(range(165, 205, 5)), kept  # the newest 8 (the node's strip); before: all 40


def test_a_nan_loss_leaves_the_snapshot_valid_json(tmp_path):
    """A diverged step (loss NaN, eval losses inf) is written to events.jsonl as NaN / Infinity, which no
    browser parses: before, a reloaded page got an invalid run_state and drew nothing."""
    lines = [{"event": "started", "step": 0, "total": 3}, {"event": "step", "step": 1, "loss": 0.5, "grad_norm": 2.0},
             {"event": "step", "step": 2, "loss": float("nan"), "grad_norm": float("inf")},
             {"event": "eval", "step": 2, "loss": float("inf"), "losses": [0.1, float("inf")]}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines), encoding="utf-8")
    _feed(tmp_path, "81")
    events = json.loads(json.dumps(ui_feed.run_state("81"), allow_nan=False))["events"]
    assert [e.get("loss") for e in events] == [None, 0.5, None, None]
    assert [e.get("grad_norm") for e in events] == [None, 2.0, None, None]  # relayed, and valid JSON when diverged
    assert events[-1]["losses"] == [0.1, None]


def test_a_failed_runs_snapshot_keeps_the_error_and_the_logs_last_lines_bounded(tmp_path):
    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "error", "message": "boom"}) + "\n", encoding="utf-8")
    lines = [f"line {i}" for i in range(200)] + ["x" * 5000, "RuntimeError: CUDA out of memory"]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _feed(tmp_path, "78").status("failed", "CUDA out of memory")
    state = ui_feed.run_state("78")
    assert state["status"] == "failed" and state["reason"] == "CUDA out of memory"
    assert len(state["log"]) == ui_feed.LOG_LINES and state["log"][-1] == "RuntimeError: CUDA out of memory"
    assert state["log"][0] == f"line {200 - ui_feed.LOG_LINES + 2}"
    assert len(state["log"][-2]) == ui_feed.LOG_LINE_CHARS  # one huge line is cut, not the whole snapshot
    _feed(tmp_path, "78").status("done")
    assert ui_feed.run_state("78")["log"] == []  # only failed runs carry the log
