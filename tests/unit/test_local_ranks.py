"""The per-node launcher on one machine (engine/launch/local_ranks.py), with real processes standing in
for ranks (small Python programs; the training ranks are covered by every DeepSpeed test): the
environment each rank gets, a failed rank stopping the others with its exit code, and SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from PipeTrain.engine.launch import local_ranks

REPO = Path(__file__).resolve().parents[2]
RANK = """import json, os, sys, time
keys = ("CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_SIZE", "RANK", "LOCAL_RANK",
        "CROSS_RANK", "CROSS_SIZE")
out = sys.argv[1]
with open(os.path.join(out, "rank" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys} | {"pid": os.getpid()}, f)
if os.environ["RANK"] == sys.argv[2]:
    sys.exit(int(sys.argv[3]))
time.sleep(float(sys.argv[4]))
"""


def _launch(tmp_path: Path, failing_rank: int, code: int, sleep: float, as_file: bool = False) -> subprocess.Popen:
    """The launcher on two fake ranks, run as a module (`-- fake_rank ...`) or as a file (`-- /x/fake_rank.py ...`)."""
    (tmp_path / "fake_rank.py").write_text(RANK)
    target = str(tmp_path / "fake_rank.py") if as_file else "fake_rank"
    cmd = [sys.executable, "-m", "engine.launch.local_ranks", "--devices=3,5", "--master_port=29999", "--",
           target, str(tmp_path), str(failing_rank), str(code), str(sleep)]
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.parametrize("as_file", [False, True], ids=["module", "file"])
def test_each_rank_gets_the_environment_deepspeeds_launcher_would_give_it(tmp_path, as_file):
    proc = _launch(tmp_path, failing_rank=-1, code=0, sleep=0, as_file=as_file)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    envs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, env in enumerate(envs):
        assert {k: v for k, v in env.items() if k != "pid"} == {
            "CUDA_VISIBLE_DEVICES": "3,5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "WORLD_SIZE": "2",
            "LOCAL_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "CROSS_RANK": "0", "CROSS_SIZE": "1"}
        assert f"[local_ranks] rank {rank} is process {env['pid']}: " in out
        assert f"[local_ranks] rank {rank} (process {env['pid']}) finished" in out


def test_a_failed_rank_stops_the_others_and_its_code_is_the_launchers(tmp_path):
    start = time.monotonic()
    proc = _launch(tmp_path, failing_rank=1, code=3, sleep=120)
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - start < 30, "the other rank was not stopped"
    assert proc.returncode == 3, out
    survivor, failed = (json.loads((tmp_path / f"rank{r}.json").read_text())["pid"] for r in (0, 1))
    assert not _alive(survivor)
    assert out.splitlines()[-2:] == [f"[local_ranks] rank 1 (process {failed}) exited with code 3: stopping the "
                                     "other ranks", "[local_ranks] every rank has ended; exiting with rank 1's code"]
    assert local_ranks.exit_code(-signal.SIGKILL) == 137


def test_sigterm_to_the_launcher_ends_every_rank(tmp_path):
    proc = _launch(tmp_path, failing_rank=-1, code=0, sleep=120)
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"rank{r}.json").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [json.loads((tmp_path / f"rank{r}.json").read_text())["pid"] for r in (0, 1)]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert not any(_alive(p) for p in pids), out
    assert out.splitlines()[-1] == "[local_ranks] every rank has ended", out
