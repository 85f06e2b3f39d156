"""Pipeline parallelism (Flux adapter): the stage layers, run one after another, equal ComfyUI's
apply_model bit for bit, and give the same LoRA gradients.

No 2-process DeepSpeed run here (unlike tests/training/test_pipeline.py for Wan): ComfyUI only detects a
Flux file at the real widths (hidden 3072), and even a 1+1-block file of that width is too slow for
CPU tests. The stage boundaries are plain tuples of tensors, so the DeepSpeed mechanics the Wan test
covers are the same; what is Flux-specific (the math of each stage) is checked here.
"""
from __future__ import annotations

import pytest
import torch
from adapter_checks import assert_layers_equal_reference, assert_refused, assert_same_lora_grads, lora_grads, with_lora

import tiny_flux
from PipeTrain.engine.config.checks import ConfigError
from tools.tiny_config import host_config, params_fields
from trainable import ensure_trainable


def _model(guidance_embed=True, **config):
    return tiny_flux.build_base_model(guidance_embed=guidance_embed, **config)


def _prepare(model, **cond_args):
    from PipeTrain.engine.train.objective import DiffusionObjective

    latents, conds = tiny_flux.conds(2, **cond_args)
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, [0, 1]))


CASES = {
    "dev": dict(guidance_embed=True, cond=dict()),
    "dev-no-guidance": dict(guidance_embed=True, cond=dict(guidance=None)),  # FluxDisableGuidance
    "schnell": dict(guidance_embed=False, cond=dict()),
    "no-pooled": dict(guidance_embed=True, cond=dict(pooled=False)),
    "odd-size": dict(guidance_embed=True, cond=dict(latent=(16, 7, 9))),  # padded to the 2x2 patch, cropped
    # Kontext (ReferenceLatent): reference tokens after the target's, each ref_latents_method
    "kontext": dict(guidance_embed=True, cond=dict(refs=((6, 10),))),
    "kontext-2-refs-odd": dict(guidance_embed=True, cond=dict(refs=((4, 6), (7, 5)))),
    "kontext-index": dict(guidance_embed=True, cond=dict(refs=((4, 6), (6, 4)), ref_method="index")),
    "kontext-uxo": dict(guidance_embed=True, cond=dict(refs=((4, 6), (6, 4)), ref_method="uxo")),
    # a text norm before txt_in and text positions on rope axes 1 and 2 (0.33+: Ovis-style files)
    "text-norm-text-ids": dict(guidance_embed=True, config=dict(txt_norm=True, txt_ids_dims=[1, 2]), cond=dict()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    config = CASES[case].get("config", {})
    if not set(config) <= (params_fields("flux") or set()):
        pytest.skip(f"this ComfyUI's Flux has no {sorted(set(config) - (params_fields('flux') or set()))}")
    model = _model(CASES[case]["guidance_embed"], **config)
    prepared = _prepare(model, **CASES[case]["cond"])
    assert_layers_equal_reference(model, prepared, "flux")  # ComfyUI with the engine's transformer_options


@pytest.mark.parametrize("kontext", [False, True])
def test_stage_layers_give_comfyui_lora_gradients(comfy, kontext):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients."""
    model = _model()
    targets, lora = with_lora(model)
    cond_args = dict(refs=((4, 6), (6, 4))) if kontext else {}
    assert any(t.startswith("double_blocks.") for t in targets) and any(t.startswith("single_blocks.") for t in targets)
    prepared = _prepare(model, **cond_args)

    want, got = lora_grads(model, prepared, lora, "flux")
    assert_same_lora_grads(want, got)


def test_blocks_get_the_transformer_options_comfyui_gives_them(comfy):
    """Each block sees what forward_orig hands it (the engine's sigmas, block type/index/total), as
    attention overrides and patches read them."""
    from adapter_checks import reference, run_layers

    model = _model()
    prepared = _prepare(model)
    seen = []

    def record(module, args, kwargs):  # a copy now: forward_orig reuses one dict for every block
        opts = kwargs["transformer_options"]
        keys = ("block_type", "block_index", "total_blocks", "img_slice")  # img_slice: single blocks, 0.33+
        seen.append({k: opts[k] for k in keys if k in opts} | {"sigmas": opts["sigmas"]})

    dm = model.diffusion_model
    for block in (*dm.double_blocks, *dm.single_blocks):
        block.register_forward_pre_hook(record, with_kwargs=True)
    with torch.no_grad():
        reference(model, prepared)
        want, seen[:] = list(seen), []
        run_layers(model, prepared, "flux")
    assert [o["block_type"] for o in want] == ["double"] * len(dm.double_blocks) + ["single"] * len(dm.single_blocks)
    assert len(seen) == len(want)
    for got, ref in zip(seen, want):
        if "img_slice" not in ref:  # a host that does not hand it on (0.3.75)
            got.pop("img_slice", None)
        assert {k: v for k, v in got.items() if k != "sigmas"} == {k: v for k, v in ref.items() if k != "sigmas"}
        assert torch.equal(got["sigmas"], ref["sigmas"]) and torch.equal(got["sigmas"], prepared.sigma)


def test_unsupported_flux_variants_are_refused(comfy):
    """Extra conds the adapter does not reproduce (an attention mask) and Fill-style inputs get a ConfigError."""
    from PipeTrain.engine.models import adapter_for

    model = _model()
    latents, conds = tiny_flux.conds(1)
    from PipeTrain.engine.train.objective import DiffusionObjective

    prepared = DiffusionObjective(model, seed=3).prepare(latents, conds, [0])
    # ComfyUI's extra_conds would add this for a masked conditioning (it only needs its presence here)
    assert_refused(model, prepared, "attention mask", attention_mask=torch.ones(1, 1, 1))
    # ComfyUI 0.33's reference method with a zero timestep for the references (per-range modulation)
    prepared = DiffusionObjective(model, seed=3).prepare(latents, conds, [0])
    assert_refused(model, prepared, "index_timestep_zero.*pipeline_stages to 1",
                   ref_latents_method="index_timestep_zero")

    import comfy.supported_models

    fill = comfy.supported_models.Flux(host_config(dict(tiny_flux.FLUX_CONFIG, in_channels=96))).get_model({})
    with pytest.raises(ConfigError, match="Fill"):
        adapter_for(fill).layers(fill)


def test_flux2_is_not_taken_by_the_flux_adapter(comfy):  # it has its own: tests/with_comfy/test_pipeline_flux2.py
    import comfy.supported_models as sm
    from PipeTrain.engine.models import adapter_for

    config = dict(image_model="flux2", axes_dim=[8, 8, 8, 8], num_heads=2, mlp_ratio=3.0, theta=2000,
                  out_channels=128, global_modulation=True, vec_in_dim=None, mlp_silu_act=True,
                  qkv_bias=False, ops_bias=False, default_ref_method="index", ref_index_scale=10.0,
                  in_channels=128, hidden_size=64, context_in_dim=96, patch_size=1, depth=1,
                  depth_single_blocks=2, guidance_embed=True)
    model = sm.Flux2(host_config(config)).get_model({})
    assert adapter_for(model).name == "flux2"


def test_attention_preset_includes_fused_single_block_linears(comfy_root):
    """Flux single blocks hold their attention in linear1/linear2: the attention preset must train them."""
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy
    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.train.lora import select_lora_targets

    import_comfy(comfy_root)
    model = tiny_flux.build_base_model()
    targets = select_lora_targets(model.diffusion_model, LoraSpec(targets="attention"))
    assert any(t.startswith("single_blocks.") and t.endswith(".linear1") for t in targets)
    assert any(t.startswith("single_blocks.") and t.endswith(".linear2") for t in targets)
    assert not any(t.endswith("img_mlp.0") for t in targets)
