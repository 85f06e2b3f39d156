"""When a rank should checkpoint and stop: SIGTERM/SIGINT, the cancel file, or the end of the ComfyUI
server that started the run (engine/launch/owner.py). The train loop asks once per optimizer step
and `dist.any_true` spreads the answer over the ranks; the owner is polled by a thread, so noticing
does not wait for a long step."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

from ..launch import processes
from ..launch.owner import OwnerWatch, watched_owner

CANCEL_FILE = "cancel"  # the node (or a user) creates <run_dir>/cancel to stop the run cleanly


class StopFlag:
    def __init__(self, run_dir: Path):
        self.cancel_file = run_dir / CANCEL_FILE
        self.signalled = False
        self.owner_gone = threading.Event()
        # SIGBREAK: what Windows delivers for CTRL_BREAK_EVENT (engine/launch/launcher.py kill_tree).
        for sig in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGBREAK", None)):
            if sig is not None:
                signal.signal(sig, self._on_signal)
        self.owner = watched_owner()  # None for headless runs
        if self.owner:
            OwnerWatch(self.owner, self.owner_gone.set).start()

    def _on_signal(self, signum, frame):
        self.signalled = True

    def requested(self) -> bool:
        return self.signalled or self.owner_gone.is_set() or self.cancel_file.exists()

    @property
    def reason(self) -> str:
        """Why the ranks stop, for the 'cancelled' event (the rank that noticed may be another one)."""
        if self.owner_gone.is_set() or (self.owner and not processes.is_running(self.owner)):
            return "the ComfyUI server that started the run is gone"
        return "signal" if self.signalled else "cancel file" if self.cancel_file.exists() else "another rank"
