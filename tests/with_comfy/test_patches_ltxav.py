"""engine/patches/ltxav.py: LTX 2.x's audio-video block (BasicAVTransformerBlock) out of place
(ComfyUI 0.33 and later).

- Our forward gives upstream's output bit for bit on the block's own inputs from a tiny model's
  forward, for LTX 2.3's block (cross-attention adaLN, gated attention) and LTX 2.0's, with the audio
  stream and with an audio stream of no frames, in fp32 and bf16, with ComfyUI's training flag on and
  off (off: upstream's fused comfy-kitchen video norm); it writes into none of its inputs.
- With peft LoRA on every block linear, checkpointed gradients equal plain ones, the audio stream's
  layers included.
Loss falling, the LoRA loading back through ComfyUI, the model output and the refusal without our
forward are in test_families_033_more.py. On a ComfyUI without LTXAV (0.3.75) these tests skip.
"""
from __future__ import annotations

import copy

import pytest
import torch

from trainable import cast_floats, first_call, host_module, lora_grads, ours_and_upstreams
from trainable import comfy, no_fixes_installed  # noqa: F401 - the fixtures every test here uses

pytestmark = pytest.mark.core


@pytest.fixture
def more():
    host_module("comfy.ldm.lightricks.av_model")
    import family_configs_033_more

    return family_configs_033_more


def _cast(kwargs, dtype):
    """kwargs in dtype, LTXAV's per-frame CompressedTimestep rows too (a plain class the tensor walk skips)."""
    from comfy.ldm.lightricks.av_model import CompressedTimestep

    def one(value):
        if not isinstance(value, CompressedTimestep):
            return value
        value = copy.copy(value)
        value.data = value.data.to(dtype)
        return value
    return {k: one(v) for k, v in cast_floats(kwargs, dtype).items()}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("audio", [True, False], ids=["audio", "no_audio"])
@pytest.mark.parametrize("version", ["LTXAV", "LTXAV_20"])
def test_our_forward_equals_upstreams(more, version, audio, dtype, training):
    block, args, kwargs = first_call(getattr(more, version), "BasicAVTransformerBlock")
    assert block.cross_attention_adaln == (version == "LTXAV")
    (vx, ax), *rest = args
    assert ax.numel() > 0
    if not audio:  # what the block gets from a latent whose audio stream has no frames
        ax = ax[:, :0]
    block = copy.deepcopy(block).to(dtype)
    args, kwargs = cast_floats(((vx, ax), *rest), dtype), _cast(kwargs, dtype)
    got, want, untouched = ours_and_upstreams(block, args, kwargs, "ltxav-block 0.33", training)
    assert untouched, "our forward wrote into an input"
    assert len(got) == len(want) == 2
    assert all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want))
    assert not torch.equal(got[0], vx.to(dtype)) and torch.equal(got[1], ax.to(dtype)) != audio


def test_checkpointed_lora_gradients_equal_plain_ones(more):
    grads = lora_grads(more.LTXAV)
    for part in ("audio_attn1", "audio_to_video_attn", "video_to_audio_attn", "audio_ff", "attn2"):
        assert any(f".{part}." in n and g.abs().max() > 0 for n, g in grads["off"].items()), part
    assert grads["off"] and grads["off"].keys() == grads["on"].keys()
    for key, plain in grads["off"].items():
        assert torch.allclose(grads["on"][key], plain, rtol=1e-5, atol=1e-7), key
