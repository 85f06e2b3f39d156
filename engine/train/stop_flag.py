"""When a rank should checkpoint and stop: SIGTERM/SIGINT, the cancel file, or the end of the ComfyUI
server that started the run (engine/launch/owner.py). The train loop asks once per optimizer step
and `dist.any_true` spreads the answer over the ranks; the owner is polled by a thread, so noticing
does not wait for a long step.

The finish file (Stop & save) is the other way to end a run early: the step under way becomes the last
one, so the run ends as a finished one (final LoRA, checkpoint, 'done') instead of a cancelled one."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

from ..launch import processes
from ..launch.owner import OwnerWatch, watched_owner
from ..launch.stop_files import CANCEL_FILE, FINISH_FILE  # written by the node, the launcher or a user


class StopFlag:
    def __init__(self, run_dir: Path):
        self.cancel_file = run_dir / CANCEL_FILE
        self.finish_file = run_dir / FINISH_FILE
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

    def finish_requested(self) -> bool:
        """Stop & save: end after this step as if it were the last (the loop lets a cancel win)."""
        return self.finish_file.exists()

    @property
    def reason(self) -> str:
        """Why the ranks stop, for the 'cancelled' event (the rank that noticed may be another one)."""
        if self.owner_gone.is_set() or (self.owner and not processes.is_running(self.owner)):
            return "the ComfyUI server that started the run is gone"
        return "signal" if self.signalled else "cancel file" if self.cancel_file.exists() else "another rank"


def finish_message(step: int, total: int) -> str:
    """The 'finish_requested' event's words, also printed to the log."""
    return f"stopped by Stop & save at step {step} of {total}: this step's LoRA is the final one"
