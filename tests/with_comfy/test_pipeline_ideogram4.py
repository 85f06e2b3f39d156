"""Pipeline parallelism (Ideogram 4 adapter, ComfyUI 0.33+): the stage layers, run one after another, equal
ComfyUI's apply_model bit for bit and give the same LoRA gradients, also checkpointed, with an unpadded
caption (no mask reaches the model) and a padded one (upstream's block-diagonal mask); other inputs are refused.

Built from ComfyUI's own classes with the tiny widths of tests/family_configs_033.py (Family.make puts them
in after the class pins the released ones), made trainable as the engine does. No 2-process run: the class
pins every width but the input's and the depth, so the ranks cannot load a tiny file; the stage boundaries
are plain tuples of tensors, as in the adapters tests/with_comfy/test_pipeline_chroma.py runs through real
DeepSpeed ranks. On ComfyUI 0.3.75, which has no Ideogram 4, the tests skip and say so.
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

_IDEOGRAM4 = next(f for f in f33.FAMILIES if f.name == "ideogram4")


@pytest.fixture(autouse=True)
def _host_has_ideogram4(comfy):
    host_module("comfy.ldm.ideogram4.model")


def _model(**changes):
    model = f33._ideogram4(dict(_IDEOGRAM4.config, **changes))
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, batch: int = 2, latent=(128, 4, 4), padded=(0, 0)):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them; padded: the
    zeros at the end of each item's text mask (0: unpadded)."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = [{"cross_attn": torch.randn((fc.T, _IDEOGRAM4.text_width), generator=gen),
              "extras": f33._ideogram4_extras(gen, padded=padded[i])} for i in range(batch)]
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


CASES = {  # case: (model config changes, _prepare arguments)
    "unpadded": ({}, {}),
    "padded": ({}, {"padded": (2, 1)}),
    "one-item-not-square": ({}, {"batch": 1, "latent": (128, 3, 5), "padded": (0,)}),
    "three-layers": ({"num_layers": 3}, {"padded": (1, 3)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    changes, cond = CASES[case]
    model = _model(**changes)
    prepared = _prepare(model, **cond)
    assert ("attention_mask" in prepared.kwargs) == any(cond.get("padded", ())), "the mask reaches the model"
    assert_layers_equal_reference(model, prepared, "ideogram4")


def test_text_and_its_padding_reach_the_output():
    """The text and the mask change the prediction (the cases above are not trivially equal)."""
    model = _model()
    with torch.no_grad():
        base = run_layers(model, _prepare(model))
        other = _prepare(model)
        other.kwargs["c_crossattn"] = other.kwargs["c_crossattn"] + 1.0
        assert (run_layers(model, other) - base).abs().max() > 1e-4
        assert (run_layers(model, _prepare(model, padded=(2, 1))) - base).abs().max() > 1e-4


@pytest.mark.parametrize("padded", [(0, 0), (2, 1)], ids=["unpadded", "padded"])
@pytest.mark.parametrize("checkpointing", ["off", "cpu_offload"])
def test_stage_layers_give_comfyui_lora_gradients(checkpointing, padded):
    """With a LoRA on every block linear, backward through the layers gives apply_model's loss and gradients,
    also with the engine's activation checkpointing (+ CPU offload) around every block."""
    assert_lora_grads_equal_reference(_model(), lambda m: _prepare(m, padded=padded), "ideogram4",
                                      ["layers.0.", "layers.1."], checkpointing=checkpointing)


def test_unsupported_ideogram4_inputs_are_refused():
    """Concat channels and a conditioning without text get a ConfigError that names the fix."""
    assert_text_only_inputs(_model(), _prepare)


def test_adapter_for_picks_ideogram4_and_only_it():
    assert_only_adapter([_model()], "ideogram4", (f for f in fc.FAMILIES))
