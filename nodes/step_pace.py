"""The ETA the server log prints, computed as the node's status line computes it (web/chart.js etaSeconds):
from the pace of the newest steps' event times, so model loading and compiling before the first step
do not inflate it and the two never disagree by more than their rounding."""
from __future__ import annotations

from collections import deque

WINDOW = 50  # steps back, as etaSeconds' window


class StepPace:
    def __init__(self, window: int = WINDOW):
        self._seen: deque[tuple[int, float]] = deque(maxlen=window + 1)

    def add(self, step: int, time: float) -> None:
        self._seen.append((int(step), float(time)))

    def eta_seconds(self, total: int) -> float | None:
        """Seconds left at the newest step's pace, 0 once done, None before two steps."""
        if not total or len(self._seen) < 2:
            return None
        (first_step, first_time), (last_step, last_time) = self._seen[0], self._seen[-1]
        if last_step >= total:
            return 0.0
        if last_time <= first_time or last_step <= first_step:
            return None
        return (last_time - first_time) / (last_step - first_step) * (total - last_step)
