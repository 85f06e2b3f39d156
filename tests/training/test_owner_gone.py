"""The process that started a run (the ComfyUI server) dies by `kill -9` (issue 22): the run notices
within seconds, checkpoints and exits. A sleeping process stands in for the server; the plain
backend (one process, no launcher) on the tiny UNet. tests/e2e/test_process_faults_server.py
kills a real server with DeepSpeed ranks."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_runs import EngineRun, build_cache, engine_processes, kill_engine_processes, make_config

pytestmark = pytest.mark.slow


@pytest.mark.core
def test_the_plain_backend_stops_with_a_checkpoint_when_its_server_is_killed(tmp_path, comfy_root, demo_base):
    cfg = make_config(tmp_path / "run", comfy_root, demo_base, build_cache(comfy_root, demo_base), steps=100_000)
    cfg = dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, backend="plain"))
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])
    try:
        run = EngineRun(cfg, owner=server.pid)
        run.wait_for("step", min_step=2, timeout=240)
        killed = time.time()
        server.kill()
        server.wait()
        rc = run.wait(timeout=60)
        took = time.time() - killed
    finally:
        server.kill()
        kill_engine_processes(cfg.run_dir)
    print(f"the plain run exited {took:.1f} s after its server was killed")
    assert rc == 0, run.log()
    assert took < 30, f"took {took:.1f} s"
    stopped = run.of("cancelled")
    assert stopped and stopped[0]["reason"] == "the ComfyUI server that started the run is gone", run.log()
    latest = (Path(cfg.run_dir) / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step{stopped[0]['step']:06d}"
    assert "is gone: saving a checkpoint and stopping" in run.log()
    assert not engine_processes(cfg.run_dir)

