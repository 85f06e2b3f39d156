"""LoadDataset's `target_fps`: the rate video clips are sampled at, and what the dataset report says
about clips' frame rates.

Values (DatasetSpec.target_fps):
- "auto" (the node's default): the video model's own rate. The dataset does not know the model;
  CacheLatents does, from its VAE (engine/cache/vae_frame_rate.py: Wan 2.1 16, Wan 2.2 5B 24,
  HunyuanVideo 24, LTX-Video 25, Mochi 30), and replaces "auto" with that number before it scans,
  fingerprints and encodes. Until then (LoadDataset's own scan) clips are counted as source frames.
- a number (16, 24, 23.976, "30000/1001"): frames are picked by timestamp at that rate
  (engine/data/frame_picks.py).
- 0 ("source"): every frame_stride-th source frame, as before target_fps existed; the default of a
  spec written without the field, so older specs and caches keep their meaning and fingerprint.
"""
from __future__ import annotations

import math
from fractions import Fraction
from itertools import pairwise

from .frame_buckets import clip_lengths
from .frame_picks import clip_rate, clip_starts, longest_bucket
from .messages import DatasetError

AUTO = "auto"
SOURCE_WORDS = ("source", "0")
MIN_FPS, MAX_FPS = 1.0, 240.0
FAR_FACTOR = 2.0  # a clip more than this many times faster (or slower) than target_fps is listed


def parse_target_fps(value) -> float | str:
    """"auto", 0.0 (source frames) or a frame rate, from what the node's box or a JSON config holds."""
    if isinstance(value, bool):
        raise DatasetError(_bad(value))
    if isinstance(value, (int, float)):
        fps = float(value)
    else:
        text = str(value).strip().lower().removesuffix("fps").strip()
        if text in (AUTO, ""):  # an emptied box: the default
            return AUTO
        if text in SOURCE_WORDS:
            return 0.0
        try:
            fps = float(Fraction(text))  # 16, 23.976, 30000/1001
        except (ValueError, ZeroDivisionError):
            raise DatasetError(_bad(value)) from None
    check_target_fps(fps, shown=value)
    return fps


def check_target_fps(value, shown=None) -> None:
    """DatasetError unless `value` is "auto", 0 or a rate from MIN_FPS to MAX_FPS (`shown`: as the user typed it)."""
    if value == AUTO:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            not (value == 0 or MIN_FPS <= value <= MAX_FPS):
        raise DatasetError(_bad(value if shown is None else shown))


def _bad(value) -> str:
    return (f"target_fps is {value!r}: enter 'auto' (the video model's rate, which CacheLatents reads from its VAE), "
            f"a frame rate from {MIN_FPS:g} to {MAX_FPS:g} (16 for Wan, 24 for HunyuanVideo, 25 for LTX-Video; "
            "23.976 or 24000/1001 work too), or 'source' (0) to keep the videos' own frames.")


def sampling_fps(spec) -> float:
    """The rate clips are picked at: 0 for source frames, and for an "auto" CacheLatents has not resolved."""
    return 0.0 if spec.target_fps == AUTO else float(spec.target_fps or 0)


def fps_text(fps: float) -> str:
    return f"{round(fps, 2):g} fps"


def clip_need(spec) -> str:
    """What the shortest clip needs, for the 'short' warning: '17 frames for video_frames x frame_stride', or
    '1.00 s from the first frame to the last: 17 frames at 16 fps, stride 1'."""
    fps, frames = sampling_fps(spec), min(clip_lengths(spec), default=0)
    setting = "the shortest of frame_buckets" if spec.frame_buckets else "video_frames"
    if not fps:
        return f"{(frames - 1) * spec.frame_stride + 1} frames for {setting} x frame_stride"
    span = (frames - 1) * spec.frame_stride / fps
    return (f"{span:.2f} s from the first frame to the last: {frames} frames at {fps_text(fps)}, "
            f"stride {spec.frame_stride}")


def clip_bucket(spec, times) -> int | None:
    """The frame bucket a video with these timestamps trains at (the longest it fills); None: too short for any."""
    return longest_bucket(times, clip_lengths(spec), sampling_fps(spec), spec.frame_stride)


def clips_of(spec, times, frames: int) -> tuple[float, ...]:
    """Where the video's clips of `frames` frames begin (seconds), by the spec's clip_mode."""
    return tuple(clip_starts(times, frames, sampling_fps(spec), spec.frame_stride, spec.clip_mode))


def short_note(spec, path: str, times) -> str:
    """'a.mp4 (3 frames)', or with a target rate 'a.mp4 (0.40 s, 3 frames)'."""
    if not sampling_fps(spec):
        return f"{path} ({len(times)} frames)"
    return f"{path} ({times[-1] - times[0]:.2f} s, {len(times)} frames)"


def note_frame_rate(report: dict[str, list[str]], rates: dict[str, int], path: str, times, spec) -> None:
    """Add one usable video's frame rate to the report: far from target_fps, or variable; and count it
    in `rates` ('24 fps' -> how many clips) for LoadDataset's summary line."""
    rate = clip_rate(times)
    if not rate.fps:
        return
    label = fps_text(rate.fps) + (" (variable)" if rate.variable else "")
    rates[label] = rates.get(label, 0) + 1
    fps = sampling_fps(spec)
    if fps and not (fps / FAR_FACTOR <= rate.fps <= fps * FAR_FACTOR):
        report["fps_far"].append(f"{path} ({fps_text(rate.fps)})")
    if rate.variable:
        gaps = [b - a for a, b in pairwise(times)]
        report["fps_variable"].append(f"{path} ({fps_text(1 / max(gaps))} to {fps_text(1 / max(min(gaps), 1e-6))})")


def variable_effect(spec) -> str:
    """How variable-rate clips train with these settings (the fps_variable warning's middle)."""
    fps = sampling_fps(spec)
    if fps:
        return f"their frames are picked by timestamp at {fps_text(fps)}, so motion keeps its real speed"
    if spec.target_fps == AUTO:
        return ("CacheLatents picks their frames by timestamp at its VAE's model rate, so motion keeps its "
                "real speed")
    return ("target_fps is source, so they train as raw frames and their motion speeds up and slows down: "
            "set target_fps to 'auto' or your model's rate to pick frames by timestamp")


def rates_summary(rates: dict[str, int]) -> str:
    """'24 fps: 3, 60 fps: 1, 29.97 fps (variable): 1', most common first."""
    return ", ".join(f"{label}: {n}" for label, n in sorted(rates.items(), key=lambda kv: (-kv[1], kv[0])))
