"""Where a rank's time from its start to the first step goes: seconds per setup phase, reported in
the 'started' event (`setup_phases`) and by benchmarks/engine_bench.py. The first step's own time,
compiling included, is the first 'step' event's `seconds`. Once the run's event log exists, each phase that
ends is also a 'setup' event (`announce`), so the node can say what the rank is doing while it loads."""
from __future__ import annotations

import time


class SetupPhases:
    def __init__(self, process_start: float | None = None):
        self.seconds: dict[str, float] = {}
        self._last = self.start = process_start if process_start is not None else time.time()
        self.announce = None  # called with each phase's name as it ends (engine/train/loop.py: a 'setup' event)

    def done(self, name: str) -> None:
        """The phase `name` ended now: it took the time since the previous phase ended."""
        now = time.time()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._last, 2)
        self._last = now
        if self.announce is not None:
            self.announce(name)
