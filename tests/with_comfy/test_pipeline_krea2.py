"""Pipeline parallelism (Krea 2 adapter, ComfyUI 0.33+): the stage layers, run one after another, equal
ComfyUI's apply_model bit for bit and give the same LoRA gradients, also checkpointed, for text to image and
edit (reference latents with the "index" and "index_timestep_zero" methods, and without a method, which
leaves them unused as upstream does); other inputs are refused; a 2-stage pipeline of real DeepSpeed gloo
ranks trains like one plain process.

Built from ComfyUI's own classes with the tiny config of tests/family_configs_033.py, which is exactly what
0.33.0's detection reads from a tiny file (so the 2-process run loads a real file with ComfyUI's loader).
On ComfyUI 0.3.75, which has no Krea 2, the tests skip and say so.
"""
from __future__ import annotations

import family_configs as fc
import family_configs_033 as f33
import pytest
import torch
from adapter_checks import (assert_every_lora_trained, assert_layers_equal_reference,
                            assert_lora_grads_equal_reference, assert_only_adapter, assert_pipelined_like_plain,
                            assert_text_only_inputs, run_layers, two_process_runs)
from trainable import ensure_trainable, host_module

pytestmark = pytest.mark.core

_KREA2 = next(f for f in f33.FAMILIES if f.name == "krea2")


@pytest.fixture(autouse=True)
def _host_has_krea2(comfy):
    host_module("comfy.ldm.krea2.model")


def _model(**changes):
    import comfy.supported_models

    model = comfy.supported_models.Krea2(dict(_KREA2.config, **changes)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, batch: int = 2, latent=(16, 1, 8, 8), refs=(), method=None):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them; refs: the
    shapes of each item's reference latents."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = []
    for _ in range(batch):
        extras = {}
        if refs:
            extras["reference_latents"] = [torch.randn((1, *shape), generator=gen) for shape in refs]
        if method:
            extras["reference_latents_method"] = method
        conds.append({"cross_attn": torch.randn((fc.T, _KREA2.text_width), generator=gen), "extras": extras})
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


_REF = ((16, 1, 8, 8),)
CASES = {  # case: (model config changes, _prepare arguments)
    "t2i": ({}, {}),
    "one-item-odd-size": ({}, {"batch": 1, "latent": (16, 1, 7, 9)}),  # padded to the 2x2 patch, cropped
    "three-blocks": ({"layers": 3}, {}),
    "edit-index": ({}, {"refs": _REF, "method": "index"}),
    "edit-two-refs-odd": ({}, {"refs": ((16, 1, 6, 8), (16, 1, 5, 7)), "method": "index"}),
    "edit-timestep-zero": ({}, {"refs": _REF, "method": "index_timestep_zero"}),
    "edit-no-method": ({}, {"refs": _REF}),  # upstream ignores references without a method
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    changes, cond = CASES[case]
    model = _model(**changes)
    assert_layers_equal_reference(model, _prepare(model, **cond), "krea2")


def test_text_references_and_their_method_reach_the_output():
    """The text, the references and the timestep-zero method change the prediction (the cases are not trivial)."""
    model = _model()
    with torch.no_grad():
        base = run_layers(model, _prepare(model))
        other = _prepare(model)
        other.kwargs["c_crossattn"] = other.kwargs["c_crossattn"] + 1.0
        edit = run_layers(model, _prepare(model, refs=_REF, method="index"))
        zero = run_layers(model, _prepare(model, refs=_REF, method="index_timestep_zero"))
        for moved in (run_layers(model, other), edit, zero):
            assert (moved - base).abs().max() > 1e-4
        assert (zero - edit).abs().max() > 1e-4


@pytest.mark.parametrize("edit", [{}, {"refs": _REF, "method": "index_timestep_zero"}], ids=["t2i", "timestep-zero"])
@pytest.mark.parametrize("checkpointing", ["off", "cpu_offload"])
def test_stage_layers_give_comfyui_lora_gradients(checkpointing, edit):
    """With a LoRA on every block linear, backward through the layers gives apply_model's loss and gradients,
    also with the engine's activation checkpointing (+ CPU offload) around every block."""
    assert_lora_grads_equal_reference(_model(), lambda m: _prepare(m, **edit), "krea2", ["blocks.0.", "blocks.1."],
                                      checkpointing=checkpointing)


def test_unsupported_krea2_inputs_are_refused():
    """Concat channels and a conditioning without text get a ConfigError that names the fix."""
    assert_text_only_inputs(_model(), _prepare)


def test_adapter_for_picks_krea2_and_only_it():
    assert_only_adapter([_model()], "krea2", (f for f in fc.FAMILIES))


@pytest.fixture(scope="module")
def krea2_files(comfy, tmp_path_factory):
    """A tiny Krea 2 file, as 0.33.0's detection reads it back, and a cache of text-to-image items."""
    import tiny_detected
    from safetensors.torch import save_file

    host_module("comfy.ldm.krea2.model")  # a module fixture is made before the autouse skip above
    root = tmp_path_factory.mktemp("tiny-krea2")
    path = root / "tiny_krea2.safetensors"
    save_file({k: v.contiguous() for k, v in _model().diffusion_model.state_dict().items()}, str(path))
    return str(path), tiny_detected.write_cache(root / "data", latent=_KREA2.latent, text_width=_KREA2.text_width)


@pytest.mark.slow
def test_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, krea2_files):
    """2 DeepSpeed gloo ranks, one stage each: the same losses, gradient norms and saved LoRA as one plain process."""
    plain, piped = two_process_runs(tmp_path, comfy_root, krea2_files)
    assert "pipeline stage 2/2" in piped.log()
    assert_every_lora_trained(assert_pipelined_like_plain(plain, piped))
