"""ConfigError and the checks RunConfig's sections share: one condition, one message that names the
setting and the fix. Plain data, no torch. Import names from this file.
"""
from __future__ import annotations

import os
import re
import unicodedata

from .choices import RUN_NAME_RE


class ConfigError(ValueError):
    """A setting the user can fix. The message names the setting and the fix."""


def check(ok: bool, message: str) -> None:
    """A ConfigError with `message` unless `ok` (the sections' one-line validations)."""
    if not ok:
        raise ConfigError(message)


def check_block_swap(block_swap: int, pipeline_stages: int) -> None:
    """Block swap streams the blocks of the whole model through one GPU: it needs pipeline_stages 1.
    MemorySpec.validate and the memory engine (engine/memory/options.py) both call this one."""
    check(block_swap == 0 or pipeline_stages == 1,
          f"memory.block_swap is {block_swap} with pipeline_stages {pipeline_stages}: block swap needs "
          "pipeline_stages 1 (each GPU holds the whole model); set block_swap to 0 or pipeline_stages to 1.")


def split_points(text: str, stages: int) -> list[int]:
    """memory.pipeline_split ("8,20") as layer indices; [] when empty. The upper bound (the layer
    count) is checked where the model is known (engine/train/pipeline.py)."""
    if not text.strip():
        return []
    check(stages > 1, f"memory.pipeline_split is {text!r} but pipeline_stages is 1: raise pipeline_stages or "
          "leave pipeline_split empty.")
    where = ("1 layer index (where stage 2 starts)" if stages == 2 else
             f"{stages - 1} increasing layer indices separated by commas (where stages 2..{stages} start)")
    fix = f"give {where}, or leave it empty to give every stage the same number of layers."
    try:
        points = [int(p) for p in text.split(",")]
    except ValueError:
        raise ConfigError(f"memory.pipeline_split {text!r} is not a list of whole numbers: {fix}") from None
    check(len(points) == stages - 1, f"memory.pipeline_split {text!r} has {len(points)} split points; "
          f"{stages} pipeline stages need {stages - 1}: {fix}")
    check(points[0] >= 1 and all(a < b for a, b in zip(points, points[1:])),
          f"memory.pipeline_split {text!r} must be strictly increasing and start at 1 or more (layer 0, the "
          f"embedding, always opens stage 1): {fix}")
    return points


def gpu_count(nodes: int, per_node: int) -> str:
    """'4 GPUs', or '4 GPUs (2 nodes x 2)' for several nodes: how validation messages count."""
    total = f"{nodes * per_node} GPUs"
    return total if nodes <= 1 else f"{total} ({nodes} nodes x {per_node})"


# Names Windows reserves for devices, with or without an extension ("CON", "nul.txt", "COM1").
_RESERVED_RE = re.compile(r"^(CON|PRN|AUX|NUL|COM[0-9¹²³]|LPT[0-9¹²³])(\..*)?$", re.IGNORECASE)
_NOT_PORTABLE_RE = re.compile(r'[<>:"/\\|?*\x00-\x1f]')  # what Windows refuses in a file name (or splits at)
MAX_NAME_CHARS = 100


def invisible_characters(text: str) -> list[str]:
    """Control, format (bidi overrides such as U+202E) and line/paragraph separator characters in `text`,
    as U+XXXX: they hide or reorder what a name shows, or break it over lines."""
    return sorted({f"U+{ord(c):04X}" for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")})


def portable_name_problem(part: str) -> str:
    """Why `part` cannot be one folder or file name on every OS ComfyUI runs on; "" when it can."""
    if part in (".", ".."):
        return "names a folder ('.' this one, '..' the one above), not a new one"
    hidden = invisible_characters(part)
    if hidden:
        return f"contains the invisible or control character(s) {', '.join(hidden)}"
    bad = sorted(set(_NOT_PORTABLE_RE.findall(part)))
    if bad:
        return f"contains {' '.join(repr(c) for c in bad)}, not allowed in file names"
    if _RESERVED_RE.match(part):
        device = part.split(".")[0].upper()
        return ("is a device name Windows reserves" if device == part.upper() else
                f"starts with {device!r}, a device name Windows reserves (with any extension)")
    if part != part.rstrip(" ."):
        return "ends with a dot or a space, which Windows drops from file names"
    if len(part) > MAX_NAME_CHARS:
        return f"is {len(part)} characters long (at most {MAX_NAME_CHARS})"
    return ""


def check_run_name(name: str) -> None:
    """run_name becomes a folder under output/pipetrain/ on any OS: the ConfigError says what to change."""
    fix = "use ASCII letters, digits, '_', '-' or '.', starting with a letter or digit, e.g. 'my_lora'."
    check(bool(name.strip()), f"run_name is empty: {fix}")
    problem = portable_name_problem(name)
    check(not problem, f"run_name {name!r} {problem}: {fix}")
    check(RUN_NAME_RE.match(name) is not None, f"run_name {name!r} is not a plain folder name: {fix}")


def check_more_caches(cache_dir: str, more: tuple[str, ...]) -> None:
    """more_cache_dirs: the other chained datasets' caches, each once and none the first (pure: no file read)."""
    def key(path: str) -> str:
        return os.path.normcase(os.path.normpath(path))
    seen = {key(cache_dir)}
    for folder in more:
        check(bool(folder), "more_cache_dirs lists an empty path: remove it, or give the cache folder.")
        check(key(folder) not in seen, f"more_cache_dirs lists the cache {folder} twice (or it is cache_dir): list "
              "each chained dataset's cache once.")
        seen.add(key(folder))
