"""Pipeline parallelism (AuraFlow adapter): the stage layers, run one after another, equal ComfyUI's
apply_model bit for bit and give the same LoRA gradients; unsupported inputs are refused.

Built from ComfyUI's own AuraFlow classes (comfy.supported_models.AuraFlow) with a tiny config
(tests/family_configs.py). The 2-process engine path is the same as for the other adapters
(tests/test_pipeline_sd3.py, tests/test_pipeline_chroma.py).
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from engine_runs import loss_and_lora_grads, trainable_lora
from PipeTrain.engine.config import ConfigError, LoraSpec

_AURA = next(f for f in fc.FAMILIES if f.name == "auraflow")


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


def _model(**changes):
    import comfy.supported_models

    model = comfy.supported_models.AuraFlow(dict(_AURA.config, **changes)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, batch: int = 2, latent=(4, 8, 8)):
    """apply_model's inputs for cached items as engine.data.collate returns them."""
    from PipeTrain.engine.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = [{"cross_attn": torch.randn((fc.T, _AURA.text_width), generator=gen), "extras": {}} for _ in range(batch)]
    return DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch)))


def _reference(model, prepared):
    from PipeTrain.engine.objective import transformer_options

    return model.apply_model(prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma),
                             **prepared.kwargs)


def _run_layers(model, prepared):
    """The adapter's layers in sequence; every tensor handed on is contiguous (DeepSpeed sends it as is)."""
    from PipeTrain.engine.models import adapter_for

    adapter = adapter_for(model)
    assert adapter.name == "auraflow"
    acts = adapter.first_stage_inputs(prepared)
    for layer in adapter.layers(model):
        acts = layer(acts)
        assert all(t.is_contiguous() for t in ((acts,) if torch.is_tensor(acts) else acts)), type(layer).__name__
    return acts


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
    with torch.no_grad():
        reference = _reference(model, prepared)
        acts = _run_layers(model, prepared)
    assert torch.equal(acts, reference)


@pytest.mark.parametrize("checkpointing", ["off", "cpu_offload"])
def test_stage_layers_give_comfyui_lora_gradients(comfy, checkpointing):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients,
    also with the engine's activation checkpointing (+ CPU offload) wrapped around every block."""
    from PipeTrain.engine.checkpointing import enable_checkpointing
    from PipeTrain.engine.lora import inject_lora

    model = _model(n_double_layers=2, n_layers=4)
    targets = inject_lora(model.diffusion_model, LoraSpec(rank=4, targets="all_linear"))
    assert all(any(t.startswith(f"{kind}.{i}.") for t in targets)
               for kind in ("double_layers", "single_layers") for i in range(2))
    lora = trainable_lora(model)
    prepared = _prepare(model)

    ref_loss, ref = loss_and_lora_grads(model, prepared, lora, lambda: _reference(model, prepared))
    offloader = None if checkpointing == "off" else enable_checkpointing(model.diffusion_model, checkpointing)
    loss, got = loss_and_lora_grads(model, prepared, lora, lambda: _run_layers(model, prepared))
    assert offloader is None or offloader.offloaded > 0  # the blocks ran checkpointed
    assert torch.equal(loss, ref_loss)
    assert got.keys() == ref.keys() and all(g.abs().sum() > 0 for g in ref.values())
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], msg=n)


def test_unsupported_auraflow_inputs_are_refused(comfy):
    """Inputs beyond the text, missing text and a model ComfyUI cannot run get a ConfigError."""
    from PipeTrain.engine.models import adapter_for

    model = _model()
    adapter = adapter_for(model)
    prepared = _prepare(model, batch=1)
    prepared.kwargs["c_concat"] = torch.zeros_like(prepared.xt)
    with pytest.raises(ConfigError, match="concat channels.*pipeline_stages to 1"):
        adapter.first_stage_inputs(prepared)
    prepared = _prepare(model, batch=1)
    prepared.kwargs.pop("c_crossattn")
    with pytest.raises(ConfigError, match="cross_attn"):
        adapter.first_stage_inputs(prepared)
    with pytest.raises(ConfigError, match="no single layers"):
        adapter.layers(_model(n_double_layers=2, n_layers=2))


def test_adapter_for_picks_auraflow_and_only_auraflow(comfy):
    from PipeTrain.engine.models import ADAPTERS, adapter_for

    model = _model()
    assert adapter_for(model).name == "auraflow"
    assert [n for n, a in ADAPTERS.items() if a.matches(model)] == ["auraflow"]
    for family in fc.FAMILIES:  # every other family's tiny model (ComfyUI's own classes)
        if family.name != "auraflow":
            assert not ADAPTERS["auraflow"].matches(fc.build(family)), family.name
