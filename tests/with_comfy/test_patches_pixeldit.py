"""engine/patches/pixeldit.py: PixelDiT's adaLN modulation and PiTBlock's MLP residual out of place
(ComfyUI 0.33 and later).

- Each of our forwards gives upstream's output bit for bit on the block's own inputs from a tiny
  model's forward, in fp32 and bf16, with ComfyUI's training flag on and off (module train / eval),
  PiTBlock with its MLP in one, two and three row chunks; and it writes into none of its inputs.
- With peft LoRA on every block linear, checkpointed gradients equal plain ones.
Loss falling, the LoRA loading back through ComfyUI and the refusal without our forwards are in
test_families_033_more.py. On a ComfyUI without PixelDiT (0.3.75) these tests skip.
"""
from __future__ import annotations

import copy

import pytest
import torch

from trainable import cast_floats, first_call, host_module, lora_grads, ours_and_upstreams
from trainable import comfy, no_fixes_installed  # noqa: F401 - the fixtures every test here uses

pytestmark = pytest.mark.core


@pytest.fixture
def pixeldit():
    host_module("comfy.ldm.pixeldit.model")
    import family_configs_033_more as more

    return more.PIXELDIT


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls_name,fix_name,chunks", [("MMDiTBlockT2I", "pixeldit-adaln 0.33", None),
                                                      ("PiTBlock", "pixeldit-pit 0.33", 1),
                                                      ("PiTBlock", "pixeldit-pit 0.33", 2),
                                                      ("PiTBlock", "pixeldit-pit 0.33", 3)])
def test_our_forward_equals_upstreams(pixeldit, cls_name, fix_name, chunks, dtype, training):
    block, args, kwargs = first_call(pixeldit, cls_name)
    block = copy.deepcopy(block).to(dtype)
    if chunks is not None:
        block.mlp_chunks = chunks
    got, want, untouched = ours_and_upstreams(block, *cast_floats((args, kwargs), dtype), fix_name, training)
    assert untouched, "our forward wrote into an input"
    assert len(got) == len(want) and all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want))


def test_checkpointed_lora_gradients_equal_plain_ones(pixeldit):
    grads = lora_grads(pixeldit)
    assert any("pixel_blocks" in n for n in grads["off"]) and any("adaLN_modulation" in n for n in grads["off"])
    assert grads["off"] and grads["off"].keys() == grads["on"].keys()
    for key, plain in grads["off"].items():
        assert plain.abs().max() > 0, key
        assert torch.allclose(grads["on"][key], plain, rtol=1e-5, atol=1e-7), key
