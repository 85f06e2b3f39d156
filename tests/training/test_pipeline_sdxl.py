"""Pipeline parallelism for ComfyUI's UNet (SDXL, and SD1.5 through the same adapter): the stage
layers equal apply_model bit for bit and give the same LoRA gradients; the skip tensors leave the
stage tuple at the output block that uses them; and a 2-stage DeepSpeed pipeline (2 gloo
processes) trains like one process at gas 1 and 4.

ComfyUI's detection pins SDXL's widths (320 channels, 2048-wide context, a 2816 adm vector), so the
engine runs use the smallest file it loads as model_base.SDXL: KOALA-700M's transformer depths
(0, 2, 5) at 320 channels on every level, no output-block attention (68 M parameters).
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from adapter_checks import assert_layers_equal_reference, assert_lora_grads_equal_reference
from engine_runs import assert_same_lora, pipeline_config, run_all_to_end
from PipeTrain.engine.config.checks import ConfigError
from trainable import ensure_trainable

SDXL = next(f for f in fc.FAMILIES if f.name == "sdxl")


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only contend on the shared 2-core machine
    yield
    torch.set_num_threads(threads)


def _sd15(latent=(4, 8, 8)):
    from tools.tiny_assets import UNET_CONFIG  # the demo's SD1.5 UNet: no middle block

    return fc.Family("sd15", "SD15", dict(UNET_CONFIG), latent, 768, "t2i")


def _model(family):

    model = fc.build(family)
    return model


def _prepared(model, family, items: int = 2):
    from PipeTrain.engine.train.objective import DiffusionObjective

    batches = [fc.batch(family, seed=i + 1) for i in range(items)]
    latents = torch.cat([b[0] for b in batches])
    conds = [b[1][0] for b in batches]
    return ensure_trainable(model, DiffusionObjective(model, seed=3).prepare(latents, conds, list(range(items))))


CASES = {
    "sdxl": SDXL,
    "sdxl-odd-size": fc.Family("sdxl", "SDXL", SDXL.config, (4, 9, 11), 64, "t2i", SDXL.extras),  # upsample to odd
    "sd15-no-middle-block": _sd15(),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_layers_equal_comfyui_forward(comfy, case):
    """Running the adapter's layers one after another gives apply_model's output bit for bit."""
    family = CASES[case]
    model = _model(family)
    prepared = _prepared(model, family)
    assert ("y" in prepared.kwargs) == (family.supported == "SDXL")
    assert_layers_equal_reference(model, prepared, "unet")


def test_skips_travel_only_until_the_output_block_that_pops_them(comfy):
    """Each input block adds one tensor to the stage tuple, each output block removes one, and the
    head gets just h, xt and sigma (emb and context end at the last output block)."""
    from PipeTrain.engine.models import adapter_for

    model = _model(SDXL)
    dm = model.diffusion_model
    adapter = adapter_for(model)
    acts = adapter.first_stage_inputs(_prepared(model, SDXL))
    sizes = []
    with torch.no_grad():
        for layer in adapter.layers(model):
            acts = layer(acts)
            sizes.append(len(acts) if isinstance(acts, tuple) else 1)
    n_in, n_out = len(dm.input_blocks), len(dm.output_blocks)
    assert len(sizes) == 1 + n_in + 1 + n_out + 1
    # embedding: emb, context, xt, sigma, xc; input block i leaves i + 1 skips
    assert sizes[:1 + n_in] == [5] + [4 + i + 1 for i in range(n_in)]
    assert sizes[1 + n_in] == 4 + n_in + 1  # middle: the skips and h
    assert sizes[2 + n_in:-2] == [4 + n_in - j for j in range(n_out - 1)]
    assert sizes[-2:] == [3, 1]


def test_stage_layers_give_comfyui_lora_gradients(comfy):
    """With a LoRA on every block linear, backward through the layers gives apply_model's gradients."""
    assert_lora_grads_equal_reference(_model(SDXL), lambda model: _prepared(model, SDXL), "unet",
                                      ("input_blocks.", "middle_block.", "output_blocks."))


