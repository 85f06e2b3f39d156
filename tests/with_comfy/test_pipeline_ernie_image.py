"""Pipeline parallelism (Ernie-Image adapter, ComfyUI 0.33+): the stage layers, run one after another, equal
ComfyUI's apply_model bit for bit and give the same LoRA gradients, also checkpointed; other inputs are refused.

Built from ComfyUI's own classes (comfy.supported_models.ErnieImage) with the tiny config of
tests/family_configs_033.py, made trainable as the engine does (its attention's comfy-kitchen rope gets our
backward). No 2-process run: Ernie-Image's detection reads no width from a file (every file builds the
released 4096-wide, 36-layer model), so the ranks cannot load a tiny one; the stage boundaries are plain
tuples of tensors, as in the adapters tests/with_comfy/test_pipeline_chroma.py runs through real DeepSpeed ranks.
On ComfyUI 0.3.75, which has no Ernie-Image, the tests skip and say so.
"""
from __future__ import annotations

import family_configs as fc
import family_configs_033 as f33
import pytest
import torch
from adapter_checks import (assert_layers_equal_reference, assert_lora_grads_equal_reference, assert_only_adapter,
                            assert_text_only_inputs, run_layers)
from trainable import ensure_trainable, host_module

pytestmark = pytest.mark.core

_ERNIE = next(f for f in f33.FAMILIES if f.name == "ernie_image")


@pytest.fixture(autouse=True)
def _host_has_ernie(comfy):
    host_module("comfy.ldm.ernie.model")


def _model(**changes):
    import comfy.supported_models

    model = comfy.supported_models.ErnieImage(dict(_ERNIE.config, **changes)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, batch: int = 2, latent=(128, 4, 4), text_width: int = _ERNIE.text_width):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = [{"cross_attn": torch.randn((fc.T, text_width), generator=gen), "extras": {}} for _ in range(batch)]
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


CASES = {  # case: (model config changes, _prepare arguments)
    "default": ({}, {}),
    "one-item-not-square": ({}, {"batch": 1, "latent": (128, 3, 5)}),
    "three-layers": ({"num_layers": 3}, {}),
    "text-as-wide-as-the-model": ({"text_in_dim": 64}, {"text_width": 64}),  # the model has no text projection
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    changes, cond = CASES[case]
    model = _model(**changes)
    assert (model.diffusion_model.text_proj is None) == ("text_in_dim" in changes)
    assert_layers_equal_reference(model, _prepare(model, **cond), "ernie_image")


def test_text_reaches_the_output():
    """The text tokens reach the image tokens through the layers (the cases above are not trivially equal)."""
    model = _model()
    with torch.no_grad():
        base = run_layers(model, _prepare(model))
        other = _prepare(model)
        other.kwargs["c_crossattn"] = other.kwargs["c_crossattn"] + 1.0
        assert (run_layers(model, other) - base).abs().max() > 1e-4


@pytest.mark.parametrize("checkpointing", ["off", "cpu_offload"])
def test_stage_layers_give_comfyui_lora_gradients(checkpointing):
    """With a LoRA on every block linear, backward through the layers gives apply_model's loss and gradients,
    also with the engine's activation checkpointing (+ CPU offload) around every block."""
    assert_lora_grads_equal_reference(_model(), _prepare, "ernie_image", ["layers.0.", "layers.1."],
                                      checkpointing=checkpointing)


def test_unsupported_ernie_inputs_are_refused():
    """Concat channels and a conditioning without text get a ConfigError that names the fix."""
    assert_text_only_inputs(_model(), _prepare)


def test_adapter_for_picks_ernie_image_and_only_it():
    assert_only_adapter([_model()], "ernie_image", (f for f in fc.FAMILIES))
