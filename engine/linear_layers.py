"""Which modules of a ComfyUI model are linear layers, whatever ComfyUI built them as.

Most are `nn.Linear` subclasses (comfy.ops). ComfyUI 0.33 and later load the layers of a quantized file
(a `comfy_quant` entry per layer: fp8, int8, nvfp4, mxfp8, ...) as the Linear of its mixed-precision
operations, a plain Module with `in_features`, `out_features` and a 2-D QuantizedTensor weight. LoRA
targets, block detection and the block probe count both kinds.
"""
from __future__ import annotations

import torch
from torch import nn


def is_linear(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):
        return True
    if type(module).__name__ != "Linear" or not hasattr(module, "in_features") or not hasattr(module, "out_features"):
        return False
    weight = module._parameters.get("weight")
    return isinstance(weight, torch.Tensor) and weight.dim() == 2


def other_linear_types(modules) -> set[type]:
    """The linear classes among `modules` that are not nn.Linear (peft must be told how to wrap them)."""
    return {type(m) for m in modules if is_linear(m) and not isinstance(m, nn.Linear)}
