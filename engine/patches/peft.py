"""peft's LoRA Linear computing in the activations' dtype (engine/train/lora.py installs it).

peft casts each LoRA layer's input to the LoRA weights' dtype and adds the result in that dtype.
Every LoRA layer injected by the engine gets a subclass of peft's `Linear` whose forward casts the
(small) LoRA weights to the input's dtype instead; tests/unit/test_lora_layer.py compares it with
peft's own forward, so a peft release that changes the layer fails there.
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
    hidden = torch.nn.functional.linear(self.lora_dropout[ADAPTER](x), a.to(x.dtype))
    return result + torch.nn.functional.linear(hidden, b.to(x.dtype)) * self.scaling[ADAPTER]


@functools.cache
def _activation_dtype_class():
    from peft.tuners.lora.layer import Linear

    return type("ActivationDtypeLora", (Linear,), {"forward": _activation_dtype_forward,
                                                    "__doc__": "peft's LoRA Linear computing in the input's dtype."})
