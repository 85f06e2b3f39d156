"""Pipeline parallelism (LTX-Video adapter): the stage layers, run one after another, equal ComfyUI's
apply_model bit for bit (text-to-video, padded text masks, frame rates, image-to-video noise masks,
keyframe guides) and give the same LoRA gradients, also with activation checkpointing and real stage
boundaries (block inputs that are leaves requiring grad: where ComfyUI's in-place block would give
silently wrong gradients, MODEL-NOTES.md).

The models are ComfyUI's own LTXV classes (comfy.supported_models.LTXV) at a tiny config.
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from adapter_checks import (assert_every_lora_trained, assert_layers_equal_reference, assert_only_adapter,
                            assert_pipelined_like_plain, assert_refused, assert_same_lora_grads, lora_grads,
                            run_layers, two_process_runs, with_lora)
from PipeTrain.engine.config.checks import ConfigError
from trainable import ensure_trainable

_LTXV = next(f for f in fc.FAMILIES if f.name == "ltxv")


def _model(layers: int = 2):
    import comfy.supported_models

    model = comfy.supported_models.LTXV(dict(_LTXV.config, num_layers=layers)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def _prepare(model, batch: int = 2, latent=(128, 3, 4, 5), frame_rate=25.0, padded: bool = False,
             i2v: bool = False, keyframes: bool = False):
    """apply_model's inputs for cached items as engine.train.sample_order.collate returns them."""
    from PipeTrain.engine.train.objective import DiffusionObjective

    gen = torch.Generator().manual_seed(1)
    latents = torch.randn((batch, *latent), generator=gen)
    conds = []
    for _ in range(batch):
        mask = torch.ones(fc.T, dtype=torch.long)
        if padded:
            mask[-2:] = 0
        extras = {"attention_mask": mask, "frame_rate": frame_rate}
        if i2v:
            extras["denoise_mask"] = fc._first_frame_kept(*latent[1:])
        if keyframes:  # LTXVAddGuide: the last latent frame is a clean guide for frame 0
            extras["keyframe_idxs"] = _guide_positions(model, latent)
            mask = torch.ones(1, *latent[1:])
            mask[:, -1] = 0.0
            if keyframes == "dropped":  # guide tokens ComfyUI 0.33+ filters out (mask < 0)
                mask[:, -1, 0] = -1.0
            extras["denoise_mask"] = mask
        conds.append({"cross_attn": torch.randn((fc.T, _LTXV.text_width), generator=gen), "extras": extras})
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch))))


def _guide_positions(model, latent):
    """The pixel positions LTXVAddGuide records for a one-frame guide at frame 0, in the host's own
    layout (its patchifier's coordinates: [3, tokens] on 0.3.75, [3, tokens, 2] start/end later)."""
    from comfy.ldm.lightricks.model import latent_to_pixel_coords

    dm = model.diffusion_model
    _, coords = dm.patchifier.patchify(torch.zeros((1, latent[0], 1, *latent[2:])))
    return latent_to_pixel_coords(coords, dm.vae_scale_factors, causal_fix=True)[0]


def _run_layers(model, prepared):
    return run_layers(model, prepared, "ltxv")


