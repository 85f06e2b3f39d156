"""The adapter kinds PipeTrain trains (lora.kind): peft's config for each, which parameters are the trained
ones, and the conversion between peft's tensors and ComfyUI's key format (comfy/weight_adapter/).

Per adapted layer <path> (ComfyUI key prefix diffusion_model.<path>; peft's tensors are named
<path>.<attribute>.default[.weight]):
    lora  lora_A.weight [r, in], lora_B.weight [out, r], alpha (only when alpha != rank)
          delta = alpha / r * B @ A (the same in peft and ComfyUI)
    loha  hada_w1_a [out, r], hada_w1_b [r, in], hada_w2_a, hada_w2_b, alpha
          delta = alpha / r * (w1_a @ w1_b) * (w2_a @ w2_b) (the same in both)
    lokr  lokr_w1 [a, c] and lokr_w2 [b, d] or its factors lokr_w2_a [b, r] / lokr_w2_b [r, d], alpha
          delta = kron(w1, w2) (out = a*b, in = c*d, w1 first in both) scaled by alpha / r in peft. ComfyUI
          scales by alpha / r only where a factor is decomposed and by 1 where both are full matrices, so
          such a layer's lokr_w2 is saved with alpha / r already in it.
    dora  lora_A.weight, lora_B.weight, alpha, dora_scale [out, 1]
          peft: W' = m / ||W + delta|| * (W + delta), the norm per output row, m = lora_magnitude_vector [out].
          ComfyUI's weight_decompose, for a dora_scale of `out` rows, divides by (||W|| + eps), the norm of
          the base weight (0.3.75 and 0.33 alike); the file holds m * (||W|| + eps) / ||W + delta||, so
          ComfyUI applies the trained weight. Saving and loading back need the base weights.
"""
from __future__ import annotations

import functools
import re
from typing import Callable

import torch
from torch import nn

from ..config.checks import ConfigError
from ..config.sections import LoraSpec
from ..linear_layers import float_weight
from ..patches.peft import ADAPTER

KEY_PREFIX = "diffusion_model."
_MAGNITUDE = "lora_magnitude_vector"
_EPS = torch.finfo(torch.float32).eps  # ComfyUI patches weights in float32 and adds this to the norm

# What a file of each kind holds (its keys end so), to tell the kinds apart when one is read back.
_FILE_MARKS = (("dora", ".dora_scale"), ("loha", ".hada_w1_a"), ("lokr", ".lokr_w1"), ("lokr", ".lokr_w1_a"),
               ("lora", ".lora_A.weight"), ("lora", ".lora_down.weight"))


def peft_config(spec: LoraSpec, target_modules: str):
    """peft's config for spec.kind on the modules the pattern full-matches."""
    common = dict(r=spec.rank, target_modules=target_modules)
    if spec.kind in ("lora", "dora"):
        from peft import LoraConfig

        return LoraConfig(lora_alpha=spec.effective_alpha, lora_dropout=spec.dropout, init_lora_weights=True,
                          use_dora=spec.kind == "dora", **common)
    if spec.kind == "loha":
        from peft import LoHaConfig

        return LoHaConfig(alpha=spec.effective_alpha, init_weights=True, **common)
    if spec.kind == "lokr":
        from peft import LoKrConfig

        return LoKrConfig(alpha=spec.effective_alpha, init_weights=True, decompose_factor=spec.lokr_factor, **common)
    raise ConfigError(f"lora.kind is {spec.kind!r}: choose lora, loha, lokr or dora.")


