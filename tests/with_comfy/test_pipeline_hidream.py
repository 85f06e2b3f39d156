"""Pipeline parallelism (HiDream adapter): the stage layers, run one after another, equal ComfyUI's
apply_model bit for bit and give the same LoRA gradients; unsupported inputs are refused.

Built from ComfyUI's own HiDream classes (comfy.supported_models.HiDream) with a tiny config
(tests/family_configs.py): every block reads its own Llama layer (llama_layers), and the feed-forwards
are MoE with data-dependent routing. The 2-process engine path is the same as for the other adapters
(tests/with_comfy/test_pipeline_sd3.py, tests/with_comfy/test_pipeline_chroma.py).
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from trainable import ensure_trainable
from adapter_checks import (assert_layers_equal_reference, assert_lora_grads_equal_reference, assert_only_adapter,
                            assert_refused, family_model, run_layers)

_HIDREAM = next(f for f in fc.FAMILIES if f.name == "hidream")
_LLAMA_WIDTH = 40  # caption_channels[1] of the tiny config


def _model(**changes):
    return family_model("hidream", **changes)


def _prepare(model, batch: int = 2, latent=(16, 8, 8), llama_layers: int = 2, llama_tokens: int = fc.T):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = [{"cross_attn": torch.randn((fc.T, _HIDREAM.text_width), generator=gen),
              "extras": {"pooled_output": torch.randn(32, generator=gen),
                         "conditioning_llama3": torch.randn((llama_layers, llama_tokens, _LLAMA_WIDTH), generator=gen)}}
             for _ in range(batch)]
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


def _run_layers(model, prepared):
    return run_layers(model, prepared, "hidream")


CASES = {  # case: (model config changes, _prepare arguments)
    "default": ({}, {}),
    "odd-size": ({}, {"latent": (16, 7, 9)}),  # padded to the 2x2 patch, cropped
    "one-item": ({}, {"batch": 1}),
    "llama-shorter-than-t5": ({}, {"llama_tokens": 4}),
    "no-double-blocks": ({"num_layers": 0, "num_single_layers": 3, "llama_layers": [0, 1, 0]}, {}),
    "no-single-blocks": ({"num_layers": 2, "num_single_layers": 0, "llama_layers": [1, 0]}, {}),
    "two-and-two": ({"num_layers": 2, "num_single_layers": 2, "llama_layers": [2, 0, 1, 2]}, {"llama_layers": 3}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    changes, cond = CASES[case]
    model = _model(**changes)
    prepared = _prepare(model, **cond)
    assert_layers_equal_reference(model, prepared, "hidream")


def test_each_block_reads_its_own_llama_layer(comfy):
    """A Llama layer that only the last block reads (and the text in front of the double blocks)
    changes the prediction; one that no block reads does not."""
    model = _model(num_layers=1, num_single_layers=2, llama_layers=[0, 0, 2])
    prepared = _prepare(model, llama_layers=3)
    llama = prepared.kwargs["encoder_hidden_states_llama3"]
    with torch.no_grad():
        base = _run_layers(model, prepared)
        for layer, changes in ((1, False), (2, True)):
            prepared.kwargs["encoder_hidden_states_llama3"] = llama.clone()
            prepared.kwargs["encoder_hidden_states_llama3"][:, layer] += 1.0
            assert bool((_run_layers(model, prepared) - base).abs().max() > 1e-4) == changes, layer


@pytest.mark.parametrize("checkpointing", ["off", "cpu_offload"])
def test_stage_layers_give_comfyui_lora_gradients(comfy, checkpointing):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients,
    also with the engine's activation checkpointing (+ CPU offload) wrapped around every block."""
    # 3 experts, 2 per token: the routing decides which expert weights a token sees. Every expert of
    # every block sees some tokens (the gradients compared are not zero), so the stages route them as
    # ComfyUI does.
    model = _model(num_layers=2, num_single_layers=2, llama_layers=[1, 0, 1, 0], num_routed_experts=3)
    assert_lora_grads_equal_reference(
        model, _prepare, "hidream",
        [f"{kind}.{i}." for kind in ("double_stream_blocks", "single_stream_blocks") for i in range(2)],
        checkpointing=checkpointing)


def test_unsupported_hidream_inputs_are_refused(comfy):
    """The E1 edit image and a missing Llama or pooled conditioning get a ConfigError naming the fix."""
    model = _model()
    prepared = _prepare(model, batch=1)
    assert_refused(model, prepared, "edit image.*pipeline_stages to 1", image_cond=torch.zeros_like(prepared.xt))
    for key, name in (("encoder_hidden_states_llama3", "conditioning_llama3"), ("y", "pooled_output")):
        assert_refused(model, _prepare(model, batch=1), name, **{key: None})


def test_adapter_for_picks_hidream_and_only_hidream(comfy):
    assert_only_adapter([_model()], "hidream", (f for f in fc.FAMILIES if f.name != "hidream"))
