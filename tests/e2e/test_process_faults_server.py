"""A real ComfyUI server and the training processes it starts (issue 22): `kill -9` of the server
ends its run with a checkpoint within seconds (the ranks watch the server), and a resume of a run
folder that a live run trains in is refused with that run's pid."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from engine_runs import (EngineRun, build_cache, engine_processes, kill_engine_processes, make_config,
                         wait_for_steps)
from PipeTrain.engine.launch import run_lock
from tools.comfy_server import ComfyError, ComfyServer
from tools.demo import training_prompt
from tools.tiny_assets import write_demo_base

pytestmark = pytest.mark.slow


def _training_prompt(base: dict, run_name: str, **train) -> dict:
    """The example graph up to TrainPipeline (an output node), without samples: nothing after training."""
    return training_prompt(base, 100_000, 2, run_name, **{"sample_prompts": "", "checkpoint_every": 0, **train})


def test_killing_the_server_ends_its_run_with_a_checkpoint(comfy_root, tmp_path):
    base = write_demo_base(str(tmp_path / "base"))  # its own server: this test kills it
    run_dir = Path(base["base_dir"]) / "output" / "pipetrain" / "orphan"
    server = ComfyServer(comfy_root, base["base_dir"], env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    server.start()
    try:
        server.queue(_training_prompt(base, "orphan"))
        wait_for_steps(run_dir, 2, timeout=300)
        assert engine_processes(str(run_dir)), "no launcher or rank found"
        killed = time.time()
        server.proc.kill()  # SIGKILL: ComfyUI's exit handlers never run
        server.proc.wait()
        while engine_processes(str(run_dir)) and time.time() - killed < 60:
            time.sleep(0.5)
        took = time.time() - killed
        left = engine_processes(str(run_dir))
    finally:
        server.stop()
        kill_engine_processes(str(run_dir))  # before the fix they train on for good
    print(f"launcher and ranks gone {took:.1f} s after the server was killed")
    assert not left and took < 45, f"{len(left)} engine processes still run {took:.0f} s after the server died"
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert (run_dir / "checkpoints" / latest).is_dir(), latest
    events = (run_dir / "events.jsonl").read_text()
    assert '"reason": "the ComfyUI server that started the run is gone"' in events
    deadline = time.time() + 10  # the launcher may still be exiting (its command line is already gone)
    while run_lock.holder(run_dir) is not None and time.time() < deadline:
        time.sleep(0.2)
    assert run_lock.holder(run_dir) is None, "the lock of the ended run still counts as live"


def test_resuming_a_folder_a_live_run_trains_in_is_refused(comfy_server, comfy_root, demo_base):
    """The live run is started headless-style (EngineRun) in the server's output folder; the node's
    resume of it must be refused before it touches run.json."""
    run_dir = Path(demo_base["base_dir"]) / "output" / "pipetrain" / "live_elsewhere"
    cfg = make_config(run_dir, comfy_root, demo_base, build_cache(comfy_root, demo_base), processes=1,
                      steps=100_000, checkpoint_every=1)
    live = EngineRun(cfg)
    try:
        live.wait_for("checkpoint", timeout=240)  # now the run folder is one the node offers to resume
        run_json = (run_dir / "run.json").read_bytes()
        # Settings the live run's checkpoint continues (before the fix this resume trained beside it).
        prompt = _training_prompt(demo_base, "ignored", resume="live_elsewhere", num_gpus=1, accept_changes=True)
        next(v["inputs"] for v in prompt.values() if v["class_type"] == "PipeTrainConfigureLoRA")["rank"] = 4
        with pytest.raises(ComfyError, match=rf"still training \(pid {live.proc.pid}"):
            comfy_server.run(prompt, timeout=120)
        assert (run_dir / "run.json").read_bytes() == run_json, "run.json was rewritten under the live run"
        assert live.proc.poll() is None
    finally:
        if comfy_server.running_prompt_ids():  # before the fix: a second training in the same folder
            comfy_server.interrupt()
        (run_dir / "cancel").touch()
        live.proc.wait(timeout=60)
        kill_engine_processes(str(run_dir))