def wrap_like_linear(config, spec: LoraSpec, layer_types: set[type]) -> None:
    """Tell peft to give `layer_types` (linear layers that are not nn.Linear: ComfyUI's quantized Linear) its
    own LoRA Linear, which calls the layer and adds the adapter. LoRA and DoRA (which reads a dequantized copy
    of the weight: patches/peft.py): LoHa and LoKr read the base weight as a plain tensor."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    if spec.kind not in ("lora", "dora"):
        raise ConfigError(f"lora.kind {spec.kind!r} on a quantized model file: its layers hold quantized weights "
                          "(ComfyUI's mixed-precision format), which only a LoRA or DoRA trains on. Choose adapter "
                          "'lora' or 'dora', or train on the full-precision file.")
    config._register_custom_module({t: LoraLinear for t in layer_types})


@functools.cache
def _adapter_pattern() -> re.Pattern:
    """'.<attribute>.default' for every attribute peft keeps adapter weights in (its layers' own lists)."""
    from peft.tuners.loha.layer import LoHaLayer
    from peft.tuners.lokr.layer import LoKrLayer
    from peft.tuners.lora.layer import LoraLayer

    names = dict.fromkeys(LoraLayer.adapter_layer_names + (_MAGNITUDE,) + LoHaLayer.adapter_layer_names
                          + LoKrLayer.adapter_layer_names)
    return re.compile(r"\.(?:" + "|".join(names) + rf")\.{ADAPTER}(?:\.|$)")


def is_adapter_param(name: str) -> bool:
    """True for the trained adapter weights of every kind ('blocks.0.attn.q.lora_A.default.weight',
    '....hada_w1_a.default', '....lora_magnitude_vector.default.weight'): the one test the engine uses."""
    return _adapter_pattern().search(name) is not None


_ADAPTER_PART = re.compile(rf"\.{ADAPTER}(?=\.|$)")


def _split(name: str) -> tuple[str, str]:
    """'blocks.0.q.lora_A.default.weight' -> ('blocks.0.q', 'lora_A'); '....hada_w1_a.default' -> (..., 'hada_w1_a')."""
    head = _ADAPTER_PART.split(name, maxsplit=1)[0]
    path, _, attribute = head.rpartition(".")
    return path, attribute


def comfy_key(name: str) -> str:
    """peft's tensor name -> the key ComfyUI's loader reads it by (DoRA's magnitude: its dora_scale)."""
    path, attribute = _split(name)
    if attribute == _MAGNITUDE:
        return f"{KEY_PREFIX}{path}.dora_scale"
    return KEY_PREFIX + _ADAPTER_PART.sub("", name, count=1)


def file_kind(keys) -> str | None:
    """The adapter kind of a file by its keys (None: no kind PipeTrain knows)."""
    keys = list(keys)
    for kind, mark in _FILE_MARKS:
        if any(k.endswith(mark) for k in keys):
            return kind
    return None


def _by_layer(named: dict[str, torch.Tensor]) -> dict[str, dict[str, str]]:
    layers: dict[str, dict[str, str]] = {}
    for name in named:
        path, attribute = _split(name)
        layers.setdefault(path, {})[attribute] = name
    return layers


def _lokr_full(attributes: dict[str, str]) -> bool:
    """Both LoKr factors full matrices: ComfyUI applies no alpha / r to such a layer."""
    return "lokr_w1" in attributes and "lokr_w2" in attributes


def _dora_norms(named: dict[str, torch.Tensor], attributes: dict[str, str], weight: torch.Tensor,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(||W|| + eps, ||W + delta||) per output row, float32 [out], from the base weight and the LoRA factors."""
    w = float_weight(weight).to("cpu").reshape(weight.shape[0], -1)
    a, b = (named[attributes[k]].to("cpu", torch.float32) for k in ("lora_A", "lora_B"))
    base = w.norm(dim=1) + _EPS
    return base, (w + scale * (b @ a)).norm(dim=1)


def _fits(tensors: dict[str, torch.Tensor], attributes: dict[str, str], weight: torch.Tensor) -> bool:
    """The file's DoRA factors fit this layer (else the caller reports the shapes)."""
    a, b = (tensors.get(attributes.get(k, "")) for k in ("lora_A", "lora_B"))
    return (a is not None and b is not None and a.dim() == b.dim() == 2 and b.shape[1] == a.shape[0]
            and (b.shape[0], a.shape[1]) == tuple(weight.reshape(weight.shape[0], -1).shape))


BaseWeight = Callable[[str], torch.Tensor]


def base_weights(diffusion_model: nn.Module) -> BaseWeight:
    """Module path -> the frozen base weight of that adapted layer."""
    return lambda path: diffusion_model.get_submodule(path).get_base_layer().weight


def to_comfy(named: dict[str, torch.Tensor], spec: LoraSpec, base: BaseWeight | None = None) -> dict[str, torch.Tensor]:
    """Trained tensors by peft name -> ComfyUI's keys for spec.kind. DoRA needs `base` (base_weights(model))."""
    scale = spec.effective_alpha / spec.rank
    if spec.kind == "lora":  # the format of PipeTrain's first files: alpha only when it is not the rank
        out = {comfy_key(n): t for n, t in named.items()}
        if spec.effective_alpha != spec.rank:
            for key in [k for k in out if k.endswith(".lora_A.weight")]:
                out[key[: -len(".lora_A.weight")] + ".alpha"] = torch.tensor(spec.effective_alpha)
        return out
    if spec.kind == "dora" and base is None:
        raise ValueError("saving a DoRA needs the base model's weights (pass base_weights(diffusion_model))")
    out = {}
    for path, attributes in _by_layer(named).items():
        for attribute, name in attributes.items():
            tensor = named[name]
            if attribute == _MAGNITUDE:
                base_norm, norm = _dora_norms(named, attributes, base(path), scale)
                tensor = (tensor.to("cpu", torch.float32) * base_norm / norm).to(tensor.dtype).reshape(-1, 1)
            elif attribute == "lokr_w2" and _lokr_full(attributes):
                tensor = tensor * scale
            out[comfy_key(name)] = tensor.contiguous()
        out[f"{KEY_PREFIX}{path}.alpha"] = torch.tensor(spec.effective_alpha)
    return out


def from_comfy(saved: dict[str, torch.Tensor], names: list[str], spec: LoraSpec, base: BaseWeight,
               source: str) -> dict[str, torch.Tensor]:
    """The inverse of to_comfy for the adapter tensors `names` (peft names) a file has: {peft name: tensor}.
    Refuses a file of another kind than spec.kind."""
    found = file_kind(saved)
    if found is not None and found != spec.kind:
        raise ConfigError(f"starting LoRA {source} is a {found} file but the adapter kind is {spec.kind}: set the "
                          f"adapter to {found} to continue it, or start from 'none'.")
    scale = spec.effective_alpha / spec.rank
    layers = _by_layer(dict.fromkeys(names))
    out: dict[str, torch.Tensor] = {}
    for path, attributes in layers.items():
        for attribute, name in attributes.items():
            key = comfy_key(name)
            if key not in saved:
                continue
            tensor = saved[key]
            if attribute == "lokr_w2" and _lokr_full(attributes):
                tensor = tensor / scale
            out[name] = tensor
        magnitude = attributes.get(_MAGNITUDE)
        if magnitude in out and _fits(out, attributes, base(path)):
            base_norm, norm = _dora_norms(out, attributes, base(path), scale)
            out[magnitude] = out[magnitude].to(torch.float32).reshape(-1) * norm / base_norm
    return out
