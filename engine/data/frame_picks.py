"""Which source frames make a video clip: `pick_frames`, by timestamp, and what a clip's timestamps
say about its frame rate (`clip_rate`).

The one place frames are chosen. engine/data/video.py reads a video's presentation timestamps
(demuxed, not decoded) and decodes the frames picked here; the dataset scan calls the same function
to know whether a video is long enough for one clip. Clip modes (`clip_starts`) choose where each
clip begins, and frame buckets (`longest_bucket`) how many frames it has; `pick_frames` then runs
once per clip from its start.

Rules:
- target_fps > 0: output frame i is the source frame whose timestamp is nearest to
  start + i * stride / target_fps (ties go to the earlier frame). A variable-frame-rate clip is
  handled by the same rule: its timestamps, not its frame count, say where each frame is. A clip
  slower than target_fps repeats frames; a faster one skips frames.
- target_fps 0 ("source"): every stride-th source frame from `start`, whatever the timestamps
  (PipeTrain's behaviour before target_fps existed).
- Too short (None): a wanted time lies more than half a source frame interval after the last frame.
  At target_fps equal to the source rate that is exactly the frame-count rule of source mode.
- Frame buckets: a video trains at the longest clip length of the list it is long enough for.
- Clip modes (LoadDataset's clip_mode): single_beginning, one clip from the first frame (PipeTrain's
  behaviour before clip modes existed); single_middle, one clip with as much cut off the start as off
  the end; multiple_overlapping, as few clips as cover the whole video (ceil(video length / clip
  length)), the first at the start, the last ending at the last frame, the others evenly between, so
  neighbours overlap by the same amount. In source mode starts are frame indices; with target_fps,
  times (the same rules at the source's rate give the same frames).
"""
from __future__ import annotations

import bisect
import math
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


BEGINNING, MIDDLE, OVERLAPPING = "single_beginning", "single_middle", "multiple_overlapping"
CLIP_MODES = (BEGINNING, MIDDLE, OVERLAPPING)


def longest_bucket(times: Sequence[float], buckets: Sequence[int], target_fps: float, stride: int = 1) -> int | None:
    """The longest clip length of `buckets` the video is long enough for; None when it is shorter than every one."""
    fits = [b for b in buckets if pick_frames(times, b, target_fps, stride) is not None]
    return max(fits) if fits else None


def clip_starts(times: Sequence[float], frames: int, target_fps: float, stride: int = 1,
                mode: str = BEGINNING) -> list[float]:
    """Where each clip of `frames` frames begins, in seconds (for pick_frames' `start`), by clip mode (module
    doc); [] when the video is too short for one clip."""
    if pick_frames(times, frames, target_fps, stride) is None:
        return []
    if mode == BEGINNING:
        return [times[0]]
    if not target_fps:  # in frames: the clip covers `need` source frames, and may begin at 0..last
        need = (frames - 1) * stride + 1
        last = len(times) - need
        if mode == MIDDLE:
            return [times[last // 2]]
        count = -(-len(times) // need)
        return [times[round(i * last / (count - 1)) if count > 1 else 0] for i in range(count)]
    span = (frames - 1) * stride / target_fps  # from the clip's first wanted time to its last
    latest = max(times[0], times[-1] - span)
    if mode == MIDDLE:
        return [times[0] + (latest - times[0]) / 2]
    covered = times[-1] - times[0] + mean_interval(times)  # the video's length, its last frame's interval included
    count = max(1, math.ceil(covered / (frames * stride / target_fps) - _TIE))
    starts = [times[0] + (i * (latest - times[0]) / (count - 1) if count > 1 else 0.0) for i in range(count)]
    # a clip slower than target_fps repeats frames, so two starts may pick the same frames: one such clip is enough
    picked = [tuple(pick_frames(times, frames, target_fps, stride, t) or ()) for t in starts]
    return [t for k, t in enumerate(starts) if k == 0 or picked[k] != picked[k - 1]]


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
