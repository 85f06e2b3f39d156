"""The one place where PipeTrain replaces ComfyUI code: out-of-place block forwards for training.

Eight families' blocks update the residual stream in place (Flux, Flux Kontext, Chroma, Flux2,
HunyuanVideo, HunyuanVideo-1.5, HunyuanImage-2.1 through comfy/ldm/flux/layers.py; LTXV through
comfy/ldm/lightricks/model.py). That is fine for sampling but breaks LoRA backward, breaks per-block
checkpointing, and for LTXV silently corrupts checkpointed gradients (MODEL-NOTES.md section 0).
engine/patches_flux.py and engine/patches_ltxv.py hold same-math, out-of-place copies.

A copy is only right while upstream's function is the one it was copied from, so each is pinned to
a sha256 of the upstream source. `install(strict=True)` refuses to swap anything if one changed;
`install(strict=False)` warns and swaps only the unchanged ones, so a newer ComfyUI still trains the
families whose blocks did not change, and `missing_patches(model)` says whether a model still runs
a changed, unpatched block (train it only after the copy is updated).

The engine's entry point is `ensure_patched(diffusion_model)`, called in each training process after
the model is built and BEFORE blocks are wrapped for activation checkpointing or block swap
(engine/memory.py binds each block's forward when it wraps it, so a later class patch never reaches
a wrapped block; ensure_patched refuses that order). The ComfyUI server process is never patched.
This module imports no ComfyUI code until a function is called.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
import warnings

WRITTEN_AGAINST = "0.3.75"  # the ComfyUI release the copies and digests come from
_FAMILY_MODULES = ("patches_flux", "patches_ltxv")

# "<module>.<qualname>" -> (owner class or module, attribute name, upstream function)
_originals: dict[str, tuple[object, str, object]] = {}


class UpstreamChanged(RuntimeError):
    """ComfyUI's source of a function PipeTrain replaces is not the one its copy was made from."""


def text_digest(source: str) -> str:
    """sha256 of source text with all whitespace runs collapsed to one space (re-indenting, blank
    lines and re-wrapping are not changes; any other edit, comments included, is)."""
    return hashlib.sha256(" ".join(source.split()).encode("utf-8")).hexdigest()


def source_digest(fn) -> str:
    return text_digest(inspect.getsource(fn))


def comfy_version() -> str:
    try:
        return importlib.import_module("comfyui_version").__version__
    except Exception:  # noqa: BLE001 - a ComfyUI without the version file is still usable
        return "(unknown version)"


def _change_message(qualname: str, families: str) -> str:
    return (f"ComfyUI changed {qualname}; PipeTrain's out-of-place copy must be updated before training "
            f"this family ({families}). PipeTrain's copy was written against ComfyUI {WRITTEN_AGAINST}; "
            f"this is ComfyUI {comfy_version()}. Use ComfyUI {WRITTEN_AGAINST}'s version of that function, "
            f"or update PipeTrain (engine/patches_*.py and its digest). If another custom node replaced "
            f"the function, disable that node for training.")


def check_source(fn, expected_sha256: str, qualname: str, families: str = "the families that use it") -> None:
    """Raise UpstreamChanged (naming `qualname`) unless `fn`'s source hashes to `expected_sha256`."""
    try:
        digest = source_digest(fn)
    except (OSError, TypeError):  # no .py source to read (frozen or compiled install)
        digest = None
    if digest != expected_sha256:
        raise UpstreamChanged(_change_message(qualname, families))


def _families():
    return [importlib.import_module(f"{__package__}.{name}") for name in _FAMILY_MODULES]


def _owner(module_name: str, qualname: str):
    """(object holding the attribute, attribute name) for e.g. 'DoubleStreamBlock.forward'."""
    *path, attr = qualname.split(".")
    owner = sys.modules.get(module_name) or importlib.import_module(module_name)
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def _upstream(module_name: str, qualname: str):
    key = f"{module_name}.{qualname}"
    if key in _originals:  # installed: check what we replaced, not our own copy
        return _originals[key][2]
    owner, attr = _owner(module_name, qualname)
    return getattr(owner, attr)


