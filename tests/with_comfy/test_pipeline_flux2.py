"""Pipeline parallelism (Flux.2 adapter): the stage layers, run one after another, equal ComfyUI's
apply_model bit for bit and give the same LoRA gradients.

The models are ComfyUI's own classes (comfy.supported_models.Flux2) built from the tiny config of
tests/family_configs.py. No 2-process run here: ComfyUI's detection pins Flux.2's widths, and the
stage boundaries are the same plain tuples of tensors tests/with_comfy/test_pipeline_chroma.py runs through
real DeepSpeed ranks.
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from trainable import ensure_trainable
from adapter_checks import (assert_every_lora_trained, assert_layers_equal_reference, assert_pipelined_like_plain,
                            assert_refused, assert_same_lora_grads, lora_grads, run_layers, two_process_runs,
                            with_lora)

_FLUX2 = next(f for f in fc.FAMILIES if f.name == "flux2")


def _model(depth: int = 2, singles: int = 2, guidance_embed: bool = True):
    import comfy.supported_models

    config = dict(_FLUX2.config, depth=depth, depth_single_blocks=singles, guidance_embed=guidance_embed)
    model = comfy.supported_models.Flux2(config).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, batch: int = 2, latent=(128, 4, 6), guidance=3.5, refs=(), method=None):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = []
    for _ in range(batch):
        extras = {"pooled_output": None, "guidance": guidance}
        if refs:
            extras["reference_latents"] = [torch.randn((1, latent[0], h, w), generator=gen) for h, w in refs]
        if method:
            extras["reference_latents_method"] = method
        conds.append({"cross_attn": torch.randn((fc.T, _FLUX2.text_width), generator=gen), "extras": extras})
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


CASES = {
    "t2i": dict(model=dict(), cond=dict()),
    "one-item-odd-size": dict(model=dict(), cond=dict(batch=1, latent=(128, 5, 3))),
    "no-guidance": dict(model=dict(), cond=dict(guidance=None)),  # FluxDisableGuidance
    "not-guidance-distilled": dict(model=dict(guidance_embed=False), cond=dict()),
    "no-double-blocks": dict(model=dict(depth=0, singles=2), cond=dict()),  # the embedding joins the streams
    "no-single-blocks": dict(model=dict(depth=2, singles=0), cond=dict()),
    # reference latents (Flux.2's default method "index"), and the other methods
    "edit-1-ref": dict(model=dict(), cond=dict(refs=((4, 6),))),
    "edit-2-refs-odd": dict(model=dict(), cond=dict(refs=((3, 5), (6, 4)))),
    "edit-offset": dict(model=dict(), cond=dict(refs=((3, 5), (6, 4)), method="offset")),
    "edit-uxo": dict(model=dict(), cond=dict(refs=((3, 5), (6, 4)), method="uxo")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    model = _model(**CASES[case]["model"])
    prepared = _prepare(model, **CASES[case]["cond"])
    assert prepared.kwargs["c_crossattn"].shape[1] == 512  # Flux2.extra_conds pads the text
    assert_layers_equal_reference(model, prepared, "flux2")


def test_guidance_and_references_change_the_output(comfy):
    """The guidance and the reference tokens reach the blocks (the cases above are not trivially equal)."""
    model = _model()
    with torch.no_grad():
        base = run_layers(model, _prepare(model))
        for other in (dict(guidance=1.0), dict(refs=((4, 6),))):
            assert (run_layers(model, _prepare(model, **other)) - base).abs().max() > 1e-4, other


@pytest.mark.parametrize("refs", [(), ((4, 6), (3, 5))])
def test_stage_layers_give_comfyui_lora_gradients(comfy, refs):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients."""
    model = _model()
    targets, lora = with_lora(model)
    assert any(t.startswith("double_blocks.") for t in targets) and any(t.startswith("single_blocks.") for t in targets)
    prepared = _prepare(model, refs=refs)
    want, got = lora_grads(model, prepared, lora, "flux2")
    assert_same_lora_grads(want, got)


def test_unsupported_flux2_inputs_are_refused(comfy):
    """An attention mask, which the adapter does not reproduce, gets a ConfigError."""
    model = _model()
    # (only the mask's presence matters here)
    assert_refused(model, _prepare(model, batch=1), "Flux.2.*attention mask.*pipeline_stages to 1",
                   attention_mask=torch.ones(1, 1, 1))


def test_adapter_takes_flux2_only(comfy):
    from PipeTrain.engine.models import adapter_for

    assert adapter_for(_model()).name == "flux2"
    assert adapter_for(fc.build(next(f for f in fc.FAMILIES if f.name == "flux"))).name == "flux"
    assert adapter_for(fc.build(next(f for f in fc.FAMILIES if f.name == "chroma"))).name == "chroma"


@pytest.fixture(scope="module")
def flux2_files(comfy, tmp_path_factory):
    """A tiny Flux.2 file (2 double + 2 single blocks) and a cache of edit items (one reference latent)."""
    import tiny_detected

    root = tmp_path_factory.mktemp("tiny-flux2")
    model = tiny_detected.write_model(root / "tiny_flux2.safetensors", "flux2", depth=2, depth_single_blocks=2)
    cache = tiny_detected.write_cache(root / "data", latent=(128, 4, 4), text_width=_FLUX2.text_width,
                                      refs=((128, 4, 4),), extras={"pooled_output": None})
    return str(model), cache


@pytest.mark.slow
def test_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, flux2_files, monkeypatch):
    """2 DeepSpeed gloo ranks, one stage each: same losses and saved LoRA as one plain process
    (tests/tiny_detected.py: ComfyUI loads the tiny file into its own Flux.2 classes)."""
    import tiny_detected

    tiny_detected.use_tiny_detection(monkeypatch)
    plain, piped = two_process_runs(tmp_path, comfy_root, flux2_files)
    assert "pipeline stage 2/2" in piped.log()
    assert_every_lora_trained(assert_pipelined_like_plain(plain, piped))
