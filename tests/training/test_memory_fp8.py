"""fp8 bases: base_dtype float8_e4m3fn / float8_e5m2 (norms, embeddings and heads kept high), and a
ComfyUI-quantized fp8_scaled file as users have it in models/diffusion_models. Each trains through the
engine loop, and the LoRA it saves loads through ComfyUI's own LoRA loader and changes the output."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import memory_runs
from engine_runs import assert_same_lora
import tiny_wan
from PipeTrain.engine.config.sections import MemorySpec
from PipeTrain.engine.models.loading import FP8


def write_fp8_scaled(src: Path, dst: Path) -> Path:
    """What ComfyUI's fp8_scaled files hold: every linear weight as fp8 with a float32 `scale_weight`
    beside it, the rest in high precision, and the `scaled_fp8` marker ComfyUI's detection looks for."""
    out = {}
    for key, value in load_file(str(src)).items():
        if key.endswith(".weight") and value.ndim == 2:
            scale = value.abs().max().float() / 448.0
            out[key] = (value.float() / scale).to(torch.float8_e4m3fn)
            out[key[: -len("weight")] + "scale_weight"] = scale.reshape(())
        else:
            out[key] = value.to(torch.bfloat16)
    out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    save_file(out, str(dst))
    return dst


@pytest.fixture(scope="module")
def wan(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("fp8-wan")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model = tiny_wan.write_model(root / "tiny_wan.safetensors")
    yield {"model": str(model), "scaled": str(write_fp8_scaled(model, root / "tiny_wan_fp8_scaled.safetensors")),
           "cache": tiny_wan.write_cache(root / "data", items=4)}
    torch.set_num_threads(before)


def _train(wan, tmp_path, comfy_root, model_key: str, **memory):
    cfg = memory_runs.wan_config(tmp_path / "run", comfy_root, wan[model_key], wan["cache"], steps=10, batch_size=4,
                                 learning_rate=1e-2, memory=MemorySpec(activation_checkpointing="on", **memory))
    run = memory_runs.train_in_process(cfg)
    losses = run.losses()
    assert sum(losses[-4:]) < 0.93 * sum(losses[:4]), losses
    return run


def _outputs_with_comfy_lora(model_path: str, lora: dict[str, torch.Tensor]):
    """apply_model of the file loaded by ComfyUI, without and with the LoRA applied by ComfyUI's loader."""
    import comfy.lora
    import comfy.sd

    patcher = comfy.sd.load_diffusion_model(model_path)
    key_map = comfy.lora.model_lora_keys_unet(patcher.model, {})
    patches = comfy.lora.load_lora(lora, key_map)
    modules = {k[: -len(".lora_A.weight")] for k in lora if k.endswith(".lora_A.weight")}
    assert len(patches) == len(modules) > 0, "ComfyUI's LoRA loader did not map every module of the file"
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, *tiny_wan.LATENT, generator=gen)
    ctx = torch.randn(1, *tiny_wan.TEXT, generator=gen)

    @torch.no_grad()  # as ComfyUI samples
    def run(p):
        p.patch_model()
        try:
            return p.model.apply_model(x, torch.tensor([0.6]), c_crossattn=ctx, transformer_options={}).float()
        finally:
            p.unpatch_model()

    plain = run(patcher)
    with_lora, _ = comfy.sd.load_lora_for_models(patcher, None, lora, 1.0, 0.0)
    return plain, run(with_lora)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_base_keeps_norms_and_embeddings_high_and_trains(wan, tmp_path, comfy_root, dtype):
    from PipeTrain.engine.config.run import RunConfig
    from PipeTrain.engine.models.loading import load_base_model

    run = _train(wan, tmp_path, comfy_root, "model", base_dtype=dtype)
    model = load_base_model(RunConfig.load(Path(run.cfg.run_dir) / "run.json"), torch.device("cpu"))
    dm = model.diffusion_model
    assert dm.blocks[0].self_attn.q.weight.dtype == getattr(torch, dtype)
    assert dm.blocks[0].ffn[0].weight.dtype == getattr(torch, dtype)
    high = {"blocks.0.norm3.weight", "blocks.0.self_attn.norm_q.weight", "blocks.0.modulation",
            "blocks.0.self_attn.q.bias", "text_embedding.0.weight", "time_embedding.0.weight",
            "patch_embedding.weight", "head.head.weight"}
    params = dict(dm.named_parameters())
    assert {n: params[n].dtype for n in high if params[n].dtype in FP8} == {}
    # The high-precision copies hold the file's values, not fp8-rounded ones.
    original = load_file(wan["model"])
    torch.testing.assert_close(params["text_embedding.0.weight"].float(), original["text_embedding.0.weight"])
    if dtype == "float8_e4m3fn":  # the LoRA trained on the fp8 base works on the full-precision file
        plain, lora = _outputs_with_comfy_lora(wan["model"], run.lora())
        assert (lora - plain).abs().mean() > 1e-3 * plain.abs().mean()


def test_lora_trains_on_a_comfyui_fp8_scaled_file_and_loads_back_in_comfyui(wan, tmp_path, comfy_root):
    import comfy.sd

    loaded = comfy.sd.load_diffusion_model(wan["scaled"]).model
    q = loaded.diffusion_model.blocks[0].self_attn.q
    assert q.weight.dtype == torch.float8_e4m3fn and hasattr(q, "scale_weight"), "not loaded as scaled fp8"
    run = _train(wan, tmp_path, comfy_root, "scaled")  # base_dtype auto: the file as it is
    lora = run.lora()
    assert all(v.dtype == torch.float32 for v in lora.values())
    plain, with_lora = _outputs_with_comfy_lora(wan["scaled"], lora)
    change = (with_lora - plain).abs().mean() / plain.abs().mean()
    # Control: the same file with every B zeroed (a no-op LoRA) goes through the same re-quantisation.
    _, noop = _outputs_with_comfy_lora(wan["scaled"], {k: v * 0 if ".lora_B." in k else v for k, v in lora.items()})
    noise = (noop - plain).abs().mean() / plain.abs().mean()
    print(f"relative output change: trained LoRA {change:.3e}, zero LoRA {noise:.3e}")
    assert change > 1e-3 and change > 20 * noise, f"the LoRA changed ComfyUI's output by only {change:.2e}"


def test_block_swap_on_an_fp8_scaled_base_trains_the_same_lora(wan, tmp_path, comfy_root):
    """Swapped blocks of a scaled fp8 file hold fp8 weights and 0-d float32 scales in one buffer."""
    plain = _train(wan, tmp_path / "plain", comfy_root, "scaled")
    swapped = _train(wan, tmp_path / "swapped", comfy_root, "scaled", block_swap=3)
    assert swapped.losses() == pytest.approx(plain.losses(), rel=1e-6)
    assert_same_lora(plain.cfg.run_dir, swapped.cfg.run_dir, rtol=1e-5, atol=1e-7)
