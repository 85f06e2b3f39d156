"""Pipeline parallelism (HunyuanVideo adapter: HunyuanVideo 1.0 and its I2V variants, HunyuanImage 2.1,
HunyuanVideo 1.5, which all run ComfyUI's HunyuanVideo class): the stage layers, run one after
another, equal ComfyUI's apply_model bit for bit and give the same LoRA gradients.

The models are ComfyUI's own classes (comfy.supported_models.<Class>) built from the tiny configs of
tests/family_configs.py. No 2-process run here: ComfyUI's detection pins these families' widths, and
the stage boundaries are the same plain tuples of tensors tests/with_comfy/test_pipeline_chroma.py runs through
real DeepSpeed ranks.
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from trainable import ensure_trainable
from adapter_checks import assert_layers_equal_reference, assert_refused, assert_same_lora_grads, lora_grads, with_lora

_FAMILY = {f.name: f for f in fc.FAMILIES}
# The embedding hands on img_in's tokens as a strided view (engine/train/pipeline.py copies it before a
# send), so the layers here are not checked for contiguous outputs (adapter_checks.run_layers).


def _model(family: str, supported: str | None = None, **config):
    import comfy.supported_models

    fam = _FAMILY[family]
    model = getattr(comfy.supported_models, supported or fam.supported)(dict(fam.config, **config)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, family: str, batch: int = 2, latent=None, **extras):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    fam = _FAMILY[family]
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *(latent or fam.latent)), generator=gen)
    conds = []
    for _ in range(batch):
        item = {k: v for k, v in fam.extras(gen).items()}
        for k, v in extras.items():
            item[k] = v(gen) if callable(v) else v
        conds.append({"cross_attn": torch.randn((fc.T, fam.text_width), generator=gen),
                      "extras": {k: v for k, v in item.items() if v is not ...}})
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


def _r(*shape):
    return lambda g: torch.randn(shape, generator=g)


def _i2v_mask(frames, h, w):
    return torch.cat([torch.zeros(1, 1, h, w), torch.ones(1, frames - 1, h, w)], dim=1)


# name: (family, model changes, supported class or None, cond args)
CASES = {
    "hv-t2v": ("hunyuan_video", {}, None, {}),
    "hv-one-item": ("hunyuan_video", {}, None, dict(batch=1)),
    "hv-3-frames": ("hunyuan_video", {}, None, dict(latent=(16, 3, 8, 6))),
    "hv-no-guidance": ("hunyuan_video", dict(guidance_embed=False), None, {}),
    "hv-no-double-blocks": ("hunyuan_video", dict(depth=0, depth_single_blocks=2), None, {}),
    "hv-no-single-blocks": ("hunyuan_video", dict(depth=2, depth_single_blocks=0), None, {}),
    # I2V v1 "concat" (33 input channels) and Skyreels (32), from concat_latent_image (+ mask)
    "hv-i2v-concat": ("hunyuan_video", dict(in_channels=33), "HunyuanVideoI2V",
                      dict(concat_latent_image=_r(16, 2, 8, 8), concat_mask=_i2v_mask(2, 8, 8))),
    "hv-skyreels-i2v": ("hunyuan_video", dict(in_channels=32), "HunyuanVideoSkyreelsI2V",
                        dict(concat_latent_image=_r(16, 2, 8, 8))),
    # I2V v2 "replace": the guiding frame gets its own modulation row (vec [B, 2, D]). Batch 1 only:
    # upstream's per-range modulation (m_mult[:, row], [B, D]) broadcasts against the tokens only then.
    "hv-guiding-frame": ("hunyuan_video", {}, None, dict(batch=1, guiding_frame_index=0)),
    "hv-guiding-frame-no-guidance": ("hunyuan_video", dict(guidance_embed=False), None,
                                     dict(batch=1, guiding_frame_index=0)),
    # I2V "custom": a reference latent's tokens in front of the target's (batch 1 only: upstream writes
    # into the expanded ids of a batch)
    "hv-ref-latent": ("hunyuan_video", {}, None, dict(batch=1, ref_latent=_r(16, 1, 8, 8))),
    "hi21-t2i": ("hunyuan_image21", {}, None, {}),
    "hi21-odd-size": ("hunyuan_image21", {}, None, dict(latent=(64, 7, 5))),
    "hi21-byt5": ("hunyuan_image21", dict(byt5=True), None, dict(conditioning_byt5small=_r(4, 1472))),
    "hi21-distilled-meanflow": ("hunyuan_image21_distilled", {}, None, {}),
    "hv15-i2v": ("hunyuan_video15_i2v", {}, None, {}),
    "hv15-t2v-byt5": ("hunyuan_video15_i2v", dict(byt5=True, depth=2), None,
                      dict(concat_latent_image=..., concat_mask=..., clip_vision_output=...,
                           conditioning_byt5small=_r(3, 1472))),
    # (a single block too: with none, the last double block's text-stream output is unused)
    "hv15-i2v-byt5-one-item": ("hunyuan_video15_i2v", dict(byt5=True, depth_single_blocks=1), None,
                               dict(batch=1, conditioning_byt5small=_r(3, 1472))),
}


def _case(case):
    family, changes, supported, cond = CASES[case]
    model = _model(family, supported, **changes)
    return model, _prepare(model, family, **cond)


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    model, prepared = _case(case)
    assert_layers_equal_reference(model, prepared, "hunyuan_video", contiguous=False)


def test_case_inputs_reach_the_model(comfy):
    """The conditioning each case adds really is in the kwargs the layers get (not silently dropped)."""
    expect = {"hv-i2v-concat": "c_concat", "hv-guiding-frame": "guiding_frame_index", "hv-ref-latent": "ref_latent",
              "hi21-byt5": "txt_byt5", "hv15-i2v": "clip_fea", "hv15-t2v-byt5": "txt_byt5"}
    for case, key in expect.items():
        assert key in _case(case)[1].kwargs, case
    assert "clip_fea" not in _case("hv15-t2v-byt5")[1].kwargs


@pytest.mark.parametrize("case", ["hv-guiding-frame", "hv-ref-latent", "hv15-i2v-byt5-one-item"])
def test_stage_layers_give_comfyui_lora_gradients(comfy, case):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients."""
    model, prepared = _case(case)
    targets, lora = with_lora(model)
    assert any(t.startswith("double_blocks.") for t in targets)
    want, got = lora_grads(model, prepared, lora, "hunyuan_video", contiguous=False)
    assert_same_lora_grads(want, got)


def test_unsupported_inputs_are_refused(comfy):
    """An attention mask (padded text), which the adapter does not reproduce, gets a ConfigError."""
    model, prepared = _case("hv-one-item")
    # (only the mask's presence matters here)
    assert_refused(model, prepared, "attention mask.*pipeline_stages to 1", attention_mask=torch.ones(1, fc.T))


def test_adapter_takes_the_hunyuan_classes_only(comfy):
    from PipeTrain.engine.models import adapter_for

    for family in ("hunyuan_video", "hunyuan_image21", "hunyuan_video15_i2v"):
        assert adapter_for(_model(family)).name == "hunyuan_video"
    assert adapter_for(fc.build(_FAMILY["flux"])).name == "flux"