def test_unet_variants_the_adapter_does_not_reproduce_are_refused(comfy):
    from PipeTrain.engine.models import adapter_for

    model = _model(SDXL)
    prepared = _prepared(model, SDXL, items=1)
    prepared.kwargs["c_concat"] = torch.zeros(1, 5, 16, 16)
    with pytest.raises(ConfigError, match="concat channels"):
        adapter_for(model).first_stage_inputs(prepared)
    inpaint = fc.build(fc.Family("sd15_inpaint", "SD15", dict(_sd15().config, in_channels=9), (4, 8, 8), 768, "t2i"))
    with pytest.raises(ConfigError, match="extra input channels"):
        adapter_for(inpaint).layers(inpaint)


# ---------------------------------------------------------------- 2 DeepSpeed ranks

KOALA_SHAPED = dict(SDXL.config, adm_in_channels=2816, model_channels=320, num_res_blocks=[1, 1, 1],
                    channel_mult=[1, 1, 1], transformer_depth=[0, 2, 5], transformer_depth_middle=1,
                    context_dim=2048, transformer_depth_output=[0] * 6)
LATENT, TOKENS = (4, 8, 8), 8


@pytest.fixture(scope="module")
def sdxl_files(comfy, tmp_path_factory):
    """A model file ComfyUI loads as model_base.SDXL, and a latent cache with SDXL conditioning."""
    import comfy.model_base
    import comfy.sd
    from PipeTrain.engine.cache.legacy import write_manifest
    from PipeTrain.engine.cache.writer import write_item
    from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("tiny-sdxl")
    model = fc.build(fc.Family("sdxl", "KOALA_700M", KOALA_SHAPED, LATENT, 2048, "t2i"))
    path = root / "tiny_sdxl.safetensors"
    save_file({k: v.contiguous() for k, v in model.diffusion_model.state_dict().items()}, str(path))
    assert type(comfy.sd.load_diffusion_model(str(path)).model) is comfy.model_base.SDXL

    gen = torch.Generator().manual_seed(0)
    cache, entries = root / "data" / "cache", []
    for i in range(4):
        write_item(cache, i, torch.randn((1, *LATENT), generator=gen), torch.randn((1, TOKENS, 2048), generator=gen),
                   {"pooled_output": torch.randn((1, 1280), generator=gen)}, f"item{i}.png", f"caption {i}", 1)
        entries.append({"file": f"items/{i:06d}.safetensors", "source": f"item{i}.png", "repeats": 1})
    spec = DatasetSpec(folders=(FolderSpec(str(root / "data")),), resolution=64)
    write_manifest(cache, "0" * 16, spec, entries, list(LATENT), ["cross_attn"], {"test": "tiny sdxl"})
    return str(path), str(cache)



@pytest.mark.slow
@pytest.mark.parametrize("grad_accum", [1, 4])
def test_sdxl_two_stage_pipeline_trains_like_one_process(tmp_path, comfy_root, sdxl_files, grad_accum, monkeypatch):
    # One thread per rank in both runs: the single process would otherwise take 2, which on a busy
    # 2-core machine made its steps 15x slower than the pipelined ranks'.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    plain, piped = run_all_to_end(pipeline_config(tmp_path / "plain", comfy_root, sdxl_files, 1, 1, grad_accum),
                                  pipeline_config(tmp_path / "piped", comfy_root, sdxl_files, 2, 2, grad_accum))
    assert plain.losses() == pytest.approx(piped.losses(), rel=1e-5, abs=1e-7)
    # A missing stage shows up as missing keys, a wrong stage gradient as differences of about the
    # learning rate (1e-3). AdamW divides each gradient by its own size, so an element whose gradient
    # nearly cancels (skip gradients summed in another order across the stage boundary) can move by a
    # slightly different fraction of the step: seen up to 1e-5, hence atol 3e-5.
    a = assert_same_lora(plain.cfg.run_dir, piped.cfg.run_dir, rtol=1e-4, atol=3e-5)
    moved = [k for k in a if k.endswith("lora_B.weight") and a[k].abs().sum() > 0]
    assert len(moved) == len([k for k in a if k.endswith("lora_B.weight")]), "a stage's LoRA never trained"
