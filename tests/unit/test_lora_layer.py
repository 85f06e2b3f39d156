"""The engine's LoRA layer (engine/patches/peft.py: peft's Linear computing in the activations' dtype) gives
peft's own output and gradients."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn


def _peft_pair(rank: int = 4, alpha: float = 8.0, bias: bool = True):
    """(peft's LoRA model, the same model with the engine's layer class), equal weights, B non-zero."""
    from peft import LoraConfig, inject_adapter_in_model
    from PipeTrain.engine.patches.peft import ADAPTER, compute_in_activation_dtype

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24, bias=bias))
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=["0"]), model, adapter_name=ADAPTER)
    with torch.no_grad():
        model[0].lora_B[ADAPTER].weight.normal_()  # peft starts B at zero: the LoRA would add nothing
    ours = copy.deepcopy(model)
    compute_in_activation_dtype(ours)
    assert type(ours[0]).__name__ == "ActivationDtypeLora" and type(model[0]).__name__ == "Linear"
    return model, ours


@pytest.mark.parametrize("shape", [(2, 5, 16), (7, 16), (2, 3, 5, 16)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("alpha", [8.0, 4.0])  # scale 2, and 1 (alpha = rank: no multiply)
def test_output_and_gradients_equal_peft_in_float32(shape, bias, alpha):
    reference, ours = _peft_pair(alpha=alpha, bias=bias)
    assert ours[0].scaling["default"] == alpha / 4
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    outputs, grads = [], []
    for model in (reference, ours):
        xi = x.clone().requires_grad_(True)
        out = model(xi)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        outputs.append(out.detach())
        grads.append({"x": xi.grad, **{n: p.grad for n, p in model.named_parameters() if p.requires_grad}})
    assert outputs[1].shape == outputs[0].shape
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    assert grads[1].keys() == grads[0].keys() and len(grads[0]) == 3  # x, lora_A, lora_B
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-5, msg=name)


def test_bfloat16_activations_stay_bfloat16_with_float32_gradients():
    """bf16 activations: the output is bf16 (no float32 copy of the layer's output), close to peft's
    float32 result; the float32 LoRA weights get float32 gradients."""
    reference, ours = _peft_pair()
    ours[0].base_layer.to(torch.bfloat16)
    x = torch.randn((3, 16), generator=torch.Generator().manual_seed(2))
    out = ours(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(x).detach(), rtol=0.05, atol=0.05)
    out.float().sum().backward()
    lora = [p for n, p in ours.named_parameters() if ".lora_" in n]
    assert lora and all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.abs().sum() > 0 for p in lora)


def test_disabled_adapter_gives_the_base_output():
    from PipeTrain.engine.patches.peft import ADAPTER

    _, ours = _peft_pair()
    x = torch.randn((4, 16))
    with_lora = ours(x)
    ours[0].enable_adapters(False)
    assert torch.equal(ours(x), ours[0].base_layer(x))
    assert not torch.allclose(with_lora, ours(x))
    assert ADAPTER in ours[0].lora_A
