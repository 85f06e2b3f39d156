"""Reference latents (ReferenceLatent: Flux Kontext, Flux.2, Qwen-Image-Edit): the rules flux_family.py
and qwen_image.py (and, for the marker, hunyuan_video.py) share.

The reference method crosses to the first stage as a one-element code tensor (method_code), the
method ComfyUI 0.33 added with a zero timestep for the references is refused (refuse_method), the
"offset" layout places each reference on one canvas (offset_place), and a marker tensor's width tells
later stages how many reference tokens follow the target's (marker), so no integer crosses a stage.
"""
from __future__ import annotations

import torch

from ..config.checks import ConfigError

# ComfyUI 0.33+: per-token-range modulation of the references (a second, zero timestep)
REFUSED_METHODS = ("index_timestep_zero",)


def refuse_method(method, family: str) -> None:
    """A ConfigError for a reference method the adapters do not reproduce."""
    if method in REFUSED_METHODS:
        from ..patches.host import comfy_version

        raise ConfigError(f"pipeline_stages > 1 for {family} does not reproduce the reference method {method!r} "
                          f"of ComfyUI {comfy_version()} (a zero timestep for the reference tokens). Set "
                          "pipeline_stages to 1 for this model, or use another reference_latents_method.")


def method_code(method, names: tuple[str, ...], device) -> torch.Tensor:
    """The conditioning's ref_latents_method as a first-stage input: [-1] when it has none (the model's
    default), else its place in `names`; a name ComfyUI does not know counts as names[0], the offset
    layout (ComfyUI's forward treats unknown names so)."""
    code = -1 if method is None else names.index(method) if method in names else 0
    return torch.tensor([code], device=device)


def code_of(t: torch.Tensor) -> int:
    """method_code's value back as an int."""
    return int(t.reshape(-1)[0])


def offset_place(ref, h: int, w: int) -> tuple[int, int, int, int]:
    """The "offset" layout of a reference loop: each reference goes right of or below the ones before
    it, whichever keeps the canvas (h x w so far) squarer. (h_offset, w_offset, h, w) after it."""
    h_offset = w_offset = 0
    if ref.shape[-2] + h > ref.shape[-1] + w:
        w_offset = w
    else:
        h_offset = h
    return h_offset, w_offset, max(h, ref.shape[-2] + h_offset), max(w, ref.shape[-1] + w_offset)


def marker(xt, tokens: int) -> torch.Tensor:
    """A [B, 1 + tokens] float tensor whose width tells later stages how many reference tokens there are
    (its values are unused)."""
    return torch.zeros((xt.shape[0], 1 + tokens), device=xt.device, dtype=torch.float32)
