"""A rank that died without an error of its own (kill -9, the out-of-memory killer, a segfault): which
rank, its pid and the signal (standard library only).

Two witnesses, because either alone can miss it. The other ranks: their collective fails at once, and
on the same host they still see the dead rank as a zombie with its exit status (`lost_ranks`, called
by the rank's failure message). And the per-node launcher's lines in train.log (ours on one machine,
engine/launch/local_ranks.py: "rank R is process N", "rank R (process N) exited with code -9";
DeepSpeed's across machines: "process N spawned" per local rank, in rank order, and "exits with return
code = -9" when it saw the first rank end); with the ranks' own error events (each names its pid) the
one rank that wrote none is the dead one (`failure_cause`, called by the node and the headless launcher).
"""
from __future__ import annotations

import re
import socket
import time

from . import processes

# A surviving rank's guess at the cause, where no peer of this host was seen killed: stopped_peer's sentence, or
# UNKNOWN_CAUSE where it saw none end. _GUESS finds either (failure_cause drops it once the log names the killed rank).
_OWN_ERROR = "its own error, earlier in train.log, is the cause."
UNKNOWN_CAUSE = f"Another rank stopped first: {_OWN_ERROR}"
_GUESS = re.compile(r" ?(?:Another rank|rank \d+ \(pid \d+\)) stopped first[^:]*: " + re.escape(_OWN_ERROR))

# DeepSpeed's launcher's lines or local_ranks.py's; local lines only (no "host:" prefix of DeepSpeed's runner)
_SPAWNED = re.compile(r"^\[[^\n]*\] process (\d+) spawned with command|^\[local_ranks\] rank \d+ is process (\d+):", re.M)
_SUCCEEDED = re.compile(r"Process (\d+) exits successfully|^\[local_ranks\] rank \d+ \(process (\d+)\) finished", re.M)
_RETURNCODE = re.compile(r"exits with return code = (-?\d+)|^\[local_ranks\] rank \d+ \(process \d+\) exited with code "
                         r"(-?\d+)", re.M)


def _numbers(pattern: re.Pattern, text: str) -> list[int]:
    """The one group each match of an alternation filled, as ints."""
    return [int(a or b) for a, b in pattern.findall(text)]


def lost_ranks(peers: list[dict], me: int, wait_s: float = 0.0) -> list[dict]:
    """Ranks on this host (from node_checks' facts: rank, pid, start, host) that have ended:
    [{"rank", "pid", "returncode" (None once reaped)}]. wait_s: how long to look again while none has
    ended, for a peer whose sockets closed before the kernel finished its exit (a busy machine). With no
    other rank on this host there is nothing to watch, and no wait."""
    host = socket.gethostname()
    local = [p for p in peers if p.get("rank") != me and p.get("host") == host and "pid" in p]
    deadline = time.monotonic() + wait_s
    while True:
        lost = [{"rank": p["rank"], "pid": p["pid"], "returncode": processes.exit_status(p["pid"])} for p in local
                if not processes.is_running({"pid": p["pid"], "start": p.get("start", ""), "host": host})]
        if lost or not local or time.monotonic() >= deadline:
            return lost
        time.sleep(0.05)


def killed_sentence(who: str, pid: int, returncode: int) -> str:
    """'rank 0 (pid 123) was killed by SIGKILL (signal 9) without an error of its own: ...why'."""
    why = {9: "the kernel's out-of-memory killer is the usual sender (`dmesg` or `journalctl -k` shows "
              f"'Killed process {pid}'); else a user or a job scheduler",
           11: "a crash in native code (a driver, CUDA or a compiled extension)",
           6: "an abort in native code (a driver, CUDA or a compiled extension)",
           7: "a crash in native code (a bus error; also a full /dev/shm)"}.get(-returncode,
                                                                                  "something outside PipeTrain sent it")
    return (f"{who} (pid {pid}) was {processes.describe_returncode(returncode)} without an error of its own: {why}. "
            "Resume the run to continue from its last checkpoint.")


def killed_peer(lost: list[dict]) -> str:
    """The killed sentence for the first lost rank that died of a signal, or ''."""
    for peer in lost:
        code = peer.get("returncode")
        if code is not None and code < 0:
            return killed_sentence(f"rank {peer['rank']}", peer["pid"], code)
    return ""


def stopped_peer(lost: list[dict]) -> str:
    """For a lost rank that did not die of a signal (or was reaped before it could be seen): '' if none."""
    if not lost:
        return ""
    peer = lost[0]
    how = f" ({processes.describe_returncode(peer['returncode'])})" if peer.get("returncode") is not None else ""
    return f"rank {peer['rank']} (pid {peer['pid']}) stopped first{how}: {_OWN_ERROR}"


def failure_cause(log_text: str, errors: list[dict], returncode: int | None, pid: int, backend: str) -> str:
    """What to tell the user about a failed launch: log_text is train.log since the launch, errors its
    'error' events, returncode and pid the launched process's."""
    first = errors[0].get("message", "") if errors else ""
    if backend == "plain":  # the launched process is the one rank
        if returncode is not None and returncode < 0 and not errors:
            return killed_sentence("the training process", pid, returncode)
        return first
    codes = _numbers(_RETURNCODE, log_text)
    if not codes or codes[-1] >= 0:
        return first
    spawned = _numbers(_SPAWNED, log_text)
    spoke = {e.get("pid") for e in errors} | set(_numbers(_SUCCEEDED, log_text))
    silent = [(rank, p) for rank, p in enumerate(spawned) if p not in spoke]
    if len(silent) != 1:
        return first
    rank, dead = silent[0]
    if f"rank {rank} (pid {dead}) was killed" in first:
        return first  # a surviving rank saw it already
    sentence = killed_sentence(f"rank {rank}", dead, codes[-1])
    first = _GUESS.sub("", first).strip()  # the surviving rank's guess, answered by the sentence
    return f"{sentence} The other ranks stopped because it was gone ({first})" if first else sentence
