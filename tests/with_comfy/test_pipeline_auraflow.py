"""Pipeline parallelism (AuraFlow adapter): the stage layers, run one after another, equal ComfyUI's
apply_model bit for bit and give the same LoRA gradients; unsupported inputs are refused.

Built from ComfyUI's own AuraFlow classes (comfy.supported_models.AuraFlow) with a tiny config
(tests/family_configs.py). The 2-process engine path is the same as for the other adapters
(tests/with_comfy/test_pipeline_sd3.py, tests/with_comfy/test_pipeline_chroma.py).
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from trainable import ensure_trainable
from adapter_checks import (assert_layers_equal_reference, assert_layers_refused, assert_lora_grads_equal_reference,
                            assert_only_adapter, assert_text_only_inputs, family_model)

_AURA = next(f for f in fc.FAMILIES if f.name == "auraflow")


def _model(**changes):
    return family_model("auraflow", **changes)


def _prepare(model, batch: int = 2, latent=(4, 8, 8)):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = [{"cross_attn": torch.randn((fc.T, _AURA.text_width), generator=gen), "extras": {}} for _ in range(batch)]
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


CASES = {  # case: (model config changes, _prepare arguments)
    "default": ({}, {}),
    "odd-size": ({}, {"latent": (4, 7, 9)}),  # padded to the 2x2 patch, cropped
    "one-item": ({}, {"batch": 1}),
    "no-double-layers": ({"n_double_layers": 0, "n_layers": 2}, {}),  # the embedding joins the streams
    "two-double-two-single": ({"n_double_layers": 2, "n_layers": 4}, {}),
    # 10 x 9 patches on an 8 x 8 position table: _forward interpolates the table up
    "larger-than-position-table": ({}, {"latent": (4, 20, 18)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    changes, cond = CASES[case]
    model = _model(**changes)
    prepared = _prepare(model, **cond)
    assert_layers_equal_reference(model, prepared, "auraflow")


@pytest.mark.parametrize("checkpointing", ["off", "cpu_offload"])
def test_stage_layers_give_comfyui_lora_gradients(comfy, checkpointing):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients,
    also with the engine's activation checkpointing (+ CPU offload) wrapped around every block."""
    assert_lora_grads_equal_reference(_model(n_double_layers=2, n_layers=4), _prepare, "auraflow",
                                      [f"{kind}.{i}." for kind in ("double_layers", "single_layers") for i in range(2)],
                                      checkpointing=checkpointing)


def test_unsupported_auraflow_inputs_are_refused(comfy):
    """Inputs beyond the text, missing text and a model ComfyUI cannot run get a ConfigError."""
    model = _model()
    assert_text_only_inputs(model, _prepare)
    assert_layers_refused(model, _model(n_double_layers=2, n_layers=2), "no single layers")


def test_adapter_for_picks_auraflow_and_only_auraflow(comfy):
    assert_only_adapter([_model()], "auraflow", (f for f in fc.FAMILIES if f.name != "auraflow"))
