"""Quantized base files in ComfyUI's own mixed-precision format (a `comfy_quant` entry per layer; made here by
ComfyUI's own quantization code, tools/tiny_quantized.py): the engine loads them with ComfyUI's loader, the
quantized layers stay quantized, a LoRA on them gets finite gradients through the quantized weights, and a run
trains and saves a LoRA that ComfyUI's LoRA loader puts onto the same quantized model with every key used.
ComfyUI 0.3.75 knows float8_e4m3fn; 0.33.0 also float8_e5m2, nvfp4, mxfp8 and int8_tensorwise."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.sections import LoraSpec

pytestmark = pytest.mark.core
# Packed formats (nvfp4) store fewer columns, so the layers ComfyUI's detection reads widths from stay unquantized.
SKIP = r"attn2\.to_[kv]|time_embed"
FORMATS = ("float8_e4m3fn", "float8_e5m2", "nvfp4", "mxfp8", "int8_tensorwise")


def _quantized_file(demo_base, fmt: str) -> Path:
    import comfy.quant_ops

    from tools.tiny_quantized import write_quantized_copy

    if fmt not in comfy.quant_ops.QUANT_ALGOS:
        pytest.skip(f"this ComfyUI's comfy.quant_ops has no {fmt} format (0.3.75 has float8_e4m3fn only)")
    folder = Path(demo_base["base_dir"]) / "models" / "diffusion_models"
    out = folder / f"tiny-unet-{fmt}.safetensors"
    if not out.exists():
        assert write_quantized_copy(str(folder / demo_base["unet"]), str(out), fmt, skip=SKIP)
    return out


def _quantized_layers(diffusion_model) -> list[str]:
    return [name for name, m in diffusion_model.named_modules()
            if type(getattr(m, "weight", None)).__name__ == "QuantizedTensor"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_lora_gets_gradients_through_quantized_layers(tmp_path, comfy_root, demo_base, fmt):
    from PipeTrain.engine.models.loading import load_base_model
    from PipeTrain.engine.train.lora import inject_lora, lora_parameters
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.sample_order import batch_items
    from PipeTrain.engine.cache.reader import CachedDataset
    from engine_runs import build_cache, make_config

    path = _quantized_file(demo_base, fmt)
    cfg = make_config(tmp_path / fmt, comfy_root, demo_base, build_cache(comfy_root, demo_base),
                      lora=LoraSpec(rank=4, targets="all_linear"))
    model = load_base_model(dataclasses.replace(cfg, model_path=str(path)), torch.device("cpu"))
    quantized = _quantized_layers(model.diffusion_model)
    assert quantized, "no layer loaded quantized"
    targets = inject_lora(model.diffusion_model, cfg.lora)
    assert set(quantized) & set(targets), "the quantized layers got no LoRA"
    dataset = CachedDataset(cfg.cache_dir)
    latents, conds = batch_items([dataset[0], dataset[1]], torch.device("cpu"))
    DiffusionObjective(model, seed=3)(latents.float(), conds, [0, 1]).backward()
    grads = {n: p.grad for n, p in model.diffusion_model.named_parameters() if p.requires_grad}
    # lora_B starts at zero, so lora_B's gradients are the ones that are not zero at the first step; those of
    # the first blocks' layers come back through every quantized layer after them
    on_quantized = [n for n in grads if n.split(".lora_")[0] in quantized and ".lora_B." in n]
    assert on_quantized and all(grads[n] is not None and torch.isfinite(grads[n]).all() and grads[n].abs().sum() > 0
                                for n in on_quantized)
    assert grads[min(on_quantized)].abs().sum() > 0  # input_blocks.1...: behind all the others
    assert all(p.grad is not None for p in lora_parameters(model.diffusion_model))


def test_a_run_on_an_fp8_mixed_file_saves_a_lora_comfyui_loads_onto_it(tmp_path, comfy_root, demo_base):
    import comfy.sd
    from safetensors.torch import load_file

    from engine_runs import build_cache, make_config, run_to_end

    path = _quantized_file(demo_base, "float8_e4m3fn")
    cfg = make_config(tmp_path / "fp8mixed", comfy_root, demo_base, build_cache(comfy_root, demo_base), steps=6,
                      learning_rate=5e-3)
    run = run_to_end(dataclasses.replace(cfg, model_path=str(path),
                                         launch=dataclasses.replace(cfg.launch, backend="plain")))
    assert len(run.losses()) == 6 and all(np.isfinite(run.losses())), run.log()
    lora = load_file(run.of("done")[-1]["lora"])
    base = comfy.sd.load_diffusion_model(str(path))
    assert _quantized_layers(base.model.diffusion_model)
    patched, _ = comfy.sd.load_lora_for_models(base, None, lora, 1.0, 0)
    assert len(patched.patches) == len({k.split(".lora_")[0] for k in lora if ".lora_" in k}) > 0  # every key used


def test_other_adapter_kinds_on_a_quantized_file_are_refused_with_the_fix(tmp_path, comfy_root, demo_base):
    from PipeTrain.engine.models.loading import load_base_model
    from PipeTrain.engine.train.lora import inject_lora
    from engine_runs import make_config

    path = _quantized_file(demo_base, "float8_e4m3fn")
    cfg = make_config(tmp_path / "loha", comfy_root, demo_base, "unused")
    model = load_base_model(dataclasses.replace(cfg, model_path=str(path)), torch.device("cpu"))
    with pytest.raises(ConfigError, match="kind 'loha' on a quantized model file.*Choose adapter 'lora'"):
        inject_lora(model.diffusion_model, LoraSpec(rank=4, kind="loha", targets="all_linear"))


def test_block_swap_on_a_quantized_file_is_refused_with_the_fix(tmp_path, comfy_root, demo_base):
    from PipeTrain.engine.config.sections import MemorySpec
    from PipeTrain.engine.memory.options import apply_memory_options
    from PipeTrain.engine.models.loading import load_base_model
    from engine_runs import make_config

    path = _quantized_file(demo_base, "float8_e4m3fn")
    cfg = make_config(tmp_path / "swap", comfy_root, demo_base, "unused", memory=MemorySpec(block_swap=1))
    model = load_base_model(dataclasses.replace(cfg, model_path=str(path)), torch.device("cpu"))
    if not _quantized_layers(model.diffusion_model) or all(
            type(p.data) is torch.Tensor for p in model.diffusion_model.parameters()):
        pytest.skip("this ComfyUI loads fp8 layers as plain tensors, which block swap moves")
    with pytest.raises(ConfigError, match="block_swap on a quantized model file.*Set block_swap to 0"):
        apply_memory_options(model, cfg.memory, torch.device("cpu"))
