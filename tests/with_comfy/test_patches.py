"""engine/patches: the behavioural probe decides, per block class, upstream's forward or one of ours.

Tiny random-init ComfyUI models (tests/family_configs.py), CPU, fp32, on whichever ComfyUI the
suite runs against (0.3.75 and 0.33.0 in CI). What must hold on every supported version:
- the families whose blocks update the residual in place (Flux-style, Hunyuan, LTXV) are found
  unsafe with upstream's forward and get an out-of-place forward written for this version, whose
  output is bit-identical to upstream's and whose checkpointed LoRA gradients equal plain ones;
- a family whose blocks are fine (Wan) keeps upstream's forward, nothing installed;
- a block nobody fixed is refused before training, naming the class and the ComfyUI version;
- a fix that changes the output is never admitted; verdicts are cached per (class, version, ...).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import family_configs as fc
from PipeTrain.engine import patches
from PipeTrain.engine.patches import fixes, probe, verdicts
from trainable import comfy, no_fixes_installed, trained_model  # noqa: F401 - the two fixtures

pytestmark = pytest.mark.core

IN_PLACE = ["flux", "chroma", "flux2", "hunyuan_video", "hunyuan_video_guiding", "hunyuan_image21", "ltxv",
            "ltxv_i2v"]


def family(name: str) -> fc.Family:
    if name == "hunyuan_video_guiding":  # I2V "replace": per-token-range modulation (apply_mod's slice path)
        base = family("hunyuan_video")
        return dataclasses.replace(base, name=name, extras=lambda g: {**base.extras(g), "guiding_frame_index": 0})
    return next(f for f in fc.FAMILIES if f.name == name)


def _forward(model, fam):
    from PipeTrain.engine.train.objective import DiffusionObjective

    latents, conds = fc.batch(fam)
    objective = DiffusionObjective(model, seed=0, **fam.train)
    return lambda: objective(latents, conds, [0])


def _denoised(model, fam):
    from PipeTrain.engine.train.objective import DiffusionObjective, transformer_options

    latents, conds = fc.batch(fam)
    prepared = DiffusionObjective(model, seed=0, **fam.train).prepare(latents, conds, [0])
    with torch.no_grad():
        return model.apply_model(prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma),
                                 **prepared.kwargs)


@pytest.mark.parametrize("name", IN_PLACE)
def test_in_place_family_gets_a_fix_for_this_version_with_upstreams_output(name):
    fam = family(name)
    upstream = _denoised(fc.build(fam), fam)  # nothing of ours installed
    model = fc.build(fam)
    chosen = patches.make_trainable(model.diffusion_model, _forward(model, fam))
    version = patches.comfy_version()
    used = {n for use in chosen.values() if use != "upstream" for n in use.split(" + ")}
    assert used, chosen
    for fix in fixes.active():
        assert fix.written_for(version), (fix.name, version)
    assert torch.equal(_denoised(model, fam), upstream)  # bit-identical to ComfyUI's own forward


@pytest.mark.parametrize("name", ["flux", "hunyuan_video_guiding", "ltxv", "wan21_t2v"])
def test_checkpointed_lora_gradients_equal_plain_ones(name):
    """peft LoRA on every linear, the engine's own checkpoint wrapper (engine/memory/activation_checkpointing.py)."""
    fam = family(name)
    grads = {}
    for mode in ("off", "on"):
        model, objective, batch = trained_model(fam, checkpointing=mode)
        loss = objective(*batch, [0])
        loss.backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.diffusion_model.named_parameters() if p.grad is not None}
    assert grads["off"] and grads["off"].keys() == grads["on"].keys()
    for key, plain in grads["off"].items():
        assert torch.allclose(grads["on"][key], plain, rtol=1e-5, atol=1e-7), key


def test_upstream_in_place_forward_is_found_unsafe():
    fam = family("flux")
    model = fc.build(fam)
    wanted = patches.trainable.first_blocks(model.diffusion_model)
    captured = probe.capture(_forward(model, fam), wanted)
    assert set(captured) == set(wanted)
    outcomes = {cls.__name__: probe.probe(cap) for cls, cap in captured.items()}
    assert not outcomes["DoubleStreamBlock"].safe and not outcomes["SingleStreamBlock"].safe
    assert "backward fails" in outcomes["DoubleStreamBlock"].reason or "in place" in outcomes["DoubleStreamBlock"].reason


def test_safe_family_keeps_upstream_and_installs_nothing():
    fam = family("wan21_t2v")
    model = fc.build(fam)
    chosen = patches.make_trainable(model.diffusion_model, _forward(model, fam))
    assert set(chosen.values()) == {"upstream"} and fixes.active() == []
    assert patches.is_trainable(model.diffusion_model)


def test_host_training_flag_is_set_where_the_host_has_one():
    import comfy.model_management as mm

    fam = family("wan21_t2v")
    model = fc.build(fam)
    had = hasattr(mm, "in_training")
    patches.make_trainable(model.diffusion_model, _forward(model, fam))
    assert patches.training_mode() is (True if had else None)


# ---- synthetic blocks: what no ComfyUI release has yet ------------------------------------------------
class _InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        x += self.b(torch.tanh(self.a(x)))
        return x


