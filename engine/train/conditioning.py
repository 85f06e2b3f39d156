"""A cached item's conditioning -> the keyword arguments ComfyUI's `model.extra_conds` takes.

The cache holds, per item, the dict that CLIPTextEncode and ComfyUI's conditioning nodes build
(`cross_attn` plus extras under ComfyUI's own names: pooled_output, guidance, reference_latents,
concat_latent_image, concat_mask, clip_vision_output, attention_mask, ...), with the batch dim of 1
removed from every tensor. ComfyUI's extra_conds expects them as the sampler passes them: batched
tensors, `reference_latents` as a list of latents, `clip_vision_output` as an object with
attributes (comfy.clip_vision.Output). This module restores that shape, whatever of these
equivalent encodings a cache writer used:

    reference_latents            list/tuple of tensors | one tensor | flat keys reference_latents.0, .1, ...
    clip_vision_output           an object with attributes | {attr: tensor} | flat keys clip_vision_output.<attr>
    any other tensor             [..] unbatched (gets a leading 1) or listed in the item's `unbatched`

A tensor is re-batched when it has one dim fewer than the value ComfyUI expects; latents in lists
are compared with the training latent's rank (reference latents are raw VAE output, the model's
extra_conds applies process_latent_in to them itself).
"""
from __future__ import annotations

import re
from typing import Any

import torch

LIST_KEYS = ("reference_latents",)  # ComfyUI conditioning values that are lists of latents
OBJECT_KEYS = ("clip_vision_output",)  # values ComfyUI reads by attribute
_FLAT = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)\.(?P<part>[A-Za-z0-9_]+)$")


class _Attrs:
    """Attribute access over cached tensors, like comfy.clip_vision.Output."""

    def __init__(self, values: dict[str, Any]):
        self.__dict__.update(values)

    def __getitem__(self, key):
        return getattr(self, key)

    def __contains__(self, key):
        return key in self.__dict__


def _batched(value: Any, latent_ndim: int | None = None) -> Any:
    if not torch.is_tensor(value):
        return value
    if latent_ndim is not None:  # a latent: [C, ...] unbatched vs the [B, C, ...] training latent
        return value.unsqueeze(0) if value.ndim == latent_ndim - 1 else value
    return value.unsqueeze(0)


def _group_flat(extras: dict[str, Any]) -> dict[str, Any]:
    """Fold flat `key.part` entries (how a tensor-only file stores lists and objects) back together."""
    out: dict[str, Any] = {}
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in extras.items():
        m = _FLAT.match(key)
        if m and (m["key"] in LIST_KEYS or m["key"] in OBJECT_KEYS):
            grouped.setdefault(m["key"], {})[m["part"]] = value
        else:
            out[key] = value
    for key, parts in grouped.items():
        if key in LIST_KEYS:
            out[key] = [parts[p] for p in sorted(parts, key=lambda p: int(p) if p.isdigit() else p)]
        else:
            out[key] = parts
    return out


def extra_conds_params(cond: dict[str, Any], latent_ndim: int) -> dict[str, Any]:
    """The cached conditioning of one item as extra_conds keyword arguments (batch of 1).

    cond: {"cross_attn": [T, D], "extras": {...}, optionally "unbatched": (keys stored as-is)}.
    latent_ndim: ndim of the batched training latent (4 for images, 5 for video).
    """
    unbatched = set(cond.get("unbatched", ()))
    params: dict[str, Any] = {}
    for key, value in _group_flat(dict(cond.get("extras", {}))).items():
        if key in unbatched:
            params[key] = value
        elif key in LIST_KEYS:
            items = list(value) if isinstance(value, (list, tuple)) else [value]
            params[key] = [_batched(v, latent_ndim) for v in items]
        elif key in OBJECT_KEYS and isinstance(value, dict):
            params[key] = _Attrs({k: _batched(v) for k, v in value.items()})
        else:
            params[key] = _batched(value)
    params["cross_attn"] = _batched(cond["cross_attn"])
    return params