CASES = {
    "t2v-odd-size": dict(model=dict(), cond=dict()),
    "one-item": dict(model=dict(), cond=dict(batch=1, latent=(128, 2, 3, 3))),
    "padded-text-mask": dict(model=dict(), cond=dict(padded=True)),
    "frame-rate-23.976": dict(model=dict(), cond=dict(frame_rate=24000 / 1001)),
    "i2v-noise-mask": dict(model=dict(), cond=dict(i2v=True)),  # per-token timesteps
    "keyframe-guide": dict(model=dict(), cond=dict(keyframes=True)),
    "keyframe-guide-dropped-tokens": dict(model=dict(), cond=dict(keyframes="dropped")),
    "one-block": dict(model=dict(layers=1), cond=dict()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    model = _model(**CASES[case]["model"])
    prepared = _prepare(model, **CASES[case]["cond"])
    assert_layers_equal_reference(model, prepared, "ltxv")


def test_conditioning_reaches_the_output(comfy):
    """The carried mask, frame rate, noise mask and keyframes change the prediction (none is dropped)."""
    model = _model()
    with torch.no_grad():
        base = _run_layers(model, _prepare(model))
        for change in (dict(padded=True), dict(frame_rate=12.0), dict(i2v=True), dict(keyframes=True)):
            assert (base - _run_layers(model, _prepare(model, **change))).abs().max() > 1e-5, change


def _staged_lora_grads(model, prepared, lora):
    """Loss and LoRA gradients as pipeline stages compute them: every layer gets its float inputs as
    fresh leaves that require grad (what DeepSpeed receives), and backward runs layer by layer."""
    from PipeTrain.engine.models import adapter_for
    from PipeTrain.engine.train.objective import native_loss
    from PipeTrain.engine.train.pipeline import _BoundarySafe

    adapter = adapter_for(model)
    layers = [_BoundarySafe(layer) for layer in adapter.layers(model)]
    model.zero_grad(set_to_none=True)
    acts, record = adapter.first_stage_inputs(prepared), []
    for layer in layers:
        leaves = tuple(t.detach().requires_grad_() if t.is_floating_point() else t for t in acts)
        acts = layer(leaves if record else acts)
        record.append((leaves, acts))
    loss = native_loss(acts, prepared.x0, prepared.scale)
    loss.backward()
    for (leaves, _), (_, outputs) in zip(reversed(record[1:]), reversed(record[:-1])):
        pairs = [(o, i.grad) for o, i in zip(outputs, leaves) if i.is_floating_point() and o.requires_grad]
        assert all(g is not None for _, g in pairs), "a stage input got no gradient (DeepSpeed would fail)"
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return loss.detach(), {n: None if p.grad is None else p.grad.clone() for n, p in lora.items()}


@pytest.mark.parametrize("checkpointing", ["off", "on"])
def test_stage_layers_give_comfyui_lora_gradients(comfy, checkpointing):
    """With a LoRA on every block linear, backward through the layers, plain and across simulated stage
    boundaries, with or without per-block activation checkpointing, gives apply_model's gradients."""
    model = _model(layers=3)
    targets, lora = with_lora(model)
    assert sum(t.startswith("transformer_blocks.") for t in targets) >= 3 * 8
    prepared = _prepare(model, i2v=True, padded=True)
    want, got = lora_grads(model, prepared, lora, "ltxv", checkpointing=checkpointing)
    assert_same_lora_grads(want, got)
    assert_same_lora_grads(want, _staged_lora_grads(model, prepared, lora))


def test_blocks_running_comfyui_in_place_forward_are_refused(comfy):
    """A model that was not made trainable (engine.patches.make_trainable) could still run ComfyUI's
    in-place block forward: the adapter refuses to cut it, since checkpointed stages would train on
    wrong gradients."""
    from PipeTrain.engine import patches
    from PipeTrain.engine.models import adapter_for

    model = _model()
    with pytest.raises(ConfigError, match="made trainable first"):
        adapter_for(model).layers(model)
    _prepare(model)  # probes and installs what the blocks need
    assert patches.is_trainable(model.diffusion_model)
    assert len(adapter_for(model).layers(model)) == 4


def test_unsupported_ltxv_inputs_are_refused(comfy):
    model = _model()
    # guiding_latent: a conditioning the adapter does not reproduce
    assert_refused(model, _prepare(model, batch=1), "guiding_latent", guiding_latent=torch.zeros(1))
    assert_refused(model, _prepare(model, batch=1), "attention mask", attention_mask=None)
    assert_refused(model, _prepare(model, batch=1), "frame_rate", frame_rate=torch.tensor([25.0]))


def test_adapter_for_picks_ltxv_only_for_ltxv(comfy):
    assert_only_adapter([_model()], "ltxv", (f for f in fc.FAMILIES if f.supported != "LTXV"))


@pytest.fixture(scope="module")
def ltxv_files(comfy, tmp_path_factory):
    """A tiny LTX-Video file (4 blocks) and an image-to-video cache: T5-shaped text with a padded
    attention mask, frame rate 24 and a first-frame noise mask on every item."""
    import tiny_detected

    root = tmp_path_factory.mktemp("tiny-ltxv")
    model = tiny_detected.write_model(root / "tiny_ltxv.safetensors", "ltxv", num_layers=4)
    mask = torch.ones(1, tiny_detected.TEXT_TOKENS, dtype=torch.long)
    mask[:, -1] = 0
    cache = tiny_detected.write_cache(root / "data", latent=(128, 2, 2, 2), text_width=_LTXV.text_width,
                                      extras={"attention_mask": mask, "frame_rate": 24.0,
                                              "denoise_mask": fc._first_frame_kept(2, 2, 2).unsqueeze(0)})
    return str(model), cache


@pytest.mark.slow
def test_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, ltxv_files, monkeypatch):
    """2 DeepSpeed gloo ranks, one stage each (the integer text mask and the float64 frame rate among
    the stage inputs): same losses and saved LoRA as one plain process."""
    import tiny_detected

    tiny_detected.use_tiny_detection(monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one thread per rank in both runs (a busy 2-core machine)
    plain, piped = two_process_runs(tmp_path, comfy_root, ltxv_files)
    assert "pipeline stage 2/2" in piped.log()
    # checked against apply_model before DeepSpeed built the stages (engine/models/stage_check.py)
    assert "pipeline check: the ltxv stage layers reproduce ComfyUI" in piped.log()
    assert_every_lora_trained(assert_pipelined_like_plain(plain, piped))