class _Fine(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


class _Net(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.blocks = nn.ModuleList([block(), block()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_unfixed_in_place_block_is_refused_with_class_and_version():
    net = _Net(_InPlace)
    with pytest.raises(patches.UnsafeBlock) as err:
        patches.make_trainable(net, lambda: net(torch.randn(2, 4, 8)))
    text = str(err.value)
    assert "_InPlace" in text and f"ComfyUI {patches.comfy_version()}" in text and "What to do" in text
    assert not patches.is_trainable(net)


def test_a_fix_that_changes_the_output_is_not_admitted(monkeypatch):
    def wrong(self, x):  # out of place, trains fine, but not upstream's math
        return x + 2 * self.b(torch.tanh(self.a(x)))
    bad = fixes.Fix("wrong test fix", __name__, ("_InPlace",), {"_InPlace.forward": wrong}, since="0.0.1")
    monkeypatch.setattr(fixes, "all_fixes", lambda: [bad])
    net = _Net(_InPlace)
    with pytest.raises(patches.UnsafeBlock, match=r"'wrong test fix' .* does not fit: its output differs"):
        patches.make_trainable(net, lambda: net(torch.randn(2, 4, 8)))
    assert _InPlace.forward is not wrong


def test_a_right_fix_is_admitted_and_bit_identical(monkeypatch):
    good = fixes.Fix("right test fix", __name__, ("_InPlace",), {"_InPlace.forward": _Fine.forward}, since="0.0.1")
    monkeypatch.setattr(fixes, "all_fixes", lambda: [good])
    x = torch.randn(2, 4, 8)
    net = _Net(_InPlace)
    with torch.no_grad():
        want = net(x.clone())
    assert patches.make_trainable(net, lambda: net(torch.randn(2, 4, 8))) == {f"{__name__}._InPlace": "right test fix"}
    assert torch.equal(net(x.clone()), want)


def test_a_fix_written_for_other_releases_is_not_tried(monkeypatch):
    later = fixes.Fix("future fix", __name__, ("_InPlace",), {"_InPlace.forward": _Fine.forward}, since="999.0.0")
    monkeypatch.setattr(fixes, "all_fixes", lambda: [later])
    net = _Net(_InPlace)
    with pytest.raises(patches.UnsafeBlock, match=r"written for other ComfyUI releases \('future fix' for ComfyUI 999"):
        patches.make_trainable(net, lambda: net(torch.randn(2, 4, 8)))


def test_silently_wrong_checkpoint_gradients_are_caught():
    """An input written in place after its last use: plain backward runs (nothing saved it), but the
    checkpoint's recompute starts from the written value (the LTXV trap, MODEL-NOTES.md)."""
    class Late(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)

        def forward(self, x, scale):
            out = self.a(x + scale)
            scale.mul_(2.0)
            return out
    block = Late()
    cap = probe.Captured(block, (torch.randn(2, 8), torch.full((8,), 0.5)), {})
    outcome = probe.probe(cap)
    assert not outcome.safe and "in place" in outcome.reason


def test_verdicts_are_cached_per_class_and_version(tmp_path, monkeypatch):
    calls = []
    net = _Net(_Fine)

    def run():
        calls.append(1)
        net(torch.randn(2, 4, 8))
    cache = tmp_path / "verdicts.json"
    assert patches.make_trainable(net, run, cache_file=cache) == {f"{__name__}._Fine": "upstream"}
    verdicts._MEMO.clear()  # a new process: only the file remains
    patches.make_trainable(_Net(_Fine), run, cache_file=cache)
    assert len(calls) == 1 and cache.is_file()
    verdicts._MEMO.clear()
    monkeypatch.setattr(patches.trainable, "comfy_version", lambda: "9.9.9")
    patches.make_trainable(_Net(_Fine), run, cache_file=cache)
    assert len(calls) == 2  # another ComfyUI version is probed again


def test_wrapped_blocks_are_refused():
    from PipeTrain.engine.memory.activation_checkpointing import enable_checkpointing

    net = _Net(_Fine)
    enable_checkpointing(net, "on")
    with pytest.raises(RuntimeError, match="before wrapping them"):
        patches.make_trainable(net, lambda: net(torch.randn(2, 4, 8)))


def test_kitchen_backward_equals_autograd_through_the_eager_code():
    """engine/patches/kitchen.py: the fused op's backward is the eager implementation's vjp."""
    from PipeTrain.engine.patches import kitchen

    ops = kitchen.candidates()
    if "rms_rope_split_half" not in ops:
        pytest.skip("needs a ComfyUI tree with comfy-kitchen's rms_rope_split_half (0.33 and later, ../shared/comfyui-0.33.0); this tree has none")
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 6, 8, generator=gen) for _ in range(2))
    freqs = torch.randn(1, 1, 6, 4, 2, 2, generator=gen)
    scale = torch.rand(8, generator=gen) + 0.5
    inputs = [t.clone().requires_grad_(True) for t in (q, k, scale)]
    want_out = ops["rms_rope_split_half"](inputs[0], inputs[1], freqs, inputs[2], None, 1e-6)
    weights = [torch.randn(o.shape, generator=gen) for o in want_out]
    want = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want_out, weights)), inputs)
    fix = next(f for f in fixes.all_fixes() if f.name == "comfy-kitchen backward")
    fixes.install(fix)
    got_inputs = [t.clone().requires_grad_(True) for t in (q, k, scale)]
    got_out = torch.ops.comfy_kitchen.rms_rope_split_half(got_inputs[0], got_inputs[1], freqs, got_inputs[2], None, 1e-6)
    got = torch.autograd.grad(sum((o * w).sum() for o, w in zip(got_out, weights)), got_inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    fixes.uninstall(fix)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        out = torch.ops.comfy_kitchen.rms_rope_split_half(q.clone().requires_grad_(True), k, freqs, scale, None, 1e-6)
        out[0].sum().backward()


def test_the_probe_leaves_the_callers_random_state_alone():
    """A run draws the same LoRA init and noise whether its verdicts came from the probe or the cache."""
    net = _Net(_Fine)
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    patches.make_trainable(net, lambda: net(torch.ones(2, 4, 8)))  # probes (nothing cached yet)
    assert torch.equal(torch.rand(3), want)
