"""Pipeline parallelism (Qwen-Image adapter, incl. Qwen-Image-Edit reference latents): the stage
layers, run one after another, equal ComfyUI's apply_model bit for bit and give the same LoRA
gradients; a 2-stage DeepSpeed pipeline (2 gloo processes) with reference latents trains like one
process at gas 1 and 4. The tiny models are ComfyUI's own QwenImage classes with a tiny config
(tests/family_configs.py); ComfyUI detects Qwen-Image files only at the real widths (24 heads of
128), so the engine runs use tests/tiny_detected.py, which widens that detection.
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from trainable import ensure_trainable
from adapter_checks import (assert_layers_equal_reference, assert_pipelined_like_plain, assert_refused, lora_grads,
                            run_layers, two_process_runs, with_lora)

_QWEN = next(f for f in fc.FAMILIES if f.name == "qwen_image")


def _model(layers: int = 3):
    import comfy.supported_models

    model = comfy.supported_models.QwenImage(dict(_QWEN.config, num_layers=layers)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, batch: int = 2, latent=(16, 1, 6, 10), refs=(), method: str | None = None,
             mask: bool = False):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them.

    refs: (height, width) of each Qwen-Image-Edit reference latent; method: reference_latents_method;
    mask: a text attention mask with the last 2 tokens padded (ComfyUI 0.33+ passes it on)."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = []
    for _ in range(batch):
        extras = {}
        if refs:
            extras["reference_latents"] = [torch.randn((1, latent[0], 1, h, w), generator=gen) for h, w in refs]
        if method is not None:
            extras["reference_latents_method"] = method
        if mask:
            extras["attention_mask"] = torch.ones(fc.T, dtype=torch.long)
            extras["attention_mask"][-2:] = 0
        conds.append({"cross_attn": torch.randn((fc.T, _QWEN.text_width), generator=gen), "extras": extras})
    prepared = ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))
    assert ("ref_latents" in prepared.kwargs) == bool(refs)
    assert ("ref_latents_method" in prepared.kwargs) == (method is not None)
    return prepared


def _run_layers(model, prepared):
    return run_layers(model, prepared, "qwen_image")


CASES = {
    "t2i": dict(),
    "one-item": dict(batch=1),
    "odd-size": dict(latent=(16, 1, 7, 9)),  # padded to the 2x2 patch, cropped
    # Qwen-Image-Edit (TextEncodeQwenImageEdit / EditPlus): reference tokens after the target's
    "edit": dict(refs=((6, 10),)),
    "edit-plus-2-refs-odd": dict(refs=((4, 6), (7, 5))),
    "edit-index-explicit": dict(refs=((4, 6), (6, 4)), method="index"),
    "edit-offset": dict(refs=((4, 6), (6, 4)), method="offset"),  # any other name: the offset layout
    # ComfyUI 0.33+: references at indices -1, -2 (on 0.3.75 an unknown name: the offset layout)
    "edit-negative-index": dict(refs=((4, 6), (6, 4)), method="negative_index"),
    "padded-text-mask": dict(mask=True),  # reaches the blocks where the host's extra_conds passes it
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    model = _model()
    prepared = _prepare(model, **CASES[case])
    assert_layers_equal_reference(model, prepared, "qwen_image")


def test_reference_latents_change_the_prediction(comfy):
    """The reference tokens take part in attention (the Edit path is not silently dropped)."""
    model = _model()
    with torch.no_grad():
        plain = _run_layers(model, _prepare(model))
        edit = _run_layers(model, _prepare(model, refs=((6, 10),)))
        offset = _run_layers(model, _prepare(model, refs=((4, 6), (6, 4)), method="offset"))
        index = _run_layers(model, _prepare(model, refs=((4, 6), (6, 4))))
    assert (plain - edit).abs().max() > 1e-4
    assert (offset - index).abs().max() > 1e-6  # the method changes the reference tokens' rope positions


@pytest.mark.parametrize("edit", [False, True])
def test_stage_layers_give_comfyui_lora_gradients(comfy, edit):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients,
    including which ones get none (the last block's text stream, whose output ComfyUI drops)."""
    model = _model()
    _, lora = with_lora(model)
    prepared = _prepare(model, refs=((4, 6), (7, 5)) if edit else ())

    (ref_loss, ref), (loss, got) = lora_grads(model, prepared, lora, "qwen_image")
    assert torch.equal(loss, ref_loss)
    unused = {n for n, g in ref.items() if g is None}
    assert unused and all(n.startswith("transformer_blocks.2.") for n in unused), sorted(unused)
    assert {n for n, g in got.items() if g is None} == unused
    # the last block's text queries only reach the dropped text outputs: zero gradient, not None
    moved = {n for n, g in ref.items() if g is not None and g.abs().sum() > 0}
    assert {n for n in ref if n not in moved} - unused == {n for n in ref if "blocks.2.attn.add_q_proj" in n}
    for n in ref:
        if ref[n] is not None:
            torch.testing.assert_close(got[n], ref[n], msg=n)


def test_unsupported_inputs_are_refused(comfy):
    """A kwarg the adapter does not reproduce (here a guidance value) gets a ConfigError naming it."""
    model = _model()
    assert_refused(model, _prepare(model, batch=1), "guidance", guidance=torch.ones(1))


@pytest.fixture(scope="module")
def edit_files(comfy, tmp_path_factory):
    """A tiny Qwen-Image-Edit file (4 blocks) and a cache whose items each have 2 reference latents."""
    import tiny_detected

    root = tmp_path_factory.mktemp("tiny-qwen-edit")
    model = tiny_detected.write_model(root / "tiny_qwen_image.safetensors", "qwen_image", num_layers=4)
    cache = tiny_detected.write_cache(root / "data", latent=(16, 1, 8, 8), text_width=_QWEN.text_width,
                                      refs=((16, 1, 8, 8), (16, 1, 4, 6)))
    return str(model), cache



@pytest.mark.slow
@pytest.mark.parametrize("grad_accum", [1, 4])
def test_edit_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, edit_files, grad_accum, monkeypatch):
    """2 DeepSpeed gloo ranks, one stage each, with reference latents: same losses and saved LoRA as
    one plain process (tests/tiny_detected.py: ComfyUI loads the tiny file into its own classes)."""
    import tiny_detected

    tiny_detected.use_tiny_detection(monkeypatch)
    plain, piped = two_process_runs(tmp_path, comfy_root, edit_files, grad_accum)
    assert "pipeline stage 2/2" in piped.log()
    # checked against apply_model before DeepSpeed built the stages (engine/models/stage_check.py)
    assert "pipeline check: the qwen_image stage layers reproduce ComfyUI" in piped.log()
    # atol 1e-5: Adam turns summation-order noise in a near-zero gradient into up to ~2e-6 on a few of
    # ~40k elements; a stage clipped, scaled or left out differs by 1e-4 or more (the steps are ~1e-3).
    a = assert_pipelined_like_plain(plain, piped)
    # A missing stage shows up as missing keys; every block but the last block's text stream trains.
    frozen = [k for k in a if k.endswith("lora_B.weight") and a[k].abs().sum() == 0]
    assert frozen and all(k.startswith("diffusion_model.transformer_blocks.3.") for k in frozen), frozen


def test_reference_method_with_zero_timestep_is_refused(comfy):
    """ComfyUI 0.33's "index_timestep_zero" (a second timestep for the references) is not reproduced."""
    model = _model()
    prepared = _prepare(model, batch=1, refs=((4, 6),))
    assert_refused(model, prepared, "index_timestep_zero.*pipeline_stages to 1",
                   ref_latents_method="index_timestep_zero")
