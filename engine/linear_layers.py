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


FLOAT8 = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
               if hasattr(torch, name))


def _is_quantized(data: torch.Tensor) -> bool:
    """ComfyUI's QuantizedTensor: a tensor subclass that dequantizes itself."""
    return type(data) is not torch.Tensor and hasattr(data, "dequantize")


def is_low_precision(weight: torch.Tensor) -> bool:
    """A weight that float arithmetic cannot read as it is: a QuantizedTensor or a plain float8 tensor
    (memory.base_dtype float8_*)."""
    data = weight.data if isinstance(weight, nn.Parameter) else weight
    return _is_quantized(data) or data.dtype in FLOAT8


def float_weight(weight: torch.Tensor) -> torch.Tensor:
    """A float32 copy of a layer's weight, whatever ComfyUI stores it as (quantized tensors dequantized)."""
    data = weight.detach()
    return (data.dequantize() if _is_quantized(data) else data).to(torch.float32)
