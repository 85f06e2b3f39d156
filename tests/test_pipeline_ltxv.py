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
from engine_runs import loss_and_lora_grads, trainable_lora
from PipeTrain.engine.config import ConfigError, LoraSpec

_LTXV = next(f for f in fc.FAMILIES if f.name == "ltxv")


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


def _model(layers: int = 2):
    import comfy.supported_models
    from PipeTrain.engine.patches import ensure_patched

    model = comfy.supported_models.LTXV(dict(_LTXV.config, num_layers=layers)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    ensure_patched(model.diffusion_model)  # what the engine trains with (out-of-place blocks)
    return model


def _prepare(model, batch: int = 2, latent=(128, 3, 4, 5), frame_rate=25.0, padded: bool = False,
             i2v: bool = False, keyframes: bool = False):
    """apply_model's inputs for cached items as engine.data.collate returns them."""
    from PipeTrain.engine.objective import DiffusionObjective

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
        if keyframes:  # LTXVAddGuide: pixel positions of the last latent frame's tokens (a guide at frame 0)
            _, _, h, w = latent
            hh, ww = torch.meshgrid(torch.arange(h) * 32, torch.arange(w) * 32, indexing="ij")
            extras["keyframe_idxs"] = torch.stack([torch.zeros(h * w, dtype=torch.long), hh.flatten(), ww.flatten()])
        conds.append({"cross_attn": torch.randn((fc.T, _LTXV.text_width), generator=gen), "extras": extras})
    return DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(batch)))


def _reference(model, prepared):
    from PipeTrain.engine.objective import transformer_options

    return model.apply_model(prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma),
                             **prepared.kwargs)


def _run_layers(model, prepared):
    from PipeTrain.engine.models import adapter_for

    adapter = adapter_for(model)
    assert adapter.name == "ltxv"
    acts = tuple(t.contiguous() for t in adapter.first_stage_inputs(prepared))  # as engine/pipeline.py feeds them
    for layer in adapter.layers(model):
        acts = layer(acts)
        # DeepSpeed sends every tensor a stage returns with torch.distributed, which needs contiguous ones.
        assert all(t.is_contiguous() for t in (acts if isinstance(acts, tuple) else (acts,))), type(layer)
    return acts


CASES = {
    "t2v-odd-size": dict(model=dict(), cond=dict()),
    "one-item": dict(model=dict(), cond=dict(batch=1, latent=(128, 2, 3, 3))),
    "padded-text-mask": dict(model=dict(), cond=dict(padded=True)),
    "frame-rate-23.976": dict(model=dict(), cond=dict(frame_rate=24000 / 1001)),
    "i2v-noise-mask": dict(model=dict(), cond=dict(i2v=True)),  # per-token timesteps
    "keyframe-guide": dict(model=dict(), cond=dict(keyframes=True)),
    "one-block": dict(model=dict(layers=1), cond=dict()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    model = _model(**CASES[case]["model"])
    prepared = _prepare(model, **CASES[case]["cond"])
    with torch.no_grad():
        reference = _reference(model, prepared)
        acts = _run_layers(model, prepared)
    assert torch.equal(acts, reference)


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
    from PipeTrain.engine.objective import native_loss
    from PipeTrain.engine.pipeline import _BoundarySafe

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
    from PipeTrain.engine.checkpointing import enable_checkpointing
    from PipeTrain.engine.lora import inject_lora

    model = _model(layers=3)
    targets = inject_lora(model.diffusion_model, LoraSpec(rank=4, targets="all_linear"))
    assert sum(t.startswith("transformer_blocks.") for t in targets) >= 3 * 8
    lora = trainable_lora(model)
    prepared = _prepare(model, i2v=True, padded=True)
    ref_loss, ref = loss_and_lora_grads(model, prepared, lora, lambda: _reference(model, prepared))
    if checkpointing == "on":
        enable_checkpointing(model.diffusion_model, "on")  # as engine/memory.py does before the stages exist
    loss, got = loss_and_lora_grads(model, prepared, lora, lambda: _run_layers(model, prepared))
    staged_loss, staged = _staged_lora_grads(model, prepared, lora)
    assert torch.equal(loss, ref_loss) and torch.equal(staged_loss, ref_loss)
    assert got.keys() == ref.keys() and all(g.abs().sum() > 0 for g in ref.values())
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], msg=n)
        torch.testing.assert_close(staged[n], ref[n], msg=n)


def test_blocks_running_comfyui_in_place_forward_are_refused(comfy):
    """Without PipeTrain's out-of-place block forward (ensure_patched), the adapter refuses to cut the
    model: checkpointed stages would train on wrong gradients."""
    from PipeTrain.engine import patches
    from PipeTrain.engine.models import adapter_for

    model = _model()
    patches.uninstall()
    try:
        with pytest.raises(ConfigError, match="out-of-place"):
            adapter_for(model).layers(model)
    finally:
        patches.install(strict=True)
    assert len(adapter_for(model).layers(model)) == 4


def test_unsupported_ltxv_inputs_are_refused(comfy):
    from PipeTrain.engine.models import adapter_for

    model = _model()
    adapter = adapter_for(model)
    prepared = _prepare(model, batch=1)
    prepared.kwargs["guiding_latent"] = torch.zeros(1)  # a conditioning the adapter does not reproduce
    with pytest.raises(ConfigError, match="guiding_latent"):
        adapter.first_stage_inputs(prepared)
    prepared = _prepare(model, batch=1)
    prepared.kwargs.pop("attention_mask")
    with pytest.raises(ConfigError, match="attention mask"):
        adapter.first_stage_inputs(prepared)
    prepared = _prepare(model, batch=1)
    prepared.kwargs["frame_rate"] = torch.tensor([25.0])
    with pytest.raises(ConfigError, match="frame_rate"):
        adapter.first_stage_inputs(prepared)


def test_adapter_for_picks_ltxv_only_for_ltxv(comfy):
    from PipeTrain.engine.models import ADAPTERS, adapter_for

    model = _model()
    assert adapter_for(model).name == "ltxv"
    assert [n for n, a in ADAPTERS.items() if a.matches(model)] == ["ltxv"]
    for family in fc.FAMILIES:  # every other family's tiny model (ComfyUI's own classes)
        if family.supported != "LTXV":
            assert not ADAPTERS["ltxv"].matches(fc.build(family)), family.name


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
    from engine_runs import assert_same_lora, pipeline_config, run_to_end

    tiny_detected.use_tiny_detection(monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one thread per rank in both runs (a busy 2-core machine)
    plain = run_to_end(pipeline_config(tmp_path / "plain", comfy_root, ltxv_files, 1, 1, 1))
    piped = run_to_end(pipeline_config(tmp_path / "piped", comfy_root, ltxv_files, 2, 2, 1))
    assert "pipeline stage 2/2" in piped.log()
    assert plain.losses() == pytest.approx(piped.losses(), rel=1e-5, abs=1e-7)
    a = assert_same_lora(plain.cfg.run_dir, piped.cfg.run_dir, rtol=1e-4, atol=1e-5)
    moved = [k for k in a if k.endswith("lora_B.weight") and a[k].abs().sum() > 0]
    assert len(moved) == len([k for k in a if k.endswith("lora_B.weight")]), "a stage's LoRA never trained"
