"""Pipeline parallelism (OmniGen2 adapter): the stage layers, run one after another, equal ComfyUI's
apply_model bit for bit (text only, and with reference latents of several sizes) and give the same
LoRA gradients; a padded or missing text mask is refused; the adapter takes exactly OmniGen2 models.

The tiny model is ComfyUI's own Omnigen2 class with the tiny config of tests/family_configs.py.
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from trainable import ensure_trainable
from adapter_checks import (assert_every_lora_trained, assert_input_reaches_output, assert_layers_equal_reference,
                            assert_lora_grads_equal_reference, assert_only_adapter, assert_pipelined_like_plain,
                            assert_refused, family_model, two_process_runs)

_OMNIGEN2 = next(f for f in fc.FAMILIES if f.name == "omnigen2")


def _model(**config):
    return family_model("omnigen2", **config)


def _prepare(model, batch: int = 2, latent=(16, 6, 10), refs=((16, 6, 8),), mask="ones"):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them.

    refs: the raw shape of each reference latent; mask: "ones" (what the text encoder stores for an
    unpadded prompt), "padded" (its last two tokens masked) or None (no mask cached)."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = []
    for _ in range(batch):
        extras = {}
        if mask is not None:
            extras["attention_mask"] = torch.ones(fc.T, dtype=torch.long)
            if mask == "padded":
                extras["attention_mask"][-2:] = 0
        if refs:
            extras["reference_latents"] = [torch.randn((1, *shape), generator=gen) for shape in refs]
        conds.append({"cross_attn": torch.randn((fc.T, _OMNIGEN2.text_width), generator=gen), "extras": extras})
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


CASES = {
    "one-reference": dict(model=dict(), cond=dict()),
    "text-only": dict(model=dict(), cond=dict(refs=())),  # the reference refiners pass through
    "odd-sizes": dict(model=dict(), cond=dict(latent=(16, 7, 9), refs=((16, 5, 7),))),  # padded to 2x2, cropped
    "three-references-one-item": dict(model=dict(), cond=dict(batch=1, refs=((16, 6, 8), (16, 4, 4), (16, 8, 6)))),
    "two-refiners": dict(model=dict(num_refiner_layers=2, num_layers=1), cond=dict()),
    "no-refiners": dict(model=dict(num_refiner_layers=0), cond=dict()),  # the embedding joins the streams
    "no-main-layers": dict(model=dict(num_layers=0), cond=dict(batch=1)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    model = _model(**CASES[case]["model"])
    prepared = _prepare(model, **CASES[case]["cond"])
    assert ("ref_latents" in prepared.kwargs) == bool(CASES[case]["cond"].get("refs", True))
    assert_layers_equal_reference(model, prepared, "omnigen2")


def test_reference_latents_reach_the_output(comfy):
    """The reference tokens travel with the others: changing a reference changes the prediction."""
    model = _model()
    assert_input_reaches_output(model, _prepare(model, batch=1), "ref_latents", lambda refs: [r + 1.0 for r in refs])


def test_stage_layers_give_comfyui_lora_gradients(comfy):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients
    (every refiner, the reference one included, gets a gradient)."""
    assert_lora_grads_equal_reference(_model(), lambda model: _prepare(model, refs=((16, 6, 8), (16, 4, 6))),
                                      "omnigen2",
                                      ("context_refiner.", "noise_refiner.", "ref_image_refiner.", "layers."))


def test_unusable_text_masks_and_other_inputs_are_refused(comfy):
    """A padded text mask (ComfyUI's OmniGen2 cannot run it), a cache without a mask (no num_tokens)
    and inputs this adapter does not reproduce each get a ConfigError naming the fix."""
    model = _model()
    prepared = _prepare(model, batch=1, mask="padded")
    assert "attention_mask" in prepared.kwargs
    assert_refused(model, prepared, "padded text mask.*Re-cache")
    assert_refused(model, _prepare(model, batch=1, mask=None), "attention_mask.*Re-cache")
    assert_refused(model, _prepare(model, batch=1), "c_concat.*pipeline_stages to 1", c_concat=torch.zeros(1))


def test_adapter_takes_exactly_omnigen2_models(comfy):
    """Only this adapter matches OmniGen2, and it matches no other family's model."""
    assert_only_adapter([_model()], "omnigen2", (f for f in fc.FAMILIES if f.name != "omnigen2"))


@pytest.fixture(scope="module")
def omnigen2_files(comfy, tmp_path_factory):
    """A tiny OmniGen2 file (1 + 1 + 1 refiners, 2 layers) and a cache with the text encoder's
    all-ones mask and one reference latent per item; detection reads it with tests/tiny_detected.py."""
    import tiny_detected

    root = tmp_path_factory.mktemp("tiny-omnigen2")
    model = tiny_detected.write_model(root / "tiny_omnigen2.safetensors", "omnigen2")
    cache = tiny_detected.write_cache(root / "data", latent=(16, 8, 8), text_width=_OMNIGEN2.text_width,
                                      refs=((16, 6, 8),),
                                      extras={"attention_mask": torch.ones(tiny_detected.TEXT_TOKENS, dtype=torch.long)})
    return str(model), cache


@pytest.mark.slow
def test_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, omnigen2_files, monkeypatch):
    """2 DeepSpeed gloo ranks, one stage each, with a reference latent: same losses and saved LoRA
    as one plain process (tests/tiny_detected.py: ComfyUI loads the tiny file into its own classes)."""
    import tiny_detected

    tiny_detected.use_tiny_detection(monkeypatch)
    # Cut inside the refiners (embedding + context refiner | noise and reference refiners (the last
    # joins), 2 layers, head), so the separate text and image streams cross stages; activation
    # checkpointing on in the stages.
    plain, piped = two_process_runs(tmp_path, comfy_root, omnigen2_files, pipeline_split="2",
                                    activation_checkpointing="on")
    assert "pipeline stage 1/2: layers 0-1 of 7 (memory.pipeline_split)" in piped.log()
    assert_every_lora_trained(assert_pipelined_like_plain(plain, piped))
