"""One rank killed from outside (`kill -9`, what the kernel's out-of-memory killer does): the run's
error names that rank, its pid and the signal, not "another rank stopped first" with no such error.
Real DeepSpeed ranks (gloo on CPU) on the tiny UNet, launched headless as a user would."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine_runs import build_cache, engine_processes, make_config, rank_pids, wait_for_steps

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.core
def test_a_rank_killed_with_sigkill_is_named_with_its_pid(tmp_path, comfy_root, demo_base):
    cache = build_cache(comfy_root, demo_base)
    cfg = make_config(tmp_path / "run", comfy_root, demo_base, cache, processes=2, steps=100_000)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    headless = subprocess.Popen([sys.executable, "-m", "engine.launch.launcher", str(Path(cfg.run_dir) / "run.json")],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_steps(cfg.run_dir, 2, proc=headless)
        ranks = rank_pids(cfg.run_dir)
        assert sorted(ranks) == [0, 1], ranks
        os.kill(ranks[0], signal.SIGKILL)
        out, err = headless.communicate(timeout=120)
    finally:
        if headless.poll() is None:
            headless.kill()
    assert headless.returncode != 0
    error = err.strip().splitlines()[-1] if err.strip() else ""
    assert f"rank 0 (pid {ranks[0]})" in error and "SIGKILL" in error, f"{err}\n{out}"
    assert "Another rank stopped first" not in error
    assert not engine_processes(cfg.run_dir), "a rank outlived the failure"
