"""Pipeline parallelism (MiniMax H3 adapter, ComfyUI 0.33+): the stage layers, run one after another, equal
ComfyUI's apply_model bit for bit and give the same LoRA gradients, also checkpointed, for text to image and
to video, with an audio stream of no frames and with audio frames (which the model carries at the sampler's
audio_scale, as the objective sets model.latent_shapes like the sampler), and with text token tags of several
runs; other inputs are refused.

Built from ComfyUI's own classes with the tiny config of tests/family_configs_033.py, made trainable as the
engine does (its blocks' in-place modulation replaced, engine/patches/minimax.py). No 2-process run: CacheLatents
does not write MiniMax H3's packed latent yet (docs/supported-models.md), and the stage boundaries are plain
tuples of tensors, as in the adapters tests/with_comfy/test_pipeline_chroma.py runs through real DeepSpeed ranks.
On ComfyUI 0.3.75, which has no MiniMax H3, the tests skip and say so.
"""
from __future__ import annotations

import family_configs as fc
import family_configs_033 as f33
import pytest
import torch
from adapter_checks import (assert_layers_equal_reference, assert_lora_grads_equal_reference, assert_only_adapter,
                            assert_refused, run_layers)
from trainable import ensure_trainable, host_module

pytestmark = pytest.mark.core

_H3 = next(f for f in f33.FAMILIES if f.name == "minimax_h3_t2v")


@pytest.fixture(autouse=True)
def _host_has_minimax_h3(comfy):
    host_module("comfy.ldm.minimax.model")


def _model(**changes):
    model = f33._minimax_h3(dict(_H3.config, **changes))
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, video=(24, 2, 4, 4), audio_frames: int = 0, tags=None):
    """apply_model's inputs for one cached item: the packed video + audio latent and its stream shapes, the text
    and its per-token adaLN tags (default: all text)."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    shapes = [torch.Size((1, *video)), torch.Size((1, 32, 2, audio_frames))]
    latents = torch.randn((1, 1, sum(s.numel() for s in shapes)), generator=gen)
    tags = torch.ones(fc.T, dtype=torch.long) if tags is None else torch.tensor(tags, dtype=torch.long)
    extras = {"pooled_output": None, "minimax_token_tags": tags, "latent_shapes": shapes}
    conds = [{"cross_attn": torch.randn((fc.T, _H3.text_width), generator=gen), "extras": extras}]
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, [0]))


CASES = {  # case: (model config changes, _prepare arguments)
    "t2v": ({}, {}),
    "t2i": ({}, {"video": (24, 1, 4, 4)}),
    "odd-size": ({}, {"video": (24, 2, 3, 5)}),  # padded to the 2x2 patch, cropped
    "with-audio": ({}, {"audio_frames": 3}),
    "tag-runs": ({}, {"tags": [1, 1, 0, 0, 1, 2]}),  # vision pads carry the video tag, as the text encoder gives
    "three-blocks": ({"num_layers": 3}, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    changes, cond = CASES[case]
    model = _model(**changes)
    assert_layers_equal_reference(model, _prepare(model, **cond), "minimax_h3")


def test_text_tags_and_audio_reach_the_output():
    """The text, its tags and the audio stream change the prediction (the cases above are not trivial)."""
    model = _model()
    with torch.no_grad():
        base = run_layers(model, _prepare(model))
        other = _prepare(model)
        other.kwargs["c_crossattn"] = other.kwargs["c_crossattn"] + 1.0
        tagged = run_layers(model, _prepare(model, tags=[1, 1, 0, 0, 1, 2]))
        for moved in (run_layers(model, other), tagged):
            assert (moved - base).abs().max() > 1e-4
        with_audio = run_layers(model, _prepare(model, audio_frames=3))
        video = 24 * 2 * 4 * 4  # the video stream comes first in the packed latent
        assert (with_audio[..., :video] - base).abs().max() > 1e-4


@pytest.mark.parametrize("audio_frames", [0, 3], ids=["no-audio", "audio"])
@pytest.mark.parametrize("checkpointing", ["off", "cpu_offload"])
def test_stage_layers_give_comfyui_lora_gradients(checkpointing, audio_frames):
    """With a LoRA on every block linear, backward through the layers gives apply_model's loss and gradients,
    also with the engine's activation checkpointing (+ CPU offload) around every block."""
    assert_lora_grads_equal_reference(_model(), lambda m: _prepare(m, audio_frames=audio_frames), "minimax_h3",
                                      ["blocks.0.", "blocks.1."], checkpointing=checkpointing)


def test_an_audio_stream_is_carried_at_the_samplers_audio_scale():
    """With audio frames the objective sets model.latent_shapes (as comfy.samplers does), so extra_conds hands the
    model the audio_scale its sampling uses (shift 12 / audio shift 3): the case above runs the carry."""
    model = _model()
    assert _prepare(model, audio_frames=3).kwargs["minimax_payload"]["audio_scale"] == pytest.approx(4.0)
    assert _prepare(model).kwargs["minimax_payload"]["audio_scale"] == pytest.approx(4.0)  # no frames: no effect


def test_unsupported_minimax_inputs_are_refused():
    """Keyframes, a denoise mask and a missing text get a ConfigError with the fix."""
    model = _model()
    prepared = _prepare(model)
    payload = dict(prepared.kwargs["minimax_payload"], keyframes=[{}])
    assert_refused(model, prepared, "MiniMax H3.*keyframes.*pipeline_stages to 1", minimax_payload=payload)
    assert_refused(model, _prepare(model), "a denoise mask.*pipeline_stages to 1", denoise_mask=torch.ones(1))
    assert_refused(model, _prepare(model), "cross_attn", c_crossattn=None)


def test_adapter_for_picks_minimax_h3_and_only_it():
    assert_only_adapter([_model()], "minimax_h3", (f for f in fc.FAMILIES))
