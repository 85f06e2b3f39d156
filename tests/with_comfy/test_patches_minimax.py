"""engine/patches/minimax.py: MiniMax H3's block modulation out of place (ComfyUI 0.33 and later).

- Our helpers give what upstream's in-place `_mod_scale_shift` / `_mod_gate` give, bit for bit, in
  fp32 and bf16, for every row kind a packed sequence has (one mod row per segment, a per-token
  index tensor for masked rows, empty segments, rows outside every segment, overlapping segments),
  and leave their inputs untouched.
- The fused rope MiniMax's attention calls in training mode (`rms_rope_split_half`, a partial rope:
  `rot_dim` below the head size) gets the gradients of comfy-kitchen's eager code from kitchen.py.
- Without our fix the block is refused before training, naming the class, the version and what to do.
The whole-model checks (loss falls, the LoRA loads in ComfyUI, checkpointed gradients equal plain,
the picked forward gives upstream's output) are in test_families_033.py. On a ComfyUI without MiniMax
H3 (0.3.75) these tests skip, naming what is missing.
"""
from __future__ import annotations

import re

import pytest
import torch

from trainable import host_module
from trainable import comfy, no_fixes_installed  # noqa: F401 - the fixtures every test here uses

pytestmark = pytest.mark.core


@pytest.fixture
def upstream():
    return host_module("comfy.ldm.minimax.model")


def _segments(n):
    per_token = torch.tensor([3, 5, 5, 0])  # masked video rows: a mod row per token
    return {"ordered": [(0, 3, 1), (3, 3, 4), (3, 7, per_token), (7, 9, 2)],  # rows 9.. in no segment
            "overlapping": [(5, 9, 1), (0, 6, 2), (8, n + 4, 3)]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["ordered", "overlapping"])
def test_modulation_equals_upstreams_in_place_helpers(upstream, dtype, layout):
    from PipeTrain.engine.patches import minimax

    gen = torch.Generator().manual_seed(0)
    n, width = 11, 8
    x, h, other = (torch.randn(n, width, generator=gen).to(dtype) for _ in range(3))
    shift, scale, gate = (torch.randn(6, width, generator=gen) for _ in range(3))  # fp32 rows, as adaLN gives
    segments = _segments(n)[layout]
    kept = [t.clone() for t in (x, h, other)]

    got = minimax.mod_scale_shift(h, shift, scale, segments)
    assert torch.equal(got, upstream._mod_scale_shift(h.clone(), shift, scale, segments))
    got = minimax.mod_gate(x, gate, other, segments)
    assert torch.equal(got, upstream._mod_gate(x.clone(), gate, other, segments))
    assert got.dtype == dtype
    assert all(torch.equal(t, k) for t, k in zip((x, h, other), kept)), "an input was written"


def test_partial_rope_backward_equals_autograd_through_the_eager_code(upstream):
    """The call MiniMax's Attention makes in training mode: q and k [1, S, heads, head_dim], a rotation
    table over the first rot_dim of head_dim, per-head RMSNorm weights for q and k."""
    from PipeTrain.engine.patches import fixes, kitchen

    ops = kitchen.candidates()
    if "rms_rope_split_half" not in ops:
        pytest.skip("this ComfyUI's comfy-kitchen has no rms_rope_split_half")
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 7, 2, 16, generator=gen) for _ in range(2))
    angles = torch.randn(7, 12, generator=gen)  # rot_dim 12 of 16
    table = upstream.rope_rotation_table(torch.cat((angles[:, :6], angles[:, :6]), dim=-1), torch.float32)
    q_scale, k_scale = (torch.rand(16, generator=gen) + 0.5 for _ in range(2))

    def grads(op):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, q_scale, k_scale)]
        out = op(leaves[0], leaves[1], table, leaves[2], leaves[3], epsilon=1e-5, rot_dim=12)
        weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(1)) for o in out]
        return torch.autograd.grad(sum((o * w).sum() for o, w in zip(out, weights)), leaves)

    want = grads(ops["rms_rope_split_half"])
    fixes.install(next(f for f in fixes.all_fixes() if f.name == "comfy-kitchen backward"))
    for got, expected in zip(grads(torch.ops.comfy_kitchen.rms_rope_split_half), want):
        torch.testing.assert_close(got, expected)


def test_without_our_fix_the_block_is_refused_before_training(upstream, monkeypatch):
    import family_configs as fc
    import family_configs_033 as f33
    from PipeTrain.engine import patches
    from PipeTrain.engine.patches import fixes
    from trainable import make_trainable

    family = next(f for f in f33.FAMILIES if f.name == "minimax_h3_t2i")
    everything = fixes.all_fixes()
    assert make_trainable(fc.build(family), *fc.batch(family)) == {
        "comfy.ldm.minimax.model.DiTBlock": "comfy-kitchen backward + minimax-mod 0.33"}
    fixes.uninstall_all()
    monkeypatch.setattr(fixes, "all_fixes", lambda: [f for f in everything if f.name != "minimax-mod 0.33"])
    model = fc.build(family)
    with pytest.raises(patches.UnsafeBlock) as err:
        make_trainable(model, *fc.batch(family))
    text = str(err.value)
    assert "comfy.ldm.minimax.model.DiTBlock" in text and f"ComfyUI {patches.comfy_version()}" in text
    assert re.search("in ?place", text) and "What to do" in text
    assert not patches.is_trainable(model.diffusion_model)


def test_checkpointed_gradients_of_every_block_linear_equal_plain_ones(upstream):
    """peft LoRA on every block linear (adaLN projections too: their scale, shift and gate rows are what
    upstream applies in place), plain and under the engine's checkpoint wrapper."""
    import family_configs_033 as f33
    from trainable import trained_model

    family = next(f for f in f33.FAMILIES if f.name == "minimax_h3_t2v")
    grads = {}
    for mode in ("off", "on"):
        model, objective, batch = trained_model(family, checkpointing=mode)
        objective(*batch, [0]).backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.diffusion_model.named_parameters() if p.grad is not None}
    assert any("adaln_proj.linear.lora_A" in n and g.abs().max() > 0 for n, g in grads["off"].items())
    assert grads["off"] and grads["off"].keys() == grads["on"].keys()
    for key, plain in grads["off"].items():
        assert torch.allclose(grads["on"][key], plain, rtol=1e-5, atol=1e-7), key
