"""Aspect-ratio buckets and multi-resolution: which (width, height) each image is trained at.

A resolution R means an area of about R x R pixels. Every aspect ratio a (width / height) in
the bucket list gives one size per resolution, w = R*sqrt(a) and h = R/sqrt(a), each rounded to
the pixel multiple (64 by default: every VAE/patch combination ComfyUI ships divides it). An
image goes to the bucket whose ratio is nearest its own on a log scale (so 2:1 and 1:2 are
equally far from 1:1), is scaled to cover it and center-cropped to it (engine/data/images.py).

Bucket settings text (LoadDataset's `aspect_ratios` input, parsed by `parse_aspect_ratios`):
    ""                 square only (one bucket per resolution; the behaviour before buckets)
    "auto"             9 ratios spaced evenly on a log scale from 1:2 to 2:1
    "1:1, 4:3, 3:4"    an explicit list; each entry 'W:H', 'W/H' or a decimal like 1.5

Pure Python: no torch, no Pillow, so the node and the engine share it.
"""
from __future__ import annotations

import math
import re

AUTO_MIN_RATIO, AUTO_MAX_RATIO, AUTO_COUNT = 0.5, 2.0, 9
MAX_RATIO = 8.0  # a 1:8 strip is already a thin sliver; larger ratios are typos


class BucketError(ValueError):
    """A bucket/resolution setting the user can fix; the message names the input and the fix."""


def auto_ratios(lo: float = AUTO_MIN_RATIO, hi: float = AUTO_MAX_RATIO, count: int = AUTO_COUNT) -> tuple[float, ...]:
    step = (math.log(hi) - math.log(lo)) / (count - 1)
    return tuple(round(math.exp(math.log(lo) + i * step), 6) for i in range(count))


_RATIO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:[:/x]\s*(\d+(?:\.\d+)?))?\s*$")


def parse_aspect_ratios(text: str) -> tuple[float, ...]:
    """The `aspect_ratios` text -> sorted ratios (width / height); () means square only."""
    text = (text or "").strip()
    if not text or text.lower() == "square":
        return ()
    if text.lower() == "auto":
        return auto_ratios()
    ratios = set()
    for part in re.split(r"[,;\n]+", text):
        if not part.strip():
            continue
        m = _RATIO.match(part)
        if not m:
            raise BucketError(f"aspect_ratios entry {part.strip()!r} is not a ratio: write entries like '4:3', '3/4' or "
                              "'1.5' separated by commas, or 'auto' (1:2 to 2:1), or leave it empty for square only.")
        w, h = float(m.group(1)), float(m.group(2) or 1)
        if w <= 0 or h <= 0:
            raise BucketError(f"aspect_ratios entry {part.strip()!r} has a zero side: use positive numbers, e.g. '4:3'.")
        ratio = w / h
        if not (1 / MAX_RATIO <= ratio <= MAX_RATIO):
            raise BucketError(f"aspect_ratios entry {part.strip()!r} is {ratio:.3g}:1, outside 1:{MAX_RATIO:g} to "
                              f"{MAX_RATIO:g}:1: crop such images instead, or check for a typo.")
        ratios.add(round(ratio, 6))
    return tuple(sorted(ratios))


def parse_resolutions(text: str) -> tuple[int, ...]:
    """The `extra_resolutions` text ('768, 1024') -> side lengths; () when empty."""
    out = []
    for part in re.split(r"[,;\s]+", (text or "").strip()):
        if not part:
            continue
        if not part.isdigit():
            raise BucketError(f"extra_resolutions entry {part!r} is not a whole number: list side lengths such as "
                              "'768, 1024' (each image is also trained at those sizes), or leave it empty.")
        out.append(int(part))
    return tuple(dict.fromkeys(out))


def bucket_sizes(resolution: int, ratios: tuple[float, ...], multiple: int) -> tuple[tuple[int, int], ...]:
    """(width, height) of every bucket at one resolution, distinct, in ratio order."""
    if not ratios:
        return ((resolution, resolution),)
    sizes: list[tuple[int, int]] = []
    for ratio in ratios:
        w = max(multiple, round(resolution * math.sqrt(ratio) / multiple) * multiple)
        h = max(multiple, round(resolution / math.sqrt(ratio) / multiple) * multiple)
        if (w, h) not in sizes:
            sizes.append((w, h))
    return tuple(sizes)


def merged_buckets_notice(resolutions: tuple[int, ...], ratios: tuple[float, ...], multiple: int) -> str:
    """A notice when rounding to `multiple` merges aspect ratios into fewer bucket shapes (at resolution
    64 with multiple 64, every ratio becomes 64x64), with the settings that keep them apart; '' if none."""
    merged = [(r, bucket_sizes(r, ratios, multiple)) for r in resolutions
              if ratios and len(bucket_sizes(r, ratios, multiple)) < len(ratios)]
    if not merged:
        return ""
    r, sizes = merged[0]
    finer = [m for m in (32, 16, 8) if m < multiple and len(bucket_sizes(r, ratios, m)) == len(ratios)]
    fix = (f"Set bucket_multiple to {finer[0]} (if your model allows it) to keep all {len(ratios)} apart" if finer
           else "Lower bucket_multiple")
    shapes = ", ".join(f"{w}x{h}" for w, h in sizes)
    more = f" (and at {', '.join(str(x) for x, _ in merged[1:])})" if len(merged) > 1 else ""
    return (f"aspect_ratios: the {len(ratios)} ratios round to only {len(sizes)} bucket shape(s) at resolution {r} "
            f"with bucket_multiple {multiple}{more}: {shapes}, so images of other shapes are center-cropped to "
            f"those. {fix}, or raise the resolution.")


def nearest_bucket(width: int, height: int, sizes: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """The bucket whose aspect ratio is nearest the image's on a log scale (ties: the first)."""
    if len(sizes) == 1:
        return sizes[0]
    own = math.log(width / height)
    return min(sizes, key=lambda s: abs(math.log(s[0] / s[1]) - own))


def kept_fraction(width: int, height: int, size: tuple[int, int]) -> float:
    """Share of the image's area that survives the center crop to `size`'s aspect ratio."""
    own, target = width / height, size[0] / size[1]
    return min(own / target, target / own)


def upscale_factor(width: int, height: int, size: tuple[int, int]) -> float:
    """How much the image is enlarged to cover `size` (> 1 means upscaled)."""
    return max(size[0] / width, size[1] / height)
