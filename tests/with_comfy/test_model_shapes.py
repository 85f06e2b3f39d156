"""The benchmark shapes (benchmarks/model_shapes.py) are what ComfyUI 0.3.75 makes of the released files.

Everything runs on the meta device (no weights): ComfyUI's detection reads only tensor shapes, so a
meta build's state dict stands for the random file write_random would write. For every shape, at
full depth and shallow (2 blocks per list), detection must pick the shape's class, and the config it
reads must build the same tensors, except where detection cannot see a cut depth (DETECTION_PINS_DEPTH).
A real forward and backward through ComfyUI's apply_model runs for the shallow shapes small enough
for a CPU; the others are left to the GPU check (benchmarks/families_gpu.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import model_shapes as ms  # noqa: E402
from pack import load_pack  # noqa: E402

load_pack()

NEW = ["chroma", "flux_kontext", "sd35_large", "auraflow", "lumina2", "z_image", "hidream_i1_full", "qwen_image_edit",
       "hunyuan_image21", "omnigen2", "cosmos_predict2_2b", "flux2_dev", "ltxv_2b", "hunyuan_video",
       "hunyuan_video15", "cosmos1_7b_t2v", "wan22_5b"]
FULL = [n for n in ms.SHAPES if not n.startswith("tiny")]

# Raw VAE latents at 1024x1024 (images) or 512x512x33 (video).
LATENT = {"chroma": (16, 128, 128), "flux_kontext": (16, 128, 128), "sd35_large": (16, 128, 128),
          "auraflow": (4, 128, 128), "lumina2": (16, 128, 128), "z_image": (16, 128, 128),
          "hidream_i1_full": (16, 128, 128), "qwen_image_edit": (16, 1, 128, 128), "hunyuan_image21": (64, 32, 32),
          "omnigen2": (16, 128, 128), "cosmos_predict2_2b": (16, 1, 128, 128), "flux2_dev": (128, 64, 64),
          "ltxv_2b": (128, 5, 16, 16), "hunyuan_video": (16, 9, 64, 64), "hunyuan_video15": (32, 9, 32, 32),
          "cosmos1_7b_t2v": (16, 5, 64, 64), "wan22_5b": (48, 9, 32, 32)}

# Extras each family's extra_conds reads for text-to-image/video (tensors and values; cross_attn apart).
EXTRAS = {"chroma": {"pooled_output"}, "flux_kontext": {"pooled_output", "guidance", "reference_latents.0"},
          "sd35_large": {"pooled_output"}, "auraflow": set(), "lumina2": {"attention_mask"},
          "z_image": {"attention_mask"}, "hidream_i1_full": {"pooled_output", "conditioning_llama3"},
          "qwen_image_edit": {"reference_latents.0"}, "hunyuan_image21": set(), "omnigen2": {"attention_mask"},
          "cosmos_predict2_2b": {"attention_mask"}, "flux2_dev": {"pooled_output", "guidance"},
          "ltxv_2b": {"attention_mask", "frame_rate"}, "hunyuan_video": {"pooled_output", "guidance"},
          "hunyuan_video15": {"pooled_output"}, "cosmos1_7b_t2v": {"attention_mask", "frame_rate"}, "wan22_5b": set()}

# One block per list, float32 under ~2 GB: a real CPU forward/backward at a small size. The 2.2-3.7 GB
# ones run as "slow"; HunyuanImage 2.1 (4.5 GB) and FLUX.2 (9 GB) only on the GPU.
CPU_FORWARD = ["ltxv_2b", "cosmos_predict2_2b", "hunyuan_video15", "wan22_5b", "sd35_large", "qwen_image_edit",
               "lumina2", "cosmos1_7b_t2v"]
CPU_FORWARD_SLOW = ["chroma", "flux_kontext", "auraflow", "hidream_i1_full", "omnigen2", "hunyuan_video", "z_image"]


def _shapes(model) -> dict:
    return {k: tuple(v.shape) for k, v in model.diffusion_model.state_dict().items()}


def _built_from_detection(shape: ms.Shape) -> dict:
    import comfy.supported_models

    family, config = ms.detected(shape)
    return _shapes(getattr(comfy.supported_models, family)(config).get_model({}, device="meta"))


@pytest.mark.parametrize("name", FULL)
@pytest.mark.parametrize("depth", ["full", "shallow"])
def test_detection_picks_the_family_and_reads_the_config_back(comfy, name, depth):
    shape = ms.SHAPES[name] if depth == "full" else ms.shallow(ms.SHAPES[name])
    family, _ = ms.detected(shape)
    assert family == shape.family
    same = _built_from_detection(shape) == _shapes(ms.build(shape))
    pinned = depth == "shallow" and shape.family in ms.DETECTION_PINS_DEPTH
    # a pinned family's shallow file would load at the released depth (its extra blocks missing)
    assert same != pinned, f"{name} {depth}: detection {'rebuilds' if same else 'does not rebuild'} the model"


@pytest.mark.parametrize("name", NEW)
def test_shallow_keeps_the_widths_and_cuts_every_block_list_to_two(comfy, name):
    shape = ms.SHAPES[name]
    cut = ms.shallow(shape, 2)
    assert shape.depth_keys
    for key, value in shape.config.items():
        if key in shape.depth_keys:
            assert cut.config[key] == min(value, 2 if key != "n_layers" or shape.family != "AuraFlow" else 4)
        elif key != "llama_layers":
            assert cut.config[key] == value, key
    full, small = _shapes(ms.build(shape)), _shapes(ms.build(cut))
    assert set(small) < set(full)
    # every remaining tensor at its released size (SD3's last joint block has no context output: pre_only)
    changed = {k for k, v in small.items() if full[k] != v}
    assert all(k.startswith(f"joint_blocks.{cut.config.get('num_blocks', 0) - 1}.context_block.") for k in changed), changed
    if shape.family == "HiDream":
        assert len(cut.config["llama_layers"]) == cut.config["num_layers"] + cut.config["num_single_layers"]


@pytest.mark.parametrize("name", NEW)
def test_latent_and_conditioning_shapes(comfy, name):
    import comfy.supported_models
    import torch

    shape = ms.SHAPES[name]
    latent = shape.latent(512, 33) if shape.video else shape.latent(1024)
    assert latent == LATENT[name]
    fmt = getattr(comfy.supported_models, shape.family).latent_format
    assert latent[0] == fmt.latent_channels
    cond = ms.sample_cond(shape, size=1024)
    assert set(cond["extras"]) == EXTRAS[name]
    assert tuple(cond["cross_attn"].shape) == (shape.text_tokens, shape.text_dim)
    for key, value in cond["extras"].items():
        if key.startswith("reference_latents."):
            assert tuple(value.shape) == latent
        elif key == "attention_mask":
            assert value.dtype == torch.long and tuple(value.shape) == (shape.text_tokens,)


def test_text_widths_are_what_the_models_take(comfy):
    """cross_attn width = the width the model's text input layer reads (HiDream: its T5 input)."""
    widths = {"chroma": "txt_in.weight", "flux_kontext": "txt_in.weight", "flux2_dev": "txt_in.weight",
              "sd35_large": "context_embedder.weight", "auraflow": "cond_seq_linear.weight",
              "lumina2": "cap_embedder.1.weight", "z_image": "cap_embedder.1.weight",
              "hidream_i1_full": "caption_projection.32.linear.weight", "qwen_image_edit": "txt_in.weight",
              "hunyuan_image21": "txt_in.input_embedder.weight", "hunyuan_video": "txt_in.input_embedder.weight",
              "hunyuan_video15": "txt_in.input_embedder.weight", "omnigen2": "time_caption_embed.caption_embedder.1.weight",
              "cosmos_predict2_2b": "blocks.0.cross_attn.k_proj.weight", "ltxv_2b": "caption_projection.linear_1.weight",
              "cosmos1_7b_t2v": "blocks.block0.blocks.1.block.attn.to_k.0.weight", "wan22_5b": "text_embedding.0.weight"}
    for name, key in widths.items():
        shape = ms.SHAPES[name]
        sd = _shapes(ms.build(shape))
        assert sd[key][1] == shape.text_dim, (name, sd[key])
    pooled = {"sd35_large": "y_embedder.mlp.0.weight", "flux_kontext": "vector_in.in_layer.weight",
              "hunyuan_video": "vector_in.in_layer.weight", "hidream_i1_full": "p_embedder.pooled_embedder.linear_1.weight"}
    for name, key in pooled.items():
        shape = ms.SHAPES[name]
        assert _shapes(ms.build(shape))[key][1] == shape.pooled_dim, name


