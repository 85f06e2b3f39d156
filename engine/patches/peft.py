"""peft's LoRA Linear computing in the activations' dtype, and its DoRA reading low-precision base weights
(engine/train/lora.py installs both).

peft casts each LoRA layer's input to the LoRA weights' dtype and adds the result in that dtype.
Every LoRA layer injected by the engine gets a subclass of peft's `Linear` whose forward casts the
(small) LoRA weights to the input's dtype instead; tests/unit/test_lora_layer.py compares it with
peft's own forward, so a peft release that changes the layer fails there.

peft's DoRA reads the base weight as it is stored: on fp8 weights (memory.base_dtype float8_*) its
magnitude init multiplies in float8, which torch does not implement, and ComfyUI's QuantizedTensor
(quantized files) is not dequantized. `dora_reads_float_weights` makes it read a float32 copy;
tests/with_comfy/test_quantized_base.py trains DoRA on both and loads the file back through ComfyUI.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

ADAPTER = "default"  # peft's adapter name; never appears in saved files


def compute_in_activation_dtype(diffusion_model: nn.Module) -> None:
    """Run every LoRA's matmuls in the dtype of the activations it gets (bf16 on GPUs).

    peft casts each LoRA layer's input to the LoRA weights' dtype (float32 by default) and adds a
    float32 result to the base layer's output: per layer a float32 copy of the activations is made
    and kept for backward, and every add and cast runs at float32 width. Here the (small) weights
    are cast instead; they stay in lora.dtype for the optimizer and receive float32 gradients.
    """
    from peft.tuners.lora.layer import Linear

    fast = _activation_dtype_class()
    for module in diffusion_model.modules():
        # DoRA layers (lora.kind dora) keep peft's forward, which applies the magnitude; it adds out of place
        # like the LoHa and LoKr layers' forwards, so checkpointed recomputation sees the same tensors.
        if type(module) is Linear and not module.lora_magnitude_vector:
            module.__class__ = fast


def _activation_dtype_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    result = self.base_layer(x, *args, **kwargs)
    if self.disable_adapters or self.merged or ADAPTER not in self.active_adapters:
        return result
    a, b = self.lora_A[ADAPTER].weight, self.lora_B[ADAPTER].weight
    flat = x.reshape(-1, x.shape[-1])  # 2-D matmuls: fewer reshapes and views per linear, forward and backward
    hidden = torch.nn.functional.linear(self.lora_dropout[ADAPTER](flat), a.to(x.dtype))
    update = torch.nn.functional.linear(hidden, b.to(x.dtype)).view(result.shape)
    scale = self.scaling[ADAPTER]
    # alpha = rank (the default) scales by 1: no multiply forward or backward (10 aten calls fewer per layer)
    return result + (update if scale == 1.0 else update * scale)


@functools.cache
def _activation_dtype_class():
    from peft.tuners.lora.layer import Linear

    return type("ActivationDtypeLora", (Linear,), {"forward": _activation_dtype_forward,
                                                    "__doc__": "peft's LoRA Linear computing in the input's dtype."})


@functools.cache
def dora_reads_float_weights() -> None:
    """Make peft's DoRA read low-precision base weights (linear_layers.is_low_precision) as float32 copies, in
    its magnitude init and each forward, and start its adapter factors in float32 (peft moves them to the base
    weight's dtype, float8 there, just before the magnitude init). Once per process; others are unchanged."""
    import peft.tuners.lora.dora as dora
    from peft.tuners.lora.variants import DoraLinearVariant

    from ..linear_layers import float_weight, is_low_precision

    read, init = dora.dequantize_module_weight, DoraLinearVariant.init

    def read_float(module: nn.Module) -> torch.Tensor:
        return float_weight(module.weight) if is_low_precision(module.weight) else read(module)

    def init_float(module: nn.Module, adapter_name: str, **kwargs) -> None:
        if is_low_precision(module.get_base_layer().weight):
            for factors in (module.lora_A, module.lora_B):
                factors[adapter_name].to(torch.float32)
        init(module, adapter_name=adapter_name, **kwargs)

    dora.dequantize_module_weight = read_float
    DoraLinearVariant.init = staticmethod(init_float)
