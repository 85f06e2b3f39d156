"""engine/patches.py: out-of-place forwards for the in-place Flux-style and LTXV blocks.

Tiny random-init ComfyUI models (MODEL-NOTES.md tiny recipes), CPU, fp32, peft LoRA on every
linear layer of the blocks. Inputs are built as ComfyUI's sampler builds them: a cond dict through
`model.extra_conds`, `process_cond(...).concat([])`, then
`model.apply_model(xt, sigma, transformer_options={}, **kwargs)` (MODEL-NOTES "Common mechanics").
Checkpointing is the engine's own per-block wrapper (engine/memory.py).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
import torch
from torch import nn

from PipeTrain.engine import patches
from PipeTrain.engine.blocks import block_roots
from PipeTrain.engine.comfy_bootstrap import import_comfy
from PipeTrain.engine.memory import enable_activation_checkpointing

INPLACE_ERROR = "modified by an inplace operation"
SIGMA = 0.6


@dataclasses.dataclass(frozen=True)
class Case:
    arch: str                       # comfy.supported_models class
    unet_config: dict
    latent: tuple[int, ...]
    cond: Callable[[torch.Generator], dict]  # the cached cond item for extra_conds


def _randn(g, *shape):
    return torch.randn(*shape, generator=g)


_HUNYUAN = dict(image_model="hunyuan_video", in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=48,
                hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=1, depth_single_blocks=2, axes_dim=[8, 12, 12],
                theta=256, patch_size=[1, 2, 2], qkv_bias=True, guidance_embed=True, byt5=False, meanflow=False,
                use_cond_type_embedding=False, vision_in_dim=None)

CASES = {
    "flux": Case("Flux", dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=64,
                              hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=2, depth_single_blocks=2,
                              axes_dim=[8, 12, 12], theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True),
                 (1, 16, 8, 8), lambda g: dict(cross_attn=_randn(g, 1, 8, 64), pooled_output=_randn(g, 1, 32))),
    # Chroma and Flux2 feed the blocks precomputed modulation (the `modulation=False` branch).
    "chroma": Case("Chroma", dict(image_model="chroma", in_channels=64, out_channels=64, context_in_dim=48,
                                  hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=1, depth_single_blocks=2,
                                  axes_dim=[8, 12, 12], theta=10000, patch_size=2, qkv_bias=True, in_dim=64,
                                  out_dim=64, hidden_dim=32, n_layers=2),
                   (1, 16, 8, 8), lambda g: dict(cross_attn=_randn(g, 1, 8, 48), pooled_output=None)),
    "flux2": Case("Flux2", dict(image_model="flux2", axes_dim=[8, 8, 8, 8], num_heads=2, mlp_ratio=3.0, theta=2000,
                                out_channels=128, global_modulation=True, vec_in_dim=None, mlp_silu_act=True,
                                qkv_bias=False, ops_bias=False, default_ref_method="index", ref_index_scale=10.0,
                                in_channels=128, hidden_size=64, context_in_dim=96, patch_size=1, depth=1,
                                depth_single_blocks=2, guidance_embed=True),
                  (1, 128, 8, 8), lambda g: dict(cross_attn=_randn(g, 1, 8, 96), pooled_output=None)),
    "hunyuan_video": Case("HunyuanVideo", _HUNYUAN, (1, 16, 3, 8, 8),
                          lambda g: dict(cross_attn=_randn(g, 1, 8, 48), pooled_output=_randn(g, 1, 32))),
    # I2V "replace" mode: per-token-range modulation (modulation_dims), the slice-in-place apply_mod path.
    "hunyuan_video_guiding": Case("HunyuanVideo", _HUNYUAN, (1, 16, 3, 8, 8),
                                  lambda g: dict(cross_attn=_randn(g, 1, 8, 48), pooled_output=_randn(g, 1, 32),
                                                 guiding_frame_index=0)),
    "ltxv": Case("LTXV", dict(image_model="ltxv", in_channels=128, cross_attention_dim=64, attention_head_dim=32,
                              num_attention_heads=2, caption_channels=48, num_layers=2),
                 (1, 128, 3, 4, 4), lambda g: dict(cross_attn=_randn(g, 1, 8, 48),
                                                   attention_mask=torch.ones(1, 8, dtype=torch.long))),
}
WAN = Case("WAN21_T2V", dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=64,
                             ffn_dim=128, freq_dim=256, text_dim=48, out_dim=16, num_heads=2, num_layers=2,
                             window_size=(-1, -1), qk_norm=True, cross_attn_norm=True, eps=1e-6),
           (1, 16, 3, 8, 8), lambda g: dict(cross_attn=_randn(g, 1, 8, 48)))


@pytest.fixture(scope="module", autouse=True)
def comfy(comfy_root):
    import_comfy(comfy_root)
    import comfy.supported_models
    return comfy


@pytest.fixture(autouse=True)
def no_patch_leaks():
    patches.uninstall()
    yield
    patches.uninstall()


def build(case: Case, lora: bool = True, dtype: torch.dtype = torch.float32):
    """A seeded tiny model with explicit init (ComfyUI leaves weights as torch.empty) and a LoRA."""
    import comfy.supported_models as sm
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(0)
    config = getattr(sm, case.arch)(dict(case.unet_config))
    if dtype != torch.float32:
        config.set_inference_dtype(dtype, None)
    model = config.get_model({})
    dm = model.diffusion_model
    with torch.no_grad():
        for name, p in dm.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    dm.requires_grad_(False)
    if lora:
        roots = set(block_roots(dm))
        targets = [n for n, m in dm.named_modules() if isinstance(m, nn.Linear) and n.split(".")[0] in roots]
        inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=targets), dm)
        with torch.no_grad():
            for name, p in dm.named_parameters():
                p.requires_grad_("lora_" in name)
                if "lora_B" in name:  # peft starts B at zero: no gradient would reach A
                    p.normal_(0.0, 0.02)
    return model


def model_inputs(model, case: Case):
    g = torch.Generator().manual_seed(1)
    x0, noise = _randn(g, *case.latent), _randn(g, *case.latent)
    params = dict(case.cond(g), device=torch.device("cpu"), noise=noise, latent_image=x0, denoise_mask=None, seed=0)
    kwargs = {k: c.process_cond(batch_size=x0.shape[0], area=None).concat([])
              for k, c in model.extra_conds(**params).items()}
    sigma = torch.full((x0.shape[0],), SIGMA)
    return x0, model.model_sampling.noise_scaling(sigma, noise, x0), sigma, kwargs


def loss_of(model, inputs, xt=None):
    x0, xt0, sigma, kwargs = inputs
    out = model.apply_model(xt0 if xt is None else xt, sigma, transformer_options={}, **kwargs)
    return torch.nn.functional.mse_loss(out, x0), out


def gradients(model, inputs, xt_grad: bool) -> dict[str, torch.Tensor]:
    """LoRA gradients (and d loss / d xt when xt requires grad) of one forward + backward."""
    xt = inputs[1].detach().clone().requires_grad_(xt_grad)
    loss_of(model, inputs, xt)[0].backward()
    grads = {n: p.grad.detach().clone() for n, p in model.diffusion_model.named_parameters() if p.requires_grad}
    if xt_grad:
        grads["xt"] = xt.grad.detach().clone()
    model.diffusion_model.zero_grad(set_to_none=True)
    return grads


def max_diff(a: dict, b: dict) -> tuple[float, float]:
    """(max abs difference, max abs difference / max abs reference) over all gradient tensors."""
    abs_diff = max((a[k] - b[k]).abs().max().item() for k in a)
    return abs_diff, abs_diff / max(b[k].abs().max().item() for k in b)


# --- the hazard, and the patch removing it -------------------------------------------------------

@pytest.mark.parametrize("family", CASES)
def test_unpatched_lora_backward_hits_the_inplace_error(family):
    model = build(CASES[family])
    loss, _ = loss_of(model, model_inputs(model, CASES[family]))
    with pytest.raises(RuntimeError, match=INPLACE_ERROR):
        loss.backward()


# Half-precision weights too: the copies round to the residual's dtype where upstream's in-place
# op stored into it, so they must also agree bit for bit there (and fp16 runs the nan_to_num branch).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("family", CASES)
def test_patched_forward_is_bit_identical(family, dtype):
    model = build(CASES[family], dtype=dtype)
    inputs = model_inputs(model, CASES[family])
    with torch.no_grad():
        loss0, out0 = loss_of(model, inputs)
        assert patches.needs_patch(model.diffusion_model)
        patches.install()
        assert not patches.missing_patches(model.diffusion_model)
        loss1, out1 = loss_of(model, inputs)
    assert torch.equal(out0, out1) and torch.equal(loss0, loss1), (out0 - out1).abs().max()


@pytest.mark.parametrize("xt_grad", [False, True], ids=["lora", "lora+xt"])
@pytest.mark.parametrize("family", CASES)
def test_patched_checkpoint_gradients_equal_plain_gradients(family, xt_grad):
    patches.install()
    model = build(CASES[family])
    inputs = model_inputs(model, CASES[family])
    plain = gradients(model, inputs, xt_grad)
    assert all(torch.isfinite(g).all() for g in plain.values())
    assert all(g.abs().sum() > 0 for g in plain.values()), "every LoRA tensor (and xt) gets a gradient"
    assert enable_activation_checkpointing(model.diffusion_model) >= 2
    checkpointed = gradients(model, inputs, xt_grad)
    assert checkpointed.keys() == plain.keys()
    abs_diff, rel_diff = max_diff(checkpointed, plain)
    print(f"{family} xt_grad={xt_grad}: {len(plain)} tensors, max |ckpt - plain| {abs_diff:.3g} (rel {rel_diff:.3g})")
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-6, atol=1e-9, msg=name)


# LTXV with a latent that requires grad is the special case below.
@pytest.mark.parametrize("family,xt_grad", [(f, x) for f in CASES for x in (False, True) if (f, x) != ("ltxv", True)])
def test_unpatched_checkpoint_fails_loudly(family, xt_grad):
    """The block mutates its own checkpointed input. torch 2.13 reported CheckpointError (different
    recomputed metadata); torch 2.14 already reports the in-place error. Both are RuntimeErrors."""
    model = build(CASES[family])
    enable_activation_checkpointing(model.diffusion_model)
    with pytest.raises(RuntimeError):
        gradients(model, model_inputs(model, CASES[family]), xt_grad=xt_grad)


def test_unpatched_ltxv_checkpoint_never_gives_the_right_gradients():
    """With a latent that requires grad (TrainSampler does this) the checkpointed LTXV block
    mutates its own saved input. torch 2.13 recomputed from the mutated value without a word
    (MODEL-NOTES: rel. error 0.57 %); newer torch notices the version bump and raises. Either way
    only the patch gives usable gradients."""
    case = CASES["ltxv"]
    model = build(case)
    enable_activation_checkpointing(model.diffusion_model)
    try:
        wrong = gradients(model, model_inputs(model, case), xt_grad=True)
    except RuntimeError as exc:
        assert INPLACE_ERROR in str(exc)
        print(f"torch {torch.__version__}: unpatched LTXV checkpoint raised the in-place error")
        return
    patches.install()
    model = build(case)
    right = gradients(model, model_inputs(model, case), xt_grad=True)
    abs_diff, rel_diff = max_diff(wrong, right)
    print(f"torch {torch.__version__}: unpatched LTXV checkpoint vs patched: "
          f"max abs {abs_diff:.3g}, rel {rel_diff:.3g}")
    assert rel_diff > 1e-4


def test_apply_mod_copy_matches_upstream_bit_for_bit():
    import comfy.ldm.flux.layers as layers

    upstream, copy = layers.apply_mod, patches._families()[0].apply_mod
    g = torch.Generator().manual_seed(3)
    mult, add = _randn(g, 1, 2, 16), _randn(g, 1, 2, 16)
    for dtype in (torch.float32, torch.bfloat16):  # bf16 stream with fp32 modulation: same roundings
        x = _randn(g, 1, 12, 16).to(dtype)
        for dims in (None, [(0, 5, 0), (5, None, 1)], [(3, 7, 1)], [(0, None, 1)], [(6, 2, 0)]):
            # Without dims one modulation row serves every token; with dims, one row per range.
            m_mult, shift = (mult[:, :1], add[:, :1]) if dims is None else (mult, add)
            for m_add in (shift, None):
                expected = upstream(x.clone(), m_mult, m_add, dims)
                got = copy(x, m_mult, m_add, dims)
                assert got.dtype == expected.dtype and torch.equal(got, expected), (dtype, dims)


# --- which models need it ------------------------------------------------------------------------

def test_needs_patch_only_for_models_with_inplace_blocks():
    assert patches.needs_patch(build(CASES["flux"], lora=False).diffusion_model)
    assert patches.needs_patch(build(CASES["ltxv"], lora=False).diffusion_model)
    wan = build(WAN, lora=False).diffusion_model
    assert not patches.needs_patch(wan) and patches.missing_patches(wan) == []
    assert not patches.needs_patch(nn.Sequential(nn.Linear(2, 2)))


def test_install_is_idempotent_and_uninstall_restores():
    import comfy.ldm.flux.layers as layers
    import comfy.ldm.lightricks.model as ltxv

    originals = (layers.apply_mod, layers.DoubleStreamBlock.forward, layers.SingleStreamBlock.forward,
                 ltxv.BasicTransformerBlock.forward)
    flux = build(CASES["flux"], lora=False).diffusion_model
    assert patches.missing_patches(flux) == ["comfy.ldm.flux.layers.DoubleStreamBlock.forward",
                                             "comfy.ldm.flux.layers.SingleStreamBlock.forward",
                                             "comfy.ldm.flux.layers.apply_mod"]
    first = patches.install()
    assert len(first) == 4 and patches.install() == first
    assert layers.DoubleStreamBlock.forward is not originals[1] and patches.missing_patches(flux) == []
    assert patches.check_upstream() == []  # checks the remembered originals, not our copies
    patches.uninstall()
    assert (layers.apply_mod, layers.DoubleStreamBlock.forward, layers.SingleStreamBlock.forward,
            ltxv.BasicTransformerBlock.forward) == originals


# --- the upstream-change detector ----------------------------------------------------------------

def test_comfy_sources_match_the_copies():
    """Fails when ComfyUI changes a replaced function: update engine/patches_*.py, then its digest."""
    assert patches.check_upstream(strict=True) == []
    for fam in patches._families():
        # every upstream function a copy was made from is pinned by a digest
        assert {q for _, copied_from in fam.REPLACEMENTS.values() for q in copied_from} == set(fam.UPSTREAM_SHA256)
        for qualname, digest in fam.UPSTREAM_SHA256.items():
            assert patches.source_digest(patches._upstream(fam.MODULE, qualname)) == digest, qualname


def _changed_forward(self, img, txt, vec, pe, attn_mask=None, modulation_dims_img=None,
                     modulation_dims_txt=None, transformer_options={}):
    return img * 2, txt  # stands in for an upstream edit


def test_changed_source_error_names_the_function():
    import comfy.ldm.flux.layers as layers

    name = "comfy.ldm.flux.layers.DoubleStreamBlock.forward"
    digest = patches._families()[0].UPSTREAM_SHA256["DoubleStreamBlock.forward"]
    patches.check_source(layers.DoubleStreamBlock.forward, digest, name)  # the real one passes
    with pytest.raises(patches.UpstreamChanged, match=r"ComfyUI changed comfy\.ldm\.flux\.layers\.DoubleStream"
                                                      r"Block\.forward; PipeTrain's out-of-place copy") as err:
        patches.check_source(_changed_forward, digest, name)
    assert patches.comfy_version() in str(err.value) and "0.3.75" in str(err.value)
    # Re-indenting or re-wrapping is not a change; any other edit is.
    src = "def f(a, b):\n    return a + b\n"
    assert patches.text_digest(src) == patches.text_digest("    def f(a,  b):\n\n        return a + b   \n")
    assert patches.text_digest(src) != patches.text_digest(src.replace("+", "-"))


def test_strict_install_refuses_a_changed_function_and_swaps_nothing(monkeypatch):
    import comfy.ldm.flux.layers as layers

    monkeypatch.setattr(layers.DoubleStreamBlock, "forward", _changed_forward)
    with pytest.raises(patches.UpstreamChanged, match=r"DoubleStreamBlock\.forward") as err:
        patches.install(strict=True)
    assert "SingleStreamBlock" not in str(err.value)
    assert patches.installed() == [] and layers.DoubleStreamBlock.forward is _changed_forward


def test_lenient_install_skips_only_the_changed_function(monkeypatch):
    import comfy.ldm.flux.layers as layers

    monkeypatch.setattr(layers.DoubleStreamBlock, "forward", _changed_forward)
    with pytest.warns(UserWarning, match=r"ComfyUI changed comfy\.ldm\.flux\.layers\.DoubleStreamBlock\.forward"):
        done = patches.install(strict=False)
    assert layers.DoubleStreamBlock.forward is _changed_forward  # never applied over a changed upstream
    assert "comfy.ldm.flux.layers.DoubleStreamBlock.forward" not in done
    assert "comfy.ldm.lightricks.model.BasicTransformerBlock.forward" in done
    assert "comfy.ldm.flux.layers.SingleStreamBlock.forward" in done
    flux = build(CASES["flux"], lora=False).diffusion_model
    assert patches.missing_patches(flux) == ["comfy.ldm.flux.layers.DoubleStreamBlock.forward"]
    assert patches.missing_patches(build(CASES["ltxv"], lora=False).diffusion_model) == []
    # The engine's single call: a Flux model must not train on the changed block; LTXV still may.
    with pytest.warns(UserWarning), pytest.raises(patches.UpstreamChanged, match=r"DoubleStreamBlock\.forward") as err:
        patches.ensure_patched(flux)
    assert "Flux, Flux Kontext, Chroma" in str(err.value)
    with pytest.warns(UserWarning):  # the warning still names the changed function
        done = patches.ensure_patched(build(CASES["ltxv"], lora=False).diffusion_model)
    assert "comfy.ldm.lightricks.model.BasicTransformerBlock.forward" in done


def test_ensure_patched_refuses_blocks_wrapped_before_install():
    """engine/memory.py binds each block's forward when it wraps it: wrapping first keeps upstream's."""
    flux = build(CASES["flux"], lora=False).diffusion_model
    enable_activation_checkpointing(flux)
    with pytest.raises(RuntimeError, match=r"4 blocks \(first: double_blocks\.0\) were wrapped before"):
        patches.ensure_patched(flux)
    fresh = build(CASES["flux"], lora=False).diffusion_model
    patches.ensure_patched(fresh)
    enable_activation_checkpointing(fresh)
    assert patches.stale_blocks(fresh) == []


def test_ensure_patched_installs_only_for_models_that_need_it():
    assert patches.ensure_patched(build(WAN, lora=False).diffusion_model) == []
    assert len(patches.ensure_patched(build(CASES["hunyuan_video"], lora=False).diffusion_model)) == 4