def test_shallow_models_run_at_the_released_resolution_on_meta(comfy_root):
    """apply_model on the meta device with sample_cond at 1024x1024 or 512x512x33 (model_shapes.meta_forward):
    every shape the released widths, the family's latent and its text conditioning meet fits. In a fresh
    process, for ComfyUI's PyTorch attention (its CPU default, split attention, reads data); HiDream's MoE
    routing reads data too, so it runs only in the CPU test below."""
    import os
    import subprocess

    names = [n for n in NEW if n != "hidream_i1_full"]
    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    done = subprocess.run([sys.executable, "model_shapes.py", *names], cwd=bench, capture_output=True, text=True,
                          env={**os.environ, "COMFYUI_PATH": comfy_root}, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.split(":")[0] in names]
    assert done.returncode == 0 and len(lines) == len(names), done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("name", CPU_FORWARD + [pytest.param(n, marks=pytest.mark.slow) for n in CPU_FORWARD_SLOW])
def test_a_shallow_model_trains_a_step_on_cpu(comfy, name):
    """Through ComfyUI's extra_conds and apply_model (DiffusionObjective), at a small size: the cond
    keys and latent layout fit the model, and a LoRA on it gets gradients."""
    import torch
    from family_configs import init_weights
    # the pack's engine (as every engine test imports it): engine/patches keeps which ComfyUI functions
    # it replaced, and a second copy of the package (imported as `engine`) would not know them
    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.train.lora import inject_lora, lora_parameters
    from PipeTrain.engine.train.objective import DiffusionObjective
    from trainable import make_trainable

    shape = ms.shallow(ms.SHAPES[name], 1)
    size, frames = (128, 9) if shape.spatial == 32 else (64, 5)
    model = ms.build(shape, device="cpu")
    init_weights(model.diffusion_model)
    model.requires_grad_(False)
    latents = torch.randn((1, *shape.latent(size, frames)))
    cond = ms.sample_cond(shape, size=size, frames=frames)
    cond["cross_attn"] = cond["cross_attn"][:8]  # a short caption: the layout matters here, not the length
    if "attention_mask" in cond["extras"]:
        cond["extras"]["attention_mask"] = cond["extras"]["attention_mask"][:8]
    make_trainable(model, latents, [cond])  # as engine/train/loop.py does after loading
    inject_lora(model.diffusion_model, LoraSpec(rank=4, targets="all_linear"))
    loss = DiffusionObjective(model, seed=0)(latents, [cond], [0])
    assert torch.isfinite(loss)
    loss.backward()
    # (a block's last text-stream layers may not reach the output: no gradient there)
    grads = [p.grad for p in lora_parameters(model.diffusion_model) if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", ["ltxv_2b", "wan22_5b", "hunyuan_video15", "qwen_image_edit", "lumina2"])
def test_a_written_shallow_file_loads_through_comfyui_as_its_family(comfy, name, tmp_path):
    """write_random's file (bf16, a few hundred MB at one block per list) through ComfyUI's own
    loader: the family's class, at the shallow depth, every tensor from the file."""
    import comfy.sd

    shape = ms.shallow(ms.SHAPES[name], 1)
    path = tmp_path / f"{name}.safetensors"
    count = ms.write_random(shape, path)
    assert count == ms.param_count(shape)
    model = comfy.sd.load_diffusion_model(str(path)).model
    assert type(model.model_config).__name__ == shape.family
    assert _shapes(model) == _shapes(ms.build(shape))
