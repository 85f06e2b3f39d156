"""GGUF bases (engine/models/gguf_base.py): the torch expansion of ggml's block types equals the `gguf`
package's reference; a GGUF copy of the tiny UNet (written by that package) loads through ComfyUI's loader
with its linear weights kept quantized and computes what its float twin computes; a LoRA trained on it by the
engine loads through ComfyUI's own LoRA loader onto the full-precision model with no key left over and gives
the output the GGUF model gives with that LoRA; what a GGUF base cannot do is refused before launch."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gguf", reason="the gguf package (requirements-dev.txt) is not installed")

from PipeTrain.engine.config.checks import ConfigError  # noqa: E402
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec  # noqa: E402
from PipeTrain.engine.models.gguf_dequant import BLOCKS, dequantize, dequantize_reference  # noqa: E402

pytestmark = pytest.mark.core


@pytest.mark.parametrize("qtype", sorted(BLOCKS))
def test_torch_expansion_equals_the_gguf_reference(qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    weights = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
    data = quantize(weights, GGMLQuantizationType[qtype])
    ours = dequantize(torch.from_numpy(data), qtype, (6, 96), torch.float32)
    assert torch.equal(ours, dequantize_reference(data, qtype, (6, 96)))
    assert (ours - torch.from_numpy(weights)).abs().max() < 0.5  # and it is the weights, to 4-8 bit rounding
    _, nbytes = BLOCKS[qtype]
    raw = np.random.default_rng(1).integers(0, 256, (6, 3 * nbytes), dtype=np.uint8)  # every bit pattern
    scales = raw.reshape(-1, nbytes)
    scales[:, 0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    if qtype.endswith("_1"):
        scales[:, 2:4] = np.frombuffer(np.float16(-0.25).tobytes(), np.uint8)
    assert torch.equal(dequantize(torch.from_numpy(raw), qtype, (6, 96), torch.float32),
                       dequantize_reference(raw, qtype, (6, 96)))


@pytest.fixture(scope="module")
def gguf_files(demo_base, tmp_path_factory):
    from tools.tiny_gguf import write_gguf_copy

    folder = Path(demo_base["base_dir"]) / "models" / "diffusion_models"
    stored = write_gguf_copy(str(folder / demo_base["unet"]), str(folder / "tiny-unet-q.gguf"),
                             str(folder / "tiny-unet-q-twin.safetensors"))
    return folder / "tiny-unet-q.gguf", folder / "tiny-unet-q-twin.safetensors", stored


def _denoise(model, seed: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 4, 8, 8, generator=gen)
    context = torch.randn(1, 7, model.model_config.unet_config["context_dim"], generator=gen)
    with torch.no_grad():
        return model.apply_model(x, torch.tensor([5.0]), c_crossattn=context)


def test_a_gguf_file_loads_with_its_linears_quantized_and_computes_what_its_twin_computes(gguf_files):
    import comfy.sd

    from PipeTrain.engine.models.gguf_base import load_gguf_patcher, quantized_bytes

    path, twin, stored = gguf_files
    assert {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "F32"} <= set(stored.values())
    gguf_model = load_gguf_patcher(str(path), {}).model
    twin_model = comfy.sd.load_diffusion_model(str(twin)).model
    assert type(gguf_model) is type(twin_model)
    layers, nbytes = quantized_bytes(gguf_model.diffusion_model)
    quantized = [k for k, t in stored.items() if t.startswith("Q")]
    assert layers == len(quantized) > 0
    float_bytes = sum(twin_model.diffusion_model.get_parameter(k).numel() * 4 for k in quantized)
    assert nbytes < float_bytes / 3  # 4-8.5 bits per weight instead of 32
    assert not any(n.endswith(".weight") and n[: -len(".weight")] + ".gguf_weight" in dict(
        gguf_model.diffusion_model.named_buffers()) for n, _ in gguf_model.diffusion_model.named_parameters())
    torch.testing.assert_close(_denoise(gguf_model), _denoise(twin_model), rtol=1e-4, atol=1e-5)


def test_a_lora_trained_on_a_gguf_base_loads_on_the_full_precision_model(tmp_path, comfy_root, demo_base, gguf_files):
    import comfy.sd
    from safetensors.torch import load_file

    from PipeTrain.engine.models.gguf_base import load_gguf_patcher
    from PipeTrain.engine.train.lora import inject_lora, load_lora_into
    from engine_runs import build_cache, make_config, run_to_end

    path, twin, _ = gguf_files
    cache_dir = build_cache(comfy_root, demo_base)
    cfg = make_config(tmp_path / "gguf", comfy_root, demo_base, cache_dir, steps=8, learning_rate=5e-3,
                      memory=MemorySpec(activation_checkpointing="on"))
    cfg = dataclasses.replace(cfg, model_path=str(path), launch=dataclasses.replace(cfg.launch, backend="plain"))
    run = run_to_end(cfg)
    losses = run.losses()
    assert len(losses) == 8 and all(np.isfinite(losses)), run.log()
    assert "linear layers kept quantized" in run.log()
    lora_file = Path(run.of("done")[-1]["lora"])
    lora = load_file(str(lora_file))
    assert any(torch.count_nonzero(v) for k, v in lora.items() if "lora_B" in k or k.endswith(".lora_up.weight"))

    base = comfy.sd.load_diffusion_model(str(twin))  # the full-precision model the GGUF file was made from
    patched, _ = comfy.sd.load_lora_for_models(base, None, lora, 1.0, 0)
    loaded = set(patched.patches)
    assert loaded and len(loaded) == len({k.rsplit(".lora_", 1)[0] for k in lora if ".lora_" in k})  # no key left
    patched.patch_model()
    expected = _denoise(patched.model)
    engine_model = load_gguf_patcher(str(path), {}).model
    inject_lora(engine_model.diffusion_model, cfg.lora)
    load_lora_into(engine_model.diffusion_model, str(lora_file), cfg.lora)
    with_lora = _denoise(engine_model)
    assert (with_lora - _denoise(load_gguf_patcher(str(path), {}).model)).abs().max() > 1e-4  # the LoRA acts
    torch.testing.assert_close(with_lora, expected, rtol=1e-3, atol=1e-4)


def test_what_a_gguf_base_cannot_do_is_refused_before_launch(tmp_path, comfy_root, demo_base, gguf_files):
    from engine_runs import make_config

    path = str(gguf_files[0])
    cfg = make_config(tmp_path / "refused", comfy_root, demo_base, "unused")
    cases = {"cannot be fine-tuned": dict(lora=dataclasses.replace(cfg.lora, kind="full")),
             "already quantized": dict(memory=MemorySpec(base_dtype="float8_e4m3fn"))}
    for message, change in cases.items():
        with pytest.raises(ConfigError, match=message):
            dataclasses.replace(cfg, model_path=path, **change).validate()
    dataclasses.replace(cfg, model_path=path, lora=LoraSpec(rank=4)).validate()


def test_train_pipeline_lists_gguf_files_and_follows_comfyui_gguf_loaders(monkeypatch, gguf_files, comfy):
    import folder_paths

    import PipeTrain.nodes.model_sources as sources
    from PipeTrain.nodes import compat
    from PipeTrain.nodes.train_pipeline import PipeTrainTrainPipeline

    path = gguf_files[0]
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "diffusion_models",
                        ([str(path.parent)], folder_paths.supported_pt_extensions))
    monkeypatch.setattr(folder_paths, "filename_list_cache", {})
    assert path.name in compat.gguf_filenames()
    assert path.name in PipeTrainTrainPipeline.INPUT_TYPES()["required"]["model_name"][0]
    assert compat.full_path("diffusion_models", path.name) == str(path)
    prompt = {"1": {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": path.name}},
              "8": {"class_type": "PipeTrainTrainPipeline", "inputs": {"model": ["1", 0]}}}
    assert sources.model_source(prompt, "8").model_path == str(path)
