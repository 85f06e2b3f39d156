"""LoRA on ComfyUI's diffusion modules: which layers, injecting peft adapters, and file I/O.

Files use ComfyUI's key format so its stock LoRA loader applies them; for the default kind (lora):
    diffusion_model.<module path>.lora_A.weight   [rank, in]
    diffusion_model.<module path>.lora_B.weight   [out, rank]
    diffusion_model.<module path>.alpha           scalar, only when alpha != rank
The other kinds (LoHa, LoKr, DoRA: lora.kind) and their formats are in engine/train/adapter_kinds.py; the
functions here serve every kind.
"""
from __future__ import annotations

import os
import re

import torch
from torch import nn

from ..atomic_files import write_safetensors
from ..linear_layers import is_linear, other_linear_types
from ..config.checks import ConfigError
from ..config.sections import LoraSpec
from ..memory.blocks import block_roots
from ..patches.peft import compute_in_activation_dtype, dora_reads_float_weights
from . import adapter_kinds
from .adapter_kinds import is_adapter_param

_ATTENTION = re.compile(r"attn|attention", re.IGNORECASE)
_MLP = re.compile(r"^(.*_)?(mlp|ff|ffn|feed_forward|feedforward)(_.*)?$", re.IGNORECASE)
# Single-stream blocks (Flux, Chroma, Hunyuan) fuse q/k/v + MLP-in into `linear1` and the attention
# output + MLP-out into `linear2`: they are the attention layers of those blocks.
_FUSED_ATTENTION = re.compile(r"^linear[12]$")


def select_lora_targets(diffusion_model: nn.Module, spec: LoraSpec) -> list[str]:
    """Module paths (relative to the diffusion model) of the linear layers that get a LoRA."""
    roots = tuple(r + "." for r in block_roots(diffusion_model))
    regex = re.compile(spec.target_regex) if spec.target_regex else None
    targets = []
    for name, module in diffusion_model.named_modules():
        if not is_linear(module) or not name.startswith(roots):
            continue
        parts = name.split(".")
        is_attention = any(_ATTENTION.search(p) for p in parts) or (
            bool(_FUSED_ATTENTION.match(parts[-1])) and any("single" in p for p in parts))
        is_mlp = any(_MLP.match(p) for p in parts)
        if spec.targets == "attention" and not is_attention:
            continue
        if spec.targets == "attention_mlp" and not (is_attention or is_mlp):
            continue
        if regex is not None and not regex.search(name):
            continue
        targets.append(name)
    if not targets:
        raise ConfigError(
            f"LoRA target preset {spec.targets!r}"
            + (f" with regex {spec.target_regex!r}" if spec.target_regex else "")
            + " matched no linear layer in this model's blocks. Choose 'all_linear' or loosen the regex.")
    return targets


def inject_lora(diffusion_model: nn.Module, spec: LoraSpec) -> list[str]:
    """Add trainable peft adapters of spec.kind in place; freeze everything else. Returns the targets."""
    from peft import inject_adapter_in_model

    targets = select_lora_targets(diffusion_model, spec)
    diffusion_model.requires_grad_(False)
    # A list would also match every module whose path merely ends with a target's (peft's suffix rule:
    # MiniMax H3's `token_refiner.blocks.0.attn.qkv_proj` for `blocks.0.attn.qkv_proj`); a pattern
    # peft full-matches names exactly these paths.
    exact = "|".join(re.escape(t) for t in targets)
    config = adapter_kinds.peft_config(spec, f"(?:{exact})")
    quantized = other_linear_types(diffusion_model.get_submodule(t) for t in targets)
    if quantized:  # a quantized file's layers (ComfyUI 0.33+): peft wraps them as it wraps nn.Linear
        adapter_kinds.wrap_like_linear(config, spec, quantized)
    if spec.kind == "dora":  # fp8 or quantized base weights: DoRA's norms read float32 copies of them
        dora_reads_float_weights()
    inject_adapter_in_model(config, diffusion_model, adapter_name=adapter_kinds.ADAPTER)
    dtype = torch.bfloat16 if spec.dtype == "bfloat16" else torch.float32
    for name, param in diffusion_model.named_parameters():
        if is_adapter_param(name):
            param.data = param.data.to(dtype)
            param.requires_grad_(True)
    compute_in_activation_dtype(diffusion_model)
    if spec.init_from:
        load_lora_into(diffusion_model, spec.init_from, spec)
    return targets


def lora_parameters(diffusion_model: nn.Module) -> list[nn.Parameter]:
    return [p for n, p in diffusion_model.named_parameters() if is_adapter_param(n)]


def trained_parameters(diffusion_model: nn.Module, spec: LoraSpec) -> dict[str, nn.Parameter]:
    """The weights a run trains, by name: the adapters of every LoRA kind, or for kind full the block weights
    engine/train/full_tune.py left trainable."""
    if spec.kind == "full":
        return {n: p for n, p in diffusion_model.named_parameters() if p.requires_grad}
    return {n: p for n, p in diffusion_model.named_parameters() if is_adapter_param(n)}


def lora_tensors(diffusion_model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter parameters by their (peft) module path, as contiguous CPU copies."""
    return {name: param.detach().to("cpu").contiguous().clone()
            for name, param in diffusion_model.named_parameters() if is_adapter_param(name)}


def lora_state_dict(named: dict[str, torch.Tensor], spec: LoraSpec,
                    diffusion_model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """Adapter tensors by module path -> ComfyUI's key format for spec.kind (lora: + alpha when it is not the
    rank). DoRA needs the model the adapters are in: its file is made against the base weights."""
    base = adapter_kinds.base_weights(diffusion_model) if diffusion_model is not None else None
    return adapter_kinds.to_comfy(named, spec, base)


def save_lora(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write a safetensors file (a LoRA, or a full fine-tune's model) atomically: a temp file in the same
    folder, then rename; a failed write removes its temp file."""
    write_safetensors(path, tensors, metadata)


def load_lora_into(diffusion_model: nn.Module, path: str, spec: LoraSpec | None = None) -> None:
    """Start from an existing ComfyUI-format file of spec.kind (default lora): copy its weights into our
    adapters. A file of another kind is refused."""
    from safetensors.torch import load_file

    try:
        saved = load_file(path)
    except Exception as e:  # safetensors raises several types for a broken file
        raise ConfigError(f"cannot read the starting LoRA {path}: {e}. Pick another file or 'none'.") from e
    params = {n: p for n, p in diffusion_model.named_parameters() if is_adapter_param(n)}
    wanted = adapter_kinds.from_comfy(saved, list(params), spec or LoraSpec(), adapter_kinds.base_weights(
        diffusion_model), path)
    matched = 0
    for name, tensor in wanted.items():
        param, key = params[name], adapter_kinds.comfy_key(name)
        if tensor.shape != param.shape:
            raise ConfigError(
                f"starting LoRA {path}: {key} has shape {tuple(tensor.shape)}, this run needs "
                f"{tuple(param.shape)}. Use the same rank and targets as that LoRA, or start from 'none'.")
        with torch.no_grad():
            param.copy_(tensor.to(param.dtype))
        matched += 1
    if matched == 0:
        raise ConfigError(f"starting LoRA {path} has no weights for this model's targets: "
                          "it was trained for another model or other layers. Start from 'none'.")
