"""A run folder has one owner (issue 22): a second launch of a folder that a live run trains in is
refused, headless and through launcher.spawn, with the live run's pid; after `kill -9` of every
process of that run its lock is stale and a resume takes it over. Real DeepSpeed rank (gloo on CPU)."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_runs import EngineRun, build_cache, engine_processes, kill_engine_processes, make_config, run_to_end
from PipeTrain.engine.launch import launcher, run_lock

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.core
def test_a_live_folder_is_refused_and_its_stale_lock_is_taken_over(tmp_path, comfy_root, demo_base):
    cfg = make_config(tmp_path / "run", comfy_root, demo_base, build_cache(comfy_root, demo_base),
                      steps=100_000, checkpoint_every=1)
    live = EngineRun(cfg)
    try:
        live.wait_for("checkpoint", timeout=240)
        processes = engine_processes(cfg.run_dir)  # the per-node launcher and the rank
        resumed = dataclasses.replace(cfg, resume=True)
        second = tmp_path / "second.json"  # the same run folder, resumed from a shell
        resumed.save(second)
        headless = subprocess.run([sys.executable, "-m", "engine.launch.launcher", str(second)], cwd=REPO,
                                  capture_output=True, text=True, timeout=120)
        assert headless.returncode == 2, headless.stdout + headless.stderr
        assert f"still training (pid {live.proc.pid}" in headless.stderr, headless.stderr
        with pytest.raises(run_lock.RunFolderBusy, match=rf"still training \(pid {live.proc.pid}"):
            launcher.spawn(resumed, second, cuda=False)  # what the node and the headless launcher call
        assert live.proc.poll() is None and engine_processes(cfg.run_dir) == processes  # nothing else started

        os.killpg(live.proc.pid, signal.SIGKILL)  # kill -9 of everything: no process can release the lock
        live.proc.wait()
        deadline = time.time() + 30
        while engine_processes(cfg.run_dir) and time.time() < deadline:
            time.sleep(0.2)
    finally:
        kill_engine_processes(str(tmp_path))  # also a second launch (its run.json lies beside the folder)
    lock = json.loads((Path(cfg.run_dir) / "run.lock").read_text())
    assert lock["pid"] == live.proc.pid and run_lock.holder(cfg.run_dir) is None  # left behind, and stale
    step = int((Path(cfg.run_dir) / "checkpoints" / "latest").read_text().strip()[4:])
    after = run_to_end(dataclasses.replace(resumed, train=dataclasses.replace(cfg.train, steps=step + 2)))
    assert [e["step"] for e in after.of("step")] == [step + 1, step + 2]
    assert run_lock.holder(cfg.run_dir) is None
