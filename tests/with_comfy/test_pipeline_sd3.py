"""Pipeline parallelism (SD3 adapter): the stage layers, run one after another, equal ComfyUI's
apply_model bit for bit and give the same LoRA gradients; unsupported inputs are refused.

Built from ComfyUI's own SD3 classes (comfy.supported_models.SD3) with a tiny config
(tests/family_configs.py). ComfyUI detects an SD3 file only from full-size keys, so there is no
2-process engine run here; the engine path is the same as for the other adapters
(tests/with_comfy/test_pipeline_chroma.py, tests/with_comfy/test_pipeline_qwen_image.py).
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from trainable import ensure_trainable
from adapter_checks import (assert_every_lora_trained, assert_input_reaches_output, assert_layers_equal_reference,
                            assert_layers_refused, assert_lora_grads_equal_reference, assert_only_adapter,
                            assert_pipelined_like_plain, assert_text_only_inputs, family_model, two_process_runs)

_SD3 = next(f for f in fc.FAMILIES if f.name == "sd3")


def _model(**changes):
    return family_model("sd3", **changes)


def _prepare(model, batch: int = 2, latent=(16, 8, 8), pooled: bool = True):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = [{"cross_attn": torch.randn((fc.T, _SD3.text_width), generator=gen),
              "extras": {"pooled_output": torch.randn(32, generator=gen) if pooled else None}} for _ in range(batch)]
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


CASES = {  # case: (model config changes, _prepare arguments)
    "pooled": ({}, {}),
    "no-pooled-vector": ({}, {"pooled": False}),  # pooled_output None: no y
    "odd-size": ({}, {"latent": (16, 7, 9)}),  # padded to the 2x2 patch, cropped
    "one-item": ({}, {"batch": 1}),
    "one-block": ({"num_blocks": 1}, {}),  # the only block is the pre_only one
    "three-blocks-self-attn": ({"num_blocks": 3, "x_block_self_attn_layers": [0, 1]}, {}),
    "no-position-table": ({"num_patches": None, "pos_embed_max_size": None}, {}),  # computed sin-cos table
    "register-tokens": ({"register_length": 2}, {}),
    "blocks-own-checkpoint": ({"use_checkpoint": True}, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    changes, cond = CASES[case]
    model = _model(**changes)
    prepared = _prepare(model, **cond)
    assert ("y" in prepared.kwargs) == cond.get("pooled", True)
    assert_layers_equal_reference(model, prepared, "sd3")


def test_pooled_vector_reaches_the_blocks(comfy):
    """The pooled vector changes the prediction (it travels in c_mod, not dropped as absent)."""
    model = _model()
    assert_input_reaches_output(model, _prepare(model), "y", name="sd3")


@pytest.mark.parametrize("checkpointing", ["off", "cpu_offload"])
def test_stage_layers_give_comfyui_lora_gradients(comfy, checkpointing):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients,
    also with the engine's activation checkpointing (+ CPU offload) wrapped around every block."""
    assert_lora_grads_equal_reference(_model(num_blocks=3), _prepare, "sd3", [f"joint_blocks.{i}." for i in range(3)],
                                      checkpointing=checkpointing)


def test_unsupported_sd3_inputs_are_refused(comfy):
    """Concat channels, missing text and a context processor get a ConfigError naming the fix."""
    model = _model()
    assert_text_only_inputs(model, _prepare)
    assert_layers_refused(model, _model(context_processor_layers=1, context_size=_SD3.text_width), "context processor")


def test_adapter_for_picks_sd3_and_only_sd3(comfy):
    assert_only_adapter([_model()], "sd3", (f for f in fc.FAMILIES if f.name != "sd3"))


@pytest.fixture(scope="module")
def sd3_files(comfy, tmp_path_factory):
    """A tiny SD3 file (2 joint blocks: detection reads their count from the width, 64 per block; it
    reads every value from the file's own tensors, so no tiny detection is needed) and a cache."""
    import tiny_detected

    root = tmp_path_factory.mktemp("tiny-sd3")
    model = tiny_detected.write_model(root / "tiny_sd3.safetensors", "sd3")
    cache = tiny_detected.write_cache(root / "data", latent=(16, 8, 8), text_width=_SD3.text_width,
                                      extras={"pooled_output": torch.randn((1, 32), generator=torch.Generator())})
    return str(model), cache


@pytest.mark.slow
def test_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, sd3_files):
    """2 DeepSpeed gloo ranks, one stage each: same losses and saved LoRA as one plain process."""
    plain, piped = two_process_runs(tmp_path, comfy_root, sd3_files)
    assert "pipeline stage 2/2" in piped.log()
    assert_every_lora_trained(assert_pipelined_like_plain(plain, piped))
