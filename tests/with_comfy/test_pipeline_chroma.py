"""Pipeline parallelism (Chroma adapter): the stage layers, run one after another, equal ComfyUI's
apply_model bit for bit and give the same LoRA gradients; and a 2-stage DeepSpeed pipeline (2 gloo
processes) trains like one process.

The in-process tests build ComfyUI's own Chroma classes (comfy.supported_models.Chroma) from a tiny
config. ComfyUI detects a Chroma file only at the real widths (24 heads of 128, a 5 x 5120
approximator), far too slow for CPU ranks, so the engine runs use tests/tiny_detected.py, which
widens that detection to the tiny config; the file is still loaded by ComfyUI's own loader.
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from trainable import ensure_trainable
from adapter_checks import (assert_every_lora_trained, assert_layers_equal_reference, assert_pipelined_like_plain,
                            assert_refused, assert_same_lora_grads, lora_grads, run_layers, two_process_runs,
                            with_lora)

_CHROMA = next(f for f in fc.FAMILIES if f.name == "chroma")


def _model(depth: int = 2, singles: int = 2):
    import comfy.supported_models

    config = dict(_CHROMA.config, depth=depth, depth_single_blocks=singles)
    model = comfy.supported_models.Chroma(config).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, batch: int = 2, latent=(16, 6, 10), guidance=0.0, pooled: bool = False, refs=()):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = []
    for _ in range(batch):
        extras = {"pooled_output": torch.randn(32, generator=gen) if pooled else None, "guidance": guidance}
        if refs:
            extras["reference_latents"] = [torch.randn((1, latent[0], h, w), generator=gen) for h, w in refs]
        conds.append({"cross_attn": torch.randn((fc.T, _CHROMA.text_width), generator=gen), "extras": extras})
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


def _run_layers(model, prepared):
    return run_layers(model, prepared, "chroma")


CASES = {
    "default-guidance-0": dict(model=dict(), cond=dict()),
    "guidance-4": dict(model=dict(), cond=dict(guidance=4.0)),
    "odd-size": dict(model=dict(), cond=dict(latent=(16, 7, 9))),  # padded to the 2x2 patch, cropped
    "one-item": dict(model=dict(), cond=dict(batch=1)),
    "no-double-blocks": dict(model=dict(depth=0, singles=3), cond=dict()),  # the embedding joins the streams
    "no-single-blocks": dict(model=dict(depth=2, singles=0), cond=dict()),
    # Chroma's forward takes and ignores a pooled vector and reference latents; so does the adapter.
    "ignored-pooled-and-refs": dict(model=dict(), cond=dict(pooled=True, refs=((4, 6),))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    model = _model(**CASES[case]["model"])
    prepared = _prepare(model, **CASES[case]["cond"])
    assert "guidance" in prepared.kwargs
    assert_layers_equal_reference(model, prepared, "chroma")


def test_modulation_rows_carry_guidance(comfy):
    """The guidance value reaches every block through the carried modulation rows (not a constant)."""
    model = _model()
    with torch.no_grad():
        a = _run_layers(model, _prepare(model, guidance=0.0))
        b = _run_layers(model, _prepare(model, guidance=4.0))
    assert (a - b).abs().max() > 1e-4


def test_stage_layers_give_comfyui_lora_gradients(comfy):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients."""
    model = _model()
    targets, lora = with_lora(model)
    assert any(t.startswith("double_blocks.") for t in targets) and any(t.startswith("single_blocks.") for t in targets)
    prepared = _prepare(model, guidance=2.0)

    want, got = lora_grads(model, prepared, lora, "chroma")
    assert_same_lora_grads(want, got)


def test_unsupported_chroma_inputs_are_refused(comfy):
    """An attention mask (which the adapter does not reproduce) and a missing guidance get a ConfigError."""
    model = _model()
    # (only the mask's presence matters here)
    assert_refused(model, _prepare(model, batch=1), "attention mask", attention_mask=torch.ones(1, 1, 1))
    assert_refused(model, _prepare(model, batch=1), "guidance", guidance=None)


def test_flux_adapter_still_takes_only_plain_flux(comfy):
    from PipeTrain.engine.models import adapter_for

    assert adapter_for(fc.build(next(f for f in fc.FAMILIES if f.name == "flux"))).name == "flux"
    assert adapter_for(_model()).name == "chroma"


@pytest.fixture(scope="module")
def chroma_files(comfy, tmp_path_factory):
    """A tiny Chroma file (2 double + 2 single blocks) and a cache of T5-shaped text, guidance 0."""
    import tiny_detected

    root = tmp_path_factory.mktemp("tiny-chroma")
    model = tiny_detected.write_model(root / "tiny_chroma.safetensors", "chroma", depth=2, depth_single_blocks=2)
    cache = tiny_detected.write_cache(root / "data", latent=(16, 8, 8), text_width=_CHROMA.text_width,
                                      extras={"pooled_output": None})
    return str(model), cache



@pytest.mark.slow
@pytest.mark.parametrize("grad_accum", [1])  # gas 4: tests/with_comfy/test_pipeline_qwen_image.py (same engine path)
def test_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, chroma_files, grad_accum, monkeypatch):
    """2 DeepSpeed gloo ranks, one stage each: same losses and saved LoRA as one plain process
    (tests/tiny_detected.py: ComfyUI loads the tiny file into its own classes). Its gradient norm is
    above grad_clip, so this also checks that the stages clip by the norm over all of them."""
    import tiny_detected

    tiny_detected.use_tiny_detection(monkeypatch)
    plain, piped = two_process_runs(tmp_path, comfy_root, chroma_files, grad_accum)
    assert "pipeline stage 2/2" in piped.log()
    # atol 1e-5: Adam turns summation-order noise in a near-zero gradient into up to ~2e-6 on a few of
    # ~40k elements; a stage clipped, scaled or left out differs by 1e-4 or more (the steps are ~1e-3).
    a = assert_pipelined_like_plain(plain, piped)
    assert_every_lora_trained(a)