def check_upstream(strict: bool = True) -> list[str]:
    """Full names of the replaced functions whose upstream source changed.

    strict: raise UpstreamChanged naming every changed function. Otherwise warn once per function
    and return them (the engine then trains only families that need none of them).
    """
    changed, messages = [], []
    for fam in _families():
        for qualname, expected in fam.UPSTREAM_SHA256.items():
            full = f"{fam.MODULE}.{qualname}"
            try:
                check_source(_upstream(fam.MODULE, qualname), expected, full, fam.FAMILIES)
            except UpstreamChanged as exc:
                changed.append(full)
                messages.append(str(exc))
            except (AttributeError, ImportError):  # upstream removed or renamed it
                changed.append(full)
                messages.append(_change_message(full, fam.FAMILIES) + " (it no longer exists)")
    if messages and strict:
        raise UpstreamChanged("\n".join(messages))
    for message in messages:
        warnings.warn(message, stacklevel=2)
    return changed


def install(strict: bool = True) -> list[str]:
    """Swap the out-of-place forwards onto ComfyUI's classes; return the full names now installed.

    Idempotent. strict: if any upstream source changed, raise before swapping anything. Otherwise
    skip (never apply) each copy whose upstream changed, and warn.
    """
    changed = set(check_upstream(strict))
    for fam in _families():
        for qualname, (replacement, copied_from) in fam.REPLACEMENTS.items():
            full = f"{fam.MODULE}.{qualname}"
            if full in _originals or any(f"{fam.MODULE}.{q}" in changed for q in copied_from):
                continue
            owner, attr = _owner(fam.MODULE, qualname)
            _originals[full] = (owner, attr, getattr(owner, attr))
            setattr(owner, attr, replacement)
    return installed()


def uninstall() -> None:
    """Put every replaced ComfyUI function back (tests; a process that samples afterwards)."""
    while _originals:
        _, (owner, attr, original) = _originals.popitem()
        setattr(owner, attr, original)


def installed() -> list[str]:
    return sorted(_originals)


def _affected(diffusion_model) -> list[str]:
    """Full names of the replaced functions a model runs, from the block classes it contains."""
    classes = {}
    for fam in _families():
        module = sys.modules.get(fam.MODULE)
        for name in fam.BLOCK_CLASSES:
            cls = getattr(module, name, None)
            if cls is not None:  # the class's own methods plus the helpers their copies inline
                classes[cls] = {f"{fam.MODULE}.{q}" for method, (_, copied_from) in fam.REPLACEMENTS.items()
                                if method.startswith(name + ".") for q in copied_from}
    found = set()
    for module in diffusion_model.modules():
        for cls, names in classes.items():
            if isinstance(module, cls):  # subclasses inherit the in-place forward
                found.update(names)
    return sorted(found)


def _underlying(fn):
    # Through functools.wraps layers (engine/memory.py's checkpoint wrapper) to the plain function.
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return getattr(fn, "__func__", fn)


def stale_blocks(diffusion_model) -> list[str]:
    """Modules whose instance-level forward (a checkpoint or block-swap wrapper made before
    install()) still calls a replaced upstream function: the class patch never reaches them."""
    originals = {entry[2] for entry in _originals.values()}
    return [name for name, module in diffusion_model.named_modules()
            if "forward" in vars(module) and _underlying(vars(module)["forward"]) in originals]


def needs_patch(diffusion_model) -> bool:
    """Whether the model contains a block class that updates its residual stream in place."""
    return bool(_affected(diffusion_model))


def missing_patches(diffusion_model) -> list[str]:
    """Replaced functions this model runs that are not installed (empty: safe to train)."""
    return [name for name in _affected(diffusion_model) if name not in _originals]


def ensure_patched(diffusion_model) -> list[str]:
    """The engine's one call before wrapping blocks: install every copy this ComfyUI allows, and
    raise UpstreamChanged, naming each function, if this model would still run an in-place block
    whose copy had to be skipped. Models without such blocks install nothing. Returns installed().

    Every model's blocks also get engine/patches_guard.py's one-shot check, which stops training
    with a clear error if a block PipeTrain has no copy of (a newer ComfyUI's) writes into its input.
    """
    from .patches_guard import guard_blocks

    guard_blocks(diffusion_model)
    if not needs_patch(diffusion_model):
        return installed()
    install(strict=False)
    missing = missing_patches(diffusion_model)
    if missing:
        families = {f"{fam.MODULE}.{q}": fam.FAMILIES for fam in _families() for q in fam.UPSTREAM_SHA256}
        raise UpstreamChanged("\n".join(_change_message(name, families[name]) for name in missing))
    stale = stale_blocks(diffusion_model)
    if stale:
        raise RuntimeError(f"{len(stale)} blocks (first: {stale[0]}) were wrapped before PipeTrain's out-of-place "
                           "forwards were installed and would still run ComfyUI's in-place forward; call "
                           "engine.patches.ensure_patched before activation checkpointing or block swap.")
    return installed()
