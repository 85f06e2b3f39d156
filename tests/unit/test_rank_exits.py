"""Naming a rank that died of a signal (engine/launch/rank_exits.py): from a surviving rank's view
of its zombie, and from the launchers' lines in train.log with the ranks' own error events."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from PipeTrain.engine.launch import processes, rank_exits

LOG = """[2026-12-02 02:58:30,100] [INFO] [launch.py:272:main] process 1064 spawned with command: ['python', '-m', 'x']
[2026-12-02 02:58:30,120] [INFO] [launch.py:272:main] process 1065 spawned with command: ['python', '-m', 'x']
[rank1]: RuntimeError: Connection closed by peer
[2026-12-02 02:58:49,150] [ERROR] [launch.py:341:sigkill_handler] ['python', '-m', 'engine'] exits with return code = -9
"""
LOST_CONTACT = {"event": "error", "rank": 1, "pid": 1065, "message": "rank 1 lost contact with the other ranks: x."}


def test_the_launcher_log_names_the_silent_rank_and_its_signal():
    cause = rank_exits.failure_cause(LOG, [LOST_CONTACT], 247, 1000, "deepspeed")
    assert cause.startswith("rank 0 (pid 1064) was killed by SIGKILL (signal 9) without an error of its own")
    assert "out-of-memory" in cause and "rank 1 lost contact" in cause


def test_an_ordinary_failure_keeps_the_ranks_own_error():
    failed = LOG.replace("= -9", "= 1")
    own = {"event": "error", "rank": 0, "pid": 1064, "message": "ValueError: bad cache"}
    assert rank_exits.failure_cause(failed, [own, LOST_CONTACT], 1, 1000, "deepspeed") == own["message"]
    assert rank_exits.failure_cause(LOG, [own, LOST_CONTACT], 247, 1000, "deepspeed") == own["message"]


def test_a_killed_plain_process_is_named():
    cause = rank_exits.failure_cause("", [], -signal.SIGKILL, 4321, "plain")
    assert cause.startswith("the training process (pid 4321) was killed by SIGKILL")


def test_a_surviving_rank_sees_the_killed_peer_as_a_zombie():
    peer = subprocess.Popen(["sleep", "60"])  # not reaped until wait(): as the launcher polls each second
    try:
        facts = [{"rank": 0, "pid": peer.pid, "start": processes.start_time(peer.pid), "host": socket.gethostname()},
                 {"rank": 1, "pid": os.getpid(), "host": socket.gethostname()}]
        assert rank_exits.lost_ranks(facts, me=1) == []
        os.kill(peer.pid, signal.SIGKILL)
        deadline = time.time() + 5
        while processes.exit_status(peer.pid) is None and time.time() < deadline:
            time.sleep(0.02)
        lost = rank_exits.lost_ranks(facts, me=1)
        assert lost == [{"rank": 0, "pid": peer.pid, "returncode": -9}]
        assert rank_exits.killed_peer(lost).startswith(f"rank 0 (pid {peer.pid}) was killed by SIGKILL")
    finally:
        peer.kill()
        peer.wait()
    reaped = rank_exits.lost_ranks(facts, me=1)  # gone without a status: the rank's error is the cause
    assert reaped[0]["returncode"] is None and "stopped first" in rank_exits.stopped_peer(reaped)


OUR_LOG = """[local_ranks] rank 0 is process 2064: python -u -m engine --config run.json
[local_ranks] rank 1 is process 2065: python -u -m engine --config run.json
[rank1]: RuntimeError: Connection closed by peer
[local_ranks] rank 0 (process 2064) exited with code -9: stopping the other ranks
[local_ranks] every rank has ended; exiting with rank 0's code
"""


def test_our_launchers_lines_name_the_silent_rank_too():
    lost = dict(LOST_CONTACT, pid=2065)
    cause = rank_exits.failure_cause(OUR_LOG, [lost], 137, 2000, "deepspeed")
    assert cause.startswith("rank 0 (pid 2064) was killed by SIGKILL (signal 9) without an error of its own"), cause
    finished = OUR_LOG.replace("[rank1]: RuntimeError: Connection closed by peer",
                               "[local_ranks] rank 1 (process 2065) finished")
    assert rank_exits.failure_cause(finished, [], 137, 2000, "deepspeed").startswith("rank 0 (pid 2064) was killed")
    assert rank_exits.failure_cause(OUR_LOG.replace("code -9", "code 1"), [lost], 1, 2000, "deepspeed") == \
        lost["message"]


def test_the_surviving_ranks_guess_is_left_out_once_the_log_names_the_killed_rank():
    """A surviving rank that saw no peer end (its socket closed before the kernel finished the peer's
    exit) guesses "another rank stopped first"; the launcher's lines answer that guess."""
    for guess in (rank_exits.UNKNOWN_CAUSE, "rank 0 (pid 1064) stopped first: its own error, earlier in train.log, "
                  "is the cause."):
        lost = dict(LOST_CONTACT, message=f"rank 1 lost contact with the other ranks: Connection closed by peer. {guess}")
        cause = rank_exits.failure_cause(LOG, [lost], 247, 1000, "deepspeed")
        assert cause.startswith("rank 0 (pid 1064) was killed by SIGKILL"), cause
        assert "stopped first" not in cause and "rank 1 lost contact with the other ranks: Connection closed" in cause


def test_a_surviving_rank_waits_for_a_peer_that_is_still_ending():
    peer = subprocess.Popen(["sleep", "60"])
    try:
        facts = [{"rank": 0, "pid": peer.pid, "start": processes.start_time(peer.pid), "host": socket.gethostname()}]
        start = time.monotonic()
        assert rank_exits.lost_ranks(facts, me=1, wait_s=0.3) == []  # alive: looked for the whole wait
        assert time.monotonic() - start >= 0.3
        killer = subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -9 {peer.pid}"])
        lost = rank_exits.lost_ranks(facts, me=1, wait_s=10)
        assert lost and lost[0]["rank"] == 0 and lost[0]["returncode"] == -9, lost
        assert time.monotonic() - start < 5
        killer.wait()
    finally:
        peer.kill()
        peer.wait()


def test_a_rank_with_no_peer_on_its_host_does_not_wait():
    remote = [{"rank": 0, "pid": os.getpid(), "host": "another-host"}, {"rank": 1, "pid": os.getpid(),
                                                                          "host": socket.gethostname()}]
    start = time.monotonic()
    assert rank_exits.lost_ranks(remote, me=1, wait_s=10) == []
    assert time.monotonic() - start < 1
