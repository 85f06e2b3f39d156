"""PipeTrain's out-of-place forwards ("fixes"), which ComfyUI versions each was written for, and
installing them onto ComfyUI's classes.

A fix is a set of replacements that only make sense together (Flux's block forwards inline the
semantics of the module-level apply_mod, so the three are swapped as one). Each says which
upstream release range it was written for; engine/patches/trainable.py tries only fixes whose
range holds the host's version, and admits one only after the probe saw it give upstream's own
forward output and correct gradients on the loaded model's blocks.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Callable

from .host import in_range

# Modules holding fixes; each defines FIXES (a tuple of Fix). The probe tries a class's fixes in this
# order, keeping each while it tries the next: a block-specific fix that is enough on its own comes
# before the comfy-kitchen backward (for any block), MiniMax's after it (its blocks need both).
_FIX_MODULES = ("flux", "ltxv", "ltxav", "pixeldit", "kitchen", "minimax")

# "<module>.<qualname>" -> (owner class or module, attribute name, upstream object)
_originals: dict[str, tuple[object, str, object]] = {}
_active: dict[str, "Fix"] = {}  # fix name -> fix, while installed


@dataclass(frozen=True)
class Fix:
    name: str                     # e.g. "flux-layers 0.33": shown in logs, kept in the verdict cache
    module: str                   # the upstream module whose attributes it replaces
    classes: tuple[str, ...]      # block classes (in `module`) it makes trainable; ("*",): any block
    replacements: dict[str, Callable] = field(hash=False)  # qualname in `module` -> our function
    since: str = "0.3.75"         # first ComfyUI release it was written for
    before: str | None = None     # first release it is NOT for (None: open-ended, the newest fix)
    # A fix that is not a swap of attributes (a backward formula registered with torch.library):
    apply: Callable[[], None] | None = field(default=None, hash=False)
    undo: Callable[[], None] | None = field(default=None, hash=False)

    def covers(self, cls: type) -> bool:
        return self.classes == ("*",) or (cls.__module__ == self.module and cls.__qualname__ in self.classes)

    def written_for(self, version: str) -> bool:
        return in_range(version, self.since, self.before)

    def range_text(self) -> str:
        return f"ComfyUI {self.since}" + (f" up to (not including) {self.before}" if self.before else " and later")


def all_fixes() -> list[Fix]:
    out = []
    for name in _FIX_MODULES:
        out.extend(importlib.import_module(f"{__package__}.{name}").FIXES)
    return out


def fixes_for(cls: type) -> list[Fix]:
    return [fix for fix in all_fixes() if fix.covers(cls)]


def _owner(module_name: str, qualname: str):
    *path, attr = qualname.split(".")
    owner = sys.modules.get(module_name) or importlib.import_module(module_name)
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def install(fix: Fix) -> None:
    """Swap the fix's functions onto ComfyUI (idempotent). Another fix of the same upstream names
    is taken out first: one version of a function at a time."""
    if fix.name in _active:
        return
    for other in list(_active.values()):
        if set(other.replacements) & set(fix.replacements) and other.module == fix.module:
            uninstall(other)
    if fix.apply is not None:
        fix.apply()
    for qualname, replacement in fix.replacements.items():
        full = f"{fix.module}.{qualname}"
        owner, attr = _owner(fix.module, qualname)
        if full not in _originals:
            _originals[full] = (owner, attr, getattr(owner, attr))
        setattr(owner, attr, replacement)
    _active[fix.name] = fix


def uninstall(fix: Fix) -> None:
    if _active.pop(fix.name, None) is None:
        return
    if fix.undo is not None:
        fix.undo()
    for qualname in fix.replacements:
        owner, attr, original = _originals.pop(f"{fix.module}.{qualname}")
        setattr(owner, attr, original)


def uninstall_all() -> None:
    """Put every replaced ComfyUI function back (the probe measures upstream; tests)."""
    for fix in list(_active.values()):
        uninstall(fix)


def active() -> list[Fix]:
    return list(_active.values())


def upstream_functions() -> set:
    """The upstream objects our installed fixes replaced (to spot wrappers that still call them)."""
    return {entry[2] for entry in _originals.values()}
