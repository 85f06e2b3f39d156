"""The run-folder lock (engine/launch/run_lock.py): a live holder is refused with its pid, a stale
one (pid gone, or its pid now another process) is taken over, release leaves others' locks alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from PipeTrain.engine.launch import processes, run_lock


def _write(run_dir, ident: dict) -> None:
    (run_dir / "run.lock").write_text(json.dumps({**ident, "since": 0}))


@pytest.fixture
def other():
    """A live process other than this one (another ComfyUI or shell training in the folder)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_holder_is_refused_with_its_pid(tmp_path, other):
    _write(tmp_path, processes.identity(other.pid))
    with pytest.raises(run_lock.RunFolderBusy, match=rf"still training \(pid {other.pid},"):
        run_lock.claim(tmp_path)
    assert run_lock.holder(tmp_path)["pid"] == other.pid


def test_a_stale_lock_is_taken_over(tmp_path, other):
    _write(tmp_path, processes.identity(other.pid))
    other.kill()
    other.wait()
    run_lock.claim(tmp_path)  # its process is gone
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()


def test_a_lock_whose_pid_is_now_another_process_is_stale(tmp_path):
    me = processes.identity()
    _write(tmp_path, {**me, "start": me["start"] + "1"})  # this pid, but not the process that wrote it
    run_lock.claim(tmp_path)
    assert json.loads((tmp_path / "run.lock").read_text())["start"] == me["start"]


def test_another_hosts_lock_is_refused_with_what_to_do(tmp_path):
    _write(tmp_path, {"pid": 4242, "start": "x", "host": "elsewhere"})
    with pytest.raises(run_lock.RunFolderBusy, match="pid 4242 on host elsewhere.*delete"):
        run_lock.claim(tmp_path)


def test_hand_over_and_release(tmp_path, other):
    run_lock.claim(tmp_path)
    run_lock.claim(tmp_path)  # the same process again: the node claims, then launcher.spawn
    run_lock.hand_over(tmp_path, 0, other.pid)
    run_lock.release(tmp_path, 0, os.getpid())  # no longer ours: stays
    assert run_lock.holder(tmp_path)["pid"] == other.pid
    run_lock.release(tmp_path, 0, other.pid)
    assert not (tmp_path / "run.lock").exists()
    with run_lock.claimed(tmp_path):
        assert run_lock.holder(tmp_path)["pid"] == os.getpid()
    assert not (tmp_path / "run.lock").exists()


def test_other_nodes_lock_their_own_file(tmp_path, other):
    _write(tmp_path, processes.identity(other.pid))  # node 0 trains
    run_lock.claim(tmp_path, node_rank=1)  # node 1 of the same shared folder
    assert (tmp_path / "run-node1.lock").is_file()
