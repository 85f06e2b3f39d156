"""Full fine-tune (lora.kind = "full"): the diffusion model's own block weights train, no adapter is added.

Which weights: the same choice as for LoRA (lora.targets, lora.target_regex) on the module paths of the
blocks, with every parameter of a chosen module (weight and bias). The preset all_linear means, for a full
fine-tune, every parameter of the blocks (norm scales and modulation vectors too); the regex then filters the
parameter names. Everything outside the blocks (embedders, final layer) stays frozen.

Precision: lora.dtype float32 (the default) keeps the trained weights as float32 master weights; ComfyUI's
layers (comfy.ops) cast them to the activations' dtype in each forward (comfy_cast_weights), and the cast is
differentiable, so gradients reach the float32 weight. A parameter of a module that cannot cast (a bare
nn.Parameter such as Wan's modulation) keeps the dtype ComfyUI loaded it in. lora.dtype bfloat16 trains in
bfloat16 (half the memory; pair it with memory.optimizer adamw8bit_kahan, which keeps small updates).
"""
from __future__ import annotations

import re

import torch
from torch import nn

from ..config.checks import ConfigError
from ..config.sections import LoraSpec
from ..memory.blocks import block_roots
from .lora import select_lora_targets

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def select_full_params(diffusion_model: nn.Module, spec: LoraSpec) -> list[str]:
    """Parameter names (relative to the diffusion model) a full fine-tune trains."""
    if spec.targets != "all_linear":  # the LoRA presets pick the modules; all their parameters train
        modules = select_lora_targets(diffusion_model, spec)
        return [f"{m}.{n}" for m in modules for n, _ in diffusion_model.get_submodule(m).named_parameters()]
    roots = tuple(r + "." for r in block_roots(diffusion_model))
    regex = re.compile(spec.target_regex) if spec.target_regex else None
    names = [n for n, _ in diffusion_model.named_parameters()
             if n.startswith(roots) and (regex is None or regex.search(n))]
    if not names:
        raise ConfigError("full fine-tune: no weight of this model's blocks"
                          + (f" matches the regex {spec.target_regex!r}" if regex else "")
                          + ". Loosen target_regex, or clear it.")
    return names


def unfreeze_blocks(diffusion_model: nn.Module, spec: LoraSpec) -> list[str]:
    """Freeze the model, then make the selected block weights trainable (in spec.dtype where their module
    casts weights). Returns their names. An fp8 weight is refused: its rounding would swallow the updates."""
    names = select_full_params(diffusion_model, spec)
    params = dict(diffusion_model.named_parameters())
    low = sorted({str(params[n].dtype) for n in names if params[n].dtype in FP8})
    if low:
        raise ConfigError(f"full fine-tune: the model's block weights are stored as {', '.join(low)}, too coarse "
                          "to take training updates. Use the bf16 or fp16 model file, and base_dtype auto or "
                          "bfloat16 (Memory Options), or train a LoRA on the fp8 model.")
    dtype = torch.bfloat16 if spec.dtype == "bfloat16" else torch.float32
    diffusion_model.requires_grad_(False)
    for name in names:
        module_path, _, _ = name.rpartition(".")
        module = diffusion_model.get_submodule(module_path) if module_path else diffusion_model
        param = params[name]
        if hasattr(module, "comfy_cast_weights") and param.is_floating_point():
            param.data = param.data.to(dtype)
            module.comfy_cast_weights = True  # cast to the activations' dtype in each forward (comfy.ops)
        param.requires_grad_(True)
    return names


def model_tensors(diffusion_model: nn.Module, trained: dict[str, torch.Tensor] | None = None,
                  dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The whole diffusion model's state dict (its keys are ComfyUI's own, which comfy.sd.load_diffusion_model
    detects), floating tensors in `dtype`, as contiguous CPU copies. `trained`: tensors by name that replace the
    model's own (a pipelined run's weights, each trained on its stage's rank)."""
    out = {}
    for name, tensor in {**diffusion_model.state_dict(), **(trained or {})}.items():
        tensor = tensor.detach().to("cpu")
        out[name] = (tensor.to(dtype) if tensor.is_floating_point() else tensor).contiguous().clone()
    return out
