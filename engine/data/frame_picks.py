"""Which source frames make a video clip: `pick_frames`, by timestamp, and what a clip's timestamps
say about its frame rate (`clip_rate`).

The one place frames are chosen. engine/data/video.py reads a video's presentation timestamps
(demuxed, not decoded) and decodes the frames picked here; the dataset scan calls the same function
to know whether a video is long enough for one clip. Clip modes that take more than the first clip
(single_middle, multiple_overlapping...) choose other `start` times and call it once per clip.

Rules:
- target_fps > 0: output frame i is the source frame whose timestamp is nearest to
  start + i * stride / target_fps (ties go to the earlier frame). A variable-frame-rate clip is
  handled by the same rule: its timestamps, not its frame count, say where each frame is. A clip
  slower than target_fps repeats frames; a faster one skips frames.
- target_fps 0 ("source"): every stride-th source frame from `start`, whatever the timestamps
  (PipeTrain's behaviour before target_fps existed).
- Too short (None): a wanted time lies more than half a source frame interval after the last frame.
  At target_fps equal to the source rate that is exactly the frame-count rule of source mode.
"""
from __future__ import annotations

import bisect
from itertools import pairwise
from collections.abc import Sequence
from dataclasses import dataclass

_TIE = 1e-9  # seconds: distances this close count as equal (timestamps are rounded to the container's time base)
VARIABLE_SPREAD = 1.5  # a clip whose 95th-percentile frame interval is this much longer than its 5th is variable


def mean_interval(times: Sequence[float]) -> float:
    """Seconds between frames on average (0 for a single frame)."""
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0


def clip_times(start: float, frames: int, target_fps: float, stride: int = 1) -> list[float]:
    """The timestamps a clip of `frames` frames at target_fps wants, from `start` (seconds)."""
    return [start + i * stride / target_fps for i in range(frames)]


def _nearest(times: Sequence[float], t: float) -> int:
    k = bisect.bisect_left(times, t)
    if k == 0:
        return 0
    if k == len(times):
        return k - 1
    return k if times[k] - t < t - times[k - 1] - _TIE else k - 1


def pick_frames(times: Sequence[float], frames: int, target_fps: float, stride: int = 1,
                start: float | None = None) -> list[int] | None:
    """Indices into `times` (a video's presentation timestamps in seconds, ascending) of the frames of
    one clip, in order; None when the video is too short for it (rules in the module doc). `start`:
    where the clip begins, in seconds (default: the first frame)."""
    if not times or frames < 1:
        return None
    start = times[0] if start is None else start
    if not target_fps:
        first = bisect.bisect_left(times, start - _TIE)
        picks = list(range(first, first + (frames - 1) * stride + 1, stride))
        return picks if picks[-1] < len(times) else None
    wanted = clip_times(start, frames, target_fps, stride)
    if wanted[-1] > times[-1] + mean_interval(times) / 2 + _TIE:
        return None
    return [_nearest(times, t) for t in wanted]


@dataclass(frozen=True)
class ClipRate:
    fps: float  # frames per second over the whole clip (0: a single frame)
    variable: bool  # its frame intervals vary (phone and screen recordings, dropped frames)


def clip_rate(times: Sequence[float]) -> ClipRate:
    """The frame rate the timestamps show, and whether it varies within the clip."""
    step = mean_interval(times)
    if step <= 0:
        return ClipRate(0.0, False)
    gaps = sorted(b - a for a, b in pairwise(times))
    low, high = gaps[int(0.05 * (len(gaps) - 1))], gaps[round(0.95 * (len(gaps) - 1))]
    return ClipRate(1.0 / step, high > VARIABLE_SPREAD * max(low, 1e-6))
