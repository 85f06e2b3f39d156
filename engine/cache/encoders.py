"""A cheap, stable identity for ComfyUI's VAE and CLIP objects; part of the cache fingerprint.

Why a sample is enough: the identity only has to tell "the same encoder as last time" from "a
different one". Different checkpoints, fine-tunes and merges differ in practically every
tensor, so the first 256 values of 16 tensors spread over the state dict (plus the class names,
the parameter count and every key/shape) separate them; hashing all weights of a 5B text
encoder would instead cost seconds of GPU->CPU copies on every run. An edit that touches only
unsampled tensors is the one miss; `regenerate` on CacheLatents covers it.

LoRA patches on CLIP are not in the weights until ComfyUI loads the model, so they are hashed
separately, and patched weights are sampled from ComfyUI's backup of the originals: the
identity is the same whether or not the model happens to be loaded (patched) right now.

The CacheLatents node and the engine's cache mode (engine/cache/cli.py) both use it, so a cache
written by either is found by the other for the same encoder files.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from .first_frame import DEFAULT_STYLE
from .items import CONTROL_STYLES

SAMPLED_TENSORS = 16
SAMPLED_VALUES = 256


def _spread(keys: list[str], n: int) -> list[str]:
    """n keys evenly spaced over the sorted list (not the first n: those are all one block)."""
    if len(keys) <= n:
        return keys
    return [keys[round(i * (len(keys) - 1) / (n - 1))] for i in range(n)]


def _digest_tensor(h: "hashlib._Hash", t: torch.Tensor) -> None:
    h.update(f"{tuple(t.shape)}|{t.dtype}|".encode())
    if t.device.type == "meta":
        return
    try:
        values = t.detach().reshape(-1)[:SAMPLED_VALUES].to("cpu", torch.float32)
    except (RuntimeError, TypeError, NotImplementedError):  # exotic quantized layouts: shape only
        return
    h.update(values.numpy().tobytes())


def _digest_obj(h: "hashlib._Hash", obj: Any, depth: int = 0) -> None:
    """Digest a patch structure (tuples of strengths, tensors, LoRA adapter objects)."""
    if depth > 6:
        return
    if isinstance(obj, torch.Tensor):
        _digest_tensor(h, obj)
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        h.update(repr(obj).encode())
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for o in obj:
            _digest_obj(h, o, depth + 1)
        h.update(b"]")
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(str(k).encode())
            _digest_obj(h, obj[k], depth + 1)
    else:
        h.update(type(obj).__name__.encode())
        if hasattr(obj, "weights"):  # comfy.weight_adapter adapters keep their tensors here
            _digest_obj(h, getattr(obj, "weights"), depth + 1)


def module_identity(module: torch.nn.Module, patcher: Any = None) -> dict[str, Any]:
    """Class name, parameter count and a sampled-values hash of one torch module."""
    sd = module.state_dict()
    keys = sorted(sd)
    backup = getattr(patcher, "backup", None) or {}
    h = hashlib.sha256()
    for k in keys:  # every name and shape: catches architecture differences at no cost
        h.update(f"{k}:{tuple(sd[k].shape)};".encode())
    for k in _spread(keys, SAMPLED_TENSORS):
        original = backup[k].weight if k in backup else sd[k]
        h.update(k.encode())
        _digest_tensor(h, original)
    params = sum(t.numel() for t in sd.values())
    return {"class": type(module).__name__, "params": int(params), "sample_sha256": h.hexdigest()}


def _patches_identity(patcher: Any) -> str:
    patches = getattr(patcher, "patches", None) or {}
    if not patches:
        return ""
    h = hashlib.sha256()
    keys = sorted(patches)
    h.update("\0".join(keys).encode())
    for k in _spread(keys, SAMPLED_TENSORS):
        _digest_obj(h, patches[k])
    return h.hexdigest()


def vae_identity(vae: Any) -> dict[str, Any]:
    return module_identity(vae.first_stage_model, getattr(vae, "patcher", None))


def clip_identity(clip: Any) -> dict[str, Any]:
    patcher = getattr(clip, "patcher", None)
    ident = module_identity(clip.cond_stage_model, patcher)
    ident["tokenizer"] = type(clip.tokenizer).__name__
    ident["layer_idx"] = getattr(clip, "layer_idx", None)  # CLIPSetLastLayer changes the output
    options = getattr(clip, "tokenizer_options", None) or {}
    ident["tokenizer_options"] = json.dumps(options, sort_keys=True, default=str)
    ident["patches_sha256"] = _patches_identity(patcher)
    return ident


def encoder_identity(vae: Any, clip: Any) -> dict[str, Any]:
    """JSON-able identity of the pair, stored in the manifest and hashed into the fingerprint."""
    return {"vae": vae_identity(vae), "clip": clip_identity(clip)}


def clip_vision_identity(clip_vision: Any, crop: bool = True) -> dict[str, Any]:
    """A ComfyUI CLIP_VISION (comfy.clip_vision.ClipVisionModel): its weights, preprocessing and crop."""
    ident = module_identity(clip_vision.model, getattr(clip_vision, "patcher", None))
    ident["image_size"] = getattr(clip_vision, "image_size", None)
    ident["image_mean"] = list(getattr(clip_vision, "image_mean", None) or [])
    ident["image_std"] = list(getattr(clip_vision, "image_std", None) or [])
    ident["crop"] = bool(crop)
    return ident


def cache_identity(vae: Any, clip: Any, options: Any = None) -> dict[str, Any]:
    """encoder_identity plus the caching options that change what is stored (part of the fingerprint).
    options: cache_items.ItemOptions (None = all defaults). Options left at their defaults add
    nothing, so caches made before an option existed still match."""
    identity = encoder_identity(vae, clip)
    if options is None:
        return identity
    if options.first_frame:  # such a cache holds more tensors
        identity["first_frame_conditioning"] = True
        if options.first_frame != DEFAULT_STYLE:  # the only style before styles existed adds no key
            identity["first_frame_style"] = options.first_frame
    if options.clip_vision is not None:  # and so does one with each item's CLIP-vision encoding
        identity["clip_vision"] = clip_vision_identity(options.clip_vision, options.clip_vision_crop)
    if options.audio_vae is not None:  # each item is the packed video + audio latent
        identity["audio_vae"] = vae_identity(options.audio_vae)
    if options.control_style != CONTROL_STYLES[0]:  # control images stored under another key
        identity["control_style"] = options.control_style
    return identity


def identity_text(identity: dict[str, Any]) -> str:
    """An identity as one canonical JSON string (CacheConfig.expect_identity: what the ranks must find)."""
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
