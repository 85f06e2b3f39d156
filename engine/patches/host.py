"""What the host ComfyUI is: its version, and its training switch.

Newer ComfyUI (0.33 and later) picks fused comfy-kitchen kernels that have no backward (rope,
RMSNorm + adaLN) unless `comfy.model_management.in_training` is set; its own training node sets it
around the training loop. Every PipeTrain training process sets it once, at start, and keeps it
for the whole process, sample rendering included: the samples then come from the same math that is
being trained (the fused kernels differ from it by rounding only; docs/comfyui-versions.md).
"""
from __future__ import annotations

import importlib
import re


def comfy_version() -> str:
    """The host's `comfyui_version.__version__`, or '(unknown version)'."""
    try:
        return importlib.import_module("comfyui_version").__version__
    except Exception:  # noqa: BLE001 - a ComfyUI without the version file is still usable
        return "(unknown version)"


def version_key(version: str) -> tuple[int, ...]:
    """'0.3.75' -> (0, 3, 75); anything unparsable sorts after every release (treated as newest)."""
    parts = re.findall(r"\d+", version.split("+")[0].split("-")[0])
    return tuple(int(p) for p in parts[:3]) if parts else (1 << 30,)


def in_range(version: str, since: str, before: str | None) -> bool:
    """since <= version < before (before None: no upper end)."""
    key = version_key(version)
    return version_key(since) <= key and (before is None or key < version_key(before))


def set_training_mode(on: bool = True) -> bool:
    """Set the host's training flag where it has one; returns whether it has one."""
    import comfy.model_management as mm

    if not hasattr(mm, "in_training"):
        return False
    mm.in_training = bool(on)
    return True


def training_mode() -> bool | None:
    """The host's training flag, or None where the host has none (ComfyUI 0.3.x)."""
    import comfy.model_management as mm

    value = getattr(mm, "in_training", None)
    return None if value is None else bool(value)
