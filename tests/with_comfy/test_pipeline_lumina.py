"""Pipeline parallelism (Lumina 2 / Z-Image adapter, both ComfyUI's NextDiT): the stage layers, run
one after another, equal ComfyUI's apply_model bit for bit and give the same LoRA gradients; a padded
text mask is refused; the adapter takes exactly these models.

The tiny models are ComfyUI's own Lumina2 and ZImage classes with tiny configs (tests/family_configs.py);
Z-Image's tiny config keeps pad_tokens_multiple 32, so its text and image tokens are padded with the
learned pad tokens as in the real model.
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from trainable import ensure_trainable
from adapter_checks import (assert_every_lora_trained, assert_input_reaches_output, assert_layers_equal_reference,
                            assert_lora_grads_equal_reference, assert_only_adapter, assert_pipelined_like_plain,
                            assert_refused, family_model, two_process_runs)

_FAMILY = {f.name: f for f in fc.FAMILIES if f.name in ("lumina2", "z_image")}


def _model(family: str = "lumina2", **config):
    return family_model(family, **config)


def _prepare(model, family: str = "lumina2", batch: int = 2, latent=(16, 6, 10), text: int = fc.T, mask=None):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = []
    for _ in range(batch):
        extras = {} if mask is None else {"attention_mask": mask}
        conds.append({"cross_attn": torch.randn((text, _FAMILY[family].text_width), generator=gen), "extras": extras})
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


CASES = {
    "lumina2": dict(model=dict(), cond=dict()),
    "lumina2-odd-size": dict(model=dict(), cond=dict(latent=(16, 7, 9))),  # padded to the 2x2 patch, cropped
    "lumina2-one-item": dict(model=dict(), cond=dict(batch=1)),
    "lumina2-two-refiners": dict(model=dict(n_refiner_layers=2, n_layers=1), cond=dict()),
    "lumina2-no-refiners": dict(model=dict(n_refiner_layers=0), cond=dict()),  # the embedding joins
    "lumina2-no-main-layers": dict(model=dict(n_layers=0), cond=dict(batch=1)),
    "z-image": dict(model=dict(family="z_image"), cond=dict(family="z_image")),
    # 4 x 5 = 20 image tokens and 6 text tokens, each padded to 32 with the learned pad tokens
    "z-image-odd-size-one-item": dict(model=dict(family="z_image"), cond=dict(family="z_image", latent=(16, 7, 9),
                                                                            batch=1)),
    "z-image-no-padding-needed": dict(model=dict(family="z_image"), cond=dict(family="z_image", latent=(16, 8, 16),
                                                                            text=32, batch=1)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    model = _model(**CASES[case]["model"])
    prepared = _prepare(model, **CASES[case]["cond"])
    assert set(prepared.kwargs) == {"c_crossattn", "num_tokens"}
    assert_layers_equal_reference(model, prepared, "lumina2")


def test_time_and_text_reach_the_output(comfy):
    """Not a constant: sigma and the text change the prediction (the refiners and joins carry them)."""
    model = _model("z_image")
    assert_input_reaches_output(model, _prepare(model, "z_image", batch=1), "c_crossattn")


@pytest.mark.parametrize("family", ["lumina2", "z_image"])
def test_stage_layers_give_comfyui_lora_gradients(comfy, family):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients."""
    assert_lora_grads_equal_reference(_model(family), lambda model: _prepare(model, family), "lumina2",
                                      ("context_refiner.", "noise_refiner.", "layers."))


def test_padded_text_mask_is_refused(comfy):
    """A prompt with padding caches a 0/1 mask; extra_conds passes it on and the adapter refuses it."""
    model = _model()
    mask = torch.ones(fc.T, dtype=torch.long)
    mask[-2:] = 0
    prepared = _prepare(model, batch=1, mask=mask)
    assert "attention_mask" in prepared.kwargs
    assert_refused(model, prepared, "attention_mask.*pipeline_stages to 1")
    # An all-ones mask is dropped by extra_conds (only num_tokens is kept): that trains.
    prepared = _prepare(model, batch=1, mask=torch.ones(fc.T, dtype=torch.long))
    assert set(prepared.kwargs) == {"c_crossattn", "num_tokens"}
    assert_refused(model, prepared, "c_concat", c_concat=torch.zeros(1))  # an input this adapter does not reproduce


def test_adapter_takes_exactly_nextdit_models(comfy):
    """Only this adapter matches Lumina 2 and Z-Image, and it matches no other family's model."""
    assert_only_adapter([_model(family) for family in _FAMILY], "lumina2",
                        (f for f in fc.FAMILIES if f.name not in _FAMILY))


@pytest.fixture(scope="module")
def z_image_files(comfy, tmp_path_factory):
    """A tiny Z-Image file (1 + 1 refiners, 2 layers, learned pad tokens) and a cache of text at
    Qwen3-like width; detection reads it with tests/tiny_detected.py's pinned tiny values."""
    import tiny_detected

    root = tmp_path_factory.mktemp("tiny-z-image")
    model = tiny_detected.write_model(root / "tiny_z_image.safetensors", "z_image", n_layers=2)
    cache = tiny_detected.write_cache(root / "data", latent=(16, 8, 8), text_width=_FAMILY["z_image"].text_width)
    return str(model), cache


@pytest.mark.slow
def test_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, z_image_files, monkeypatch):
    """2 DeepSpeed gloo ranks, one stage each: same losses and saved LoRA as one plain process
    (tests/tiny_detected.py: ComfyUI loads the tiny file into its own classes)."""
    import tiny_detected

    tiny_detected.use_tiny_detection(monkeypatch)
    # Cut inside the refiners (embedding + context refiner | noise refiner (joins), 2 layers, head), so
    # the separate text and image streams cross stages; activation checkpointing on in the stages.
    plain, piped = two_process_runs(tmp_path, comfy_root, z_image_files, pipeline_split="2",
                                    activation_checkpointing="on")
    assert "pipeline stage 1/2: layers 0-1 of 6 (memory.pipeline_split)" in piped.log()
    assert_every_lora_trained(assert_pipelined_like_plain(plain, piped))
