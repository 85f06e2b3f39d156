"""Samples during training in a real ComfyUI server (reliability issue, item 9): Cancel pressed while a
sample renders ends the run 'cancelled' with a checkpoint and no partial file, and a run with many
samples keeps what a reloaded page fetches (GET /pipetrain/run_state) bounded while every sample
stays on disk."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests
from engine_runs import engine_processes, kill_engine_processes

from tools.comfy_server import ComfyInterrupted
from tools.demo import training_prompt

pytestmark = pytest.mark.slow
NODE = "8"  # TrainPipeline's id in the example graph


def _training_prompt(base: dict, run_name: str, steps: int, **train) -> dict:
    """The example graph up to TrainPipeline, one training process, with its two sample prompts."""
    prompt = training_prompt(base, steps, 1, run_name, checkpoint_every=0, **train)
    assert prompt[NODE]["class_type"] == "PipeTrainTrainPipeline"
    return prompt


def _wait_for_event(run_dir: Path, kind: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = (run_dir / "events.jsonl").read_text(encoding="utf-8") if (run_dir / "events.jsonl").exists() else ""
        if f'"event": "{kind}"' in text:
            return
        time.sleep(0.2)
    raise AssertionError(f"no '{kind}' event in {run_dir} within {timeout:.0f} s")


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()]


def _partial_files(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if ".tmp" in p.name)


@pytest.mark.core  # the sampler's step callback is ComfyUI's: checked on each supported version
def test_cancel_while_a_sample_renders_ends_cancelled_with_a_checkpoint(comfy_server, demo_base):
    """A render of 2 x 1000 sampler steps at 128x128 takes minutes on a CPU. Before, the engine looked for
    Cancel only between prompts, so the node's 7 s grace ran out and it killed the process group: no
    checkpoint, no LoRA, no 'cancelled' event (the run could not be resumed from where it stopped)."""
    run_dir = Path(demo_base["base_dir"]) / "output" / "pipetrain" / "cancel_render"
    prompt = _training_prompt(demo_base, "cancel_render", 100_000, sample_every=2, sample_steps=1000,
                              sample_width=128, sample_height=128)
    prompt_id = comfy_server.queue(prompt)
    try:
        _wait_for_event(run_dir, "sampling", timeout=300)
        comfy_server.interrupt()  # what the UI's Cancel button posts
        with pytest.raises(ComfyInterrupted):  # the node ends as interrupted, not as a failure
            comfy_server.wait(prompt_id, timeout=120)
    finally:
        if comfy_server.running_prompt_ids():
            comfy_server.interrupt()
        left = engine_processes(str(run_dir))
        kill_engine_processes(str(run_dir))
    assert not left, f"{len(left)} engine processes outlived Cancel"
    events = _events(run_dir)
    sampling = next(e for e in events if e["event"] == "sampling")
    ends = [e for e in events if e["event"] in ("cancelled", "done", "error")]
    assert [e["event"] for e in ends] == ["cancelled"], (ends, comfy_server.log_tail())
    assert ends[0]["step"] == sampling["step"], "the run trained on after the sample instead of stopping"
    assert not [e for e in events if e["event"] == "sample"], "the render was not stopped"
    tag = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert tag == f"step{sampling['step']:06d}" and (run_dir / "checkpoints" / tag).is_dir()
    assert (run_dir / "lora" / f"lora_{tag}.safetensors").is_file()
    assert sorted(p.name for p in (run_dir / "samples").iterdir()) == ["prompts.safetensors"]
    assert not _partial_files(run_dir)


def test_many_samples_keep_the_page_snapshot_bounded_and_all_stay_on_disk(comfy_server, demo_base):
    """100 steps with a sample every 2: 50 samplings of 2 prompts. Before, the node kept every sample in
    the run's state and the snapshot listed all 50 and every event of the run (it grew with each step
    and sample: 262 kB at 1,000 steps with a sample every 5, benchmarks/long_run_feed.py)."""
    from PipeTrain.nodes import ui_feed

    run_dir = Path(demo_base["base_dir"]) / "output" / "pipetrain" / "many_samples"
    entry = comfy_server.run(_training_prompt(demo_base, "many_samples", 100, sample_every=2, sample_steps=1),
                             timeout=900)
    state = requests.get(comfy_server.url + "/pipetrain/run_state", params={"node": NODE}, timeout=30).json()
    assert state["run"] == "many_samples" and state["status"] == "done"
    # The node's state: the newest samples only (its strip shows 8 images); the newest on the node's output.
    assert [s["step"] for s in state["samples"]] == list(range(86, 101, 2))
    assert [i["filename"] for i in entry["outputs"][NODE]["images"]] == ["step000100_p0.png", "step000100_p1.png"]
    # Every sample stays in the run folder (PNGs and latents), none half written.
    samples = run_dir / "samples"
    assert len(list(samples.glob("step*_p*.png"))) == 100 and len(list(samples.glob("step*.safetensors"))) == 50
    assert not _partial_files(run_dir)
    # The snapshot: every step while the run is short, the other kinds cut to their newest.
    events = state["events"]
    all_events = _events(run_dir)
    kept = [e["event"] for e in events]
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 101))
    for kind in ("sampling", "sample"):
        assert sum(e["event"] == kind for e in all_events) == 50
        assert kept.count(kind) <= ui_feed.KEEP_PER_KIND + ui_feed.RECENT // 2, kind
    # the rank's setup phases come first (what the node shows while it loads), then the run
    assert [k for k in kept if k != "setup"][0] == "started" and kept[-1] == "done"
    print(f"events.jsonl {len((run_dir / 'events.jsonl').read_bytes())} bytes, {len(all_events)} events; "
          f"snapshot {len(json.dumps(state))} bytes, {len(events)} events")
