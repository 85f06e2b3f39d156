"""The ComfyUI server that started a run, as the run's processes see it (standard library only).

The node launches with its own identity (pid, start time, host) in PIPETRAIN_OWNER; a rank polls it
from a daemon thread and, once that process is gone or its pid belongs to another process, stops
like Cancel: checkpoint, then exit (engine/train/stop_flag.py). `kill -9` of the server runs no exit
handler, so this is what ends its runs then. Headless launches clear the variable: nothing is watched.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from typing import Callable

from . import processes

OWNER_ENV = "PIPETRAIN_OWNER"
POLL_S = 3.0
ORPHAN_KILL_S = 300.0  # still running this long after the server went: a hung step; end the whole run


def owner_value(pid: int) -> str:
    """PIPETRAIN_OWNER's value for the process `pid` (the server: the node's own pid)."""
    return json.dumps(processes.identity(pid))


def watched_owner(env=None) -> dict | None:
    """The owner to watch from this process: None for headless runs, and on another host than the owner's."""
    raw = (os.environ if env is None else env).get(OWNER_ENV, "")
    try:
        owner = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return None
    return owner if owner.get("host") == socket.gethostname() else None


class OwnerWatch(threading.Thread):
    """Calls on_gone() once the owner has ended; ends this run's processes if they still run kill_after_s later."""

    def __init__(self, owner: dict, on_gone: Callable[[], None], poll_s: float = POLL_S,
                 kill_after_s: float = ORPHAN_KILL_S):
        super().__init__(name="pipetrain-owner-watch", daemon=True)
        self.owner, self.on_gone, self.poll_s, self.kill_after_s = owner, on_gone, poll_s, kill_after_s

    def run(self) -> None:
        while processes.is_running(self.owner):
            time.sleep(self.poll_s)
        print(f"PipeTrain: the ComfyUI server that started this run (pid {self.owner['pid']}) is gone: saving a "
              "checkpoint and stopping.", flush=True)
        self.on_gone()
        time.sleep(self.kill_after_s)
        print(f"PipeTrain: still running {self.kill_after_s:.0f} s after the server went (a step or checkpoint "
              "hangs): ending this run's processes.", flush=True)
        _end_run_processes()


def _end_run_processes() -> None:
    """The launcher's process group (launcher.spawn starts it as a session of its own), else this process."""
    if os.name != "nt" and os.getpgrp() == os.getsid(0):
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)
