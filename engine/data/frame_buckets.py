"""LoadDataset's `frame_buckets` and `clip_mode`: how many frames each video's clips have, and which
part of the video they take (the picking itself is engine/data/frame_picks.py).

- `frame_buckets`: clip lengths in frames, e.g. "17, 33, 65". Each video trains at the longest one it
  is long enough for (at target_fps and frame_stride); a video shorter than the shortest is skipped
  and listed. Empty: the single length `video_frames` (the setting before frame buckets existed), so
  older specs keep their meaning, fingerprint and cache. Setting both is allowed only when
  video_frames is one of the buckets.
- `clip_mode`: single_beginning (default: one clip from the first frame), single_middle (one clip
  from the middle), multiple_overlapping (enough clips to cover the whole video, overlapping evenly;
  each is a cache item of its own).
- The VAE's rule: a video VAE that compresses T frames into one latent frame encodes 1 + T*k frames
  (4k+1 for Wan and HunyuanVideo, 8k+1 for LTXV). The dataset does not know the VAE, so
  CacheLatents checks every bucket with `frame_rule_problem` (engine/cache/vae_frame_rate.py).

Pure Python: the node and the engine share it.
"""
from __future__ import annotations

import re

from .frame_picks import BEGINNING, CLIP_MODES
from .messages import DatasetError

MAX_FRAMES = 1025
MAX_BUCKETS = 16


def parse_frame_buckets(value) -> tuple[int, ...]:
    """The node's text ("17, 33 65") or a config's list -> ascending distinct clip lengths; () when empty.
    Values are checked by check_clip_settings."""
    if isinstance(value, str):
        parts = [p for p in re.split(r"[,;\s]+", value.strip()) if p]
        bad = [p for p in parts if not p.isdigit()]
        if bad:
            raise DatasetError(f"frame_buckets entry {bad[0]!r} is not a whole number: list clip lengths in frames "
                               "such as '17, 33, 65' (4k+1 for Wan/HunyuanVideo), or leave it empty to use video_frames.")
        value = [int(p) for p in parts]
    if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise DatasetError(f"frame_buckets is {value!r}: give a list of whole numbers of frames, e.g. [17, 33, 65].")
    return tuple(sorted(set(value)))


def clip_lengths(spec) -> tuple[int, ...]:
    """The frame buckets videos train at, ascending: frame_buckets, else (video_frames,); () = videos skipped."""
    return tuple(spec.frame_buckets) or ((spec.video_frames,) if spec.video_frames else ())


def check_clip_settings(video_frames, frame_buckets, clip_mode) -> None:
    """DatasetError, saying what to change, for clip settings that cannot work (no disk access)."""
    if isinstance(video_frames, bool) or not (isinstance(video_frames, int) and 0 <= video_frames <= MAX_FRAMES):
        raise DatasetError(f"video_frames is {video_frames}: use 0 (skip videos) or the clip length the model "
                           "needs, e.g. 17, 33 or 81 (4k+1) for Wan/HunyuanVideo, 25 or 49 (8k+1) for LTXV.")
    for n in frame_buckets:
        if isinstance(n, bool) or not (isinstance(n, int) and 1 <= n <= MAX_FRAMES):
            raise DatasetError(f"frame_buckets lists {n}: every clip length must be a whole number of frames from 1 "
                               f"to {MAX_FRAMES}, e.g. '17, 33, 65' (4k+1) for Wan/HunyuanVideo, '25, 49' (8k+1) for "
                               "LTXV.")
    if len(frame_buckets) > MAX_BUCKETS:
        raise DatasetError(f"frame_buckets lists {len(frame_buckets)} lengths: use at most {MAX_BUCKETS} (each one "
                           "is a batch shape of its own).")
    if video_frames and frame_buckets and video_frames not in frame_buckets:
        raise DatasetError(f"video_frames is {video_frames} and frame_buckets is {', '.join(map(str, frame_buckets))}: "
                           "use one of them. Set video_frames to 0 (frame_buckets then sets the clip lengths), or add "
                           f"{video_frames} to frame_buckets.")
    if clip_mode not in CLIP_MODES:
        raise DatasetError(f"clip_mode is {clip_mode!r}: use {', '.join(CLIP_MODES)} (default {BEGINNING}).")


def frame_rule_problem(lengths, per_latent: int | None, vae_name: str) -> str | None:
    """Why clip lengths do not suit a VAE that compresses `per_latent` frames into one latent frame, with the
    nearest lengths that do; None when all suit it (or the VAE has no such rule)."""
    if not per_latent or per_latent <= 1:
        return None
    wrong = [n for n in lengths if n % per_latent != 1]
    if not wrong:
        return None
    n = wrong[0]
    below, above = n - (n - 1) % per_latent, n - (n - 1) % per_latent + per_latent
    near = f"{below} or {above}" if below >= 1 else str(above)
    return (f"{n} frames per clip does not suit the VAE ({vae_name}): it turns {per_latent} frames into one latent "
            f"frame, so clips need {per_latent}k+1 frames. Use {near} instead of {n} in LoadDataset's "
            "frame_buckets / video_frames.")
