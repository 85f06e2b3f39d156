"""The benchmark shapes (benchmarks/model_shapes.py) are what ComfyUI 0.3.75 makes of the released files,
and those of the families only ComfyUI 0.33+ has (benchmarks/model_shapes_033.py) what 0.33.0 makes of theirs.

Everything runs on the meta device (no weights): ComfyUI's detection reads only tensor shapes, so a
meta build's state dict stands for the random file write_random would write. For every shape, at
full depth and shallow (2 blocks per list), detection must pick the shape's class, and the config it
reads must build the same tensors, except where detection cannot see a cut depth (DETECTION_PINS_DEPTH).
A real forward and backward through ComfyUI's apply_model runs for the shallow shapes small enough
for a CPU; the others are left to the GPU check (benchmarks/families_gpu.py).
The 0.33 shapes' tests are `core` (the 0.33.0 suite runs them) and skip, naming what is missing, on 0.3.75.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import model_shapes as ms  # noqa: E402
from shape_cond import sample_cond  # noqa: E402
from shape_files import random_state, write_random  # noqa: E402
from pack import load_pack  # noqa: E402

load_pack()

NEW = ["chroma", "flux_kontext", "sd35_large", "auraflow", "lumina2", "z_image", "hidream_i1_full", "qwen_image_edit",
       "hunyuan_image21", "omnigen2", "cosmos_predict2_2b", "flux2_dev", "ltxv_2b", "hunyuan_video",
       "hunyuan_video15", "cosmos1_7b_t2v", "wan22_5b"]
FULL = [n for n in ms.SHAPES if not n.startswith("tiny") and n not in ms.SHAPES_033]
# The families only ComfyUI 0.33+ has: core tests (the 0.33.0 suite), skipped on an older host.
NEW_033 = list(ms.SHAPES_033)
CORE_033 = [pytest.param(n, marks=pytest.mark.core) for n in NEW_033]

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


def _skip_on_older_host(name: str) -> None:
    missing = ms.host_lacks(name)
    if missing:
        pytest.skip(f"{name} needs ComfyUI 0.33+: this host has no {missing}")


def _shapes(model) -> dict:
    return {k: tuple(v.shape) for k, v in model.diffusion_model.state_dict().items()}


def _built_from_detection(shape: ms.Shape) -> dict:
    import comfy.supported_models

    family, config = ms.detected(shape)
    return _shapes(getattr(comfy.supported_models, family)(config).get_model({}, device="meta"))


@pytest.mark.parametrize("name", FULL + CORE_033)
@pytest.mark.parametrize("depth", ["full", "shallow"])
def test_detection_picks_the_family_and_reads_the_config_back(comfy, name, depth):
    _skip_on_older_host(name)
    shape = ms.SHAPES[name] if depth == "full" else ms.shallow(ms.SHAPES[name])
    family, _ = ms.detected(shape)
    assert family == shape.family
    same = _built_from_detection(shape) == _shapes(ms.build(shape))
    pinned = depth == "shallow" and shape.family in ms.DETECTION_PINS_DEPTH
    # a pinned family's shallow file would load at the released depth (its extra blocks missing)
    assert same != pinned, f"{name} {depth}: detection {'rebuilds' if same else 'does not rebuild'} the model"


@pytest.mark.parametrize("name", NEW + CORE_033)
def test_shallow_keeps_the_widths_and_cuts_every_block_list_to_two(comfy, name):
    _skip_on_older_host(name)
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
    cond = sample_cond(shape, size=1024)
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
    """apply_model on the meta device with sample_cond at 1024x1024 or 512x512x33 (meta_run.meta_forward):
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
    cond = sample_cond(shape, size=size, frames=frames)
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
    count = write_random(shape, path)
    assert count == ms.param_count(shape)
    model = comfy.sd.load_diffusion_model(str(path)).model
    assert type(model.model_config).__name__ == shape.family
    assert _shapes(model) == _shapes(ms.build(shape))


# ---- the families only ComfyUI 0.33+ has (benchmarks/model_shapes_033.py) ----
# Raw latents at 1024x1024 or 512x512x33; MiniMax H3's is the packed row of its video and audio streams.
LATENT_033 = {"flux2_klein_4b": (128, 64, 64), "flux2_klein_9b": (128, 64, 64), "anima": (16, 1, 128, 128),
              "ernie_image": (128, 64, 64), "ideogram4": (128, 64, 64), "krea2": (16, 1, 128, 128),
              "minimax_h3_t2i": (1, 24 * 64 * 64), "minimax_h3_t2v": (1, 24 * 9 * 32 * 32),
              "minimax_h3_t2v_audio": (1, 24 * 9 * 32 * 32 + 32 * 2 * 40),
              "ltx23_t2v": (1, 128 * 5 * 16 * 16 + 8 * 25 * 16)}
# The tiny family (tests/family_configs_033.py) whose cached conditioning each shape must reproduce.
TINY_033 = {"flux2_klein_4b": "flux2_klein", "flux2_klein_9b": "flux2_klein", "anima": "anima",
            "ernie_image": "ernie_image", "ideogram4": "ideogram4", "krea2": "krea2",
            "minimax_h3_t2i": "minimax_h3_t2i", "minimax_h3_t2v": "minimax_h3_t2v",
            "minimax_h3_t2v_audio": "minimax_h3_t2v_audio", "ltx23_t2v": "ltxav_t2v"}
# The layer that reads the text (key, dim, multiple): its input width x multiple = the shape's text_dim;
# LTX 2.3's text is split between two connectors (keys: the widths add up).
TEXT_IN_033 = {"flux2_klein_4b": ("txt_in.weight", 1, 1), "flux2_klein_9b": ("txt_in.weight", 1, 1),
               "anima": ("llm_adapter.blocks.0.cross_attn.k_proj.weight", 1, 1), "ernie_image": ("text_proj.weight", 1, 1),
               "ideogram4": ("llm_cond_proj.weight", 1, 1),
               "krea2": ("txtfusion.layerwise_blocks.0.prenorm.scale", 0, 12),  # 12 stacked Qwen3-VL layers
               "minimax_h3_t2i": ("condition_proj.weight", 1, 1), "minimax_h3_t2v": ("condition_proj.weight", 1, 1),
               "minimax_h3_t2v_audio": ("condition_proj.weight", 1, 1),
               "ltx23_t2v": (("video_embeddings_connector.transformer_1d_blocks.0.attn1.to_q.weight",
                              "audio_embeddings_connector.transformer_1d_blocks.0.attn1.to_q.weight"), 1, 1)}


@pytest.mark.parametrize("name", CORE_033)
def test_033_latent_text_width_and_conditioning_are_the_tiny_familys(comfy, name):
    """The latent's layout, the text width the model reads, and the cached conditioning's keys, dtypes and
    unbatched keys are those of the tiny family the CPU tests train (tests/family_configs_033.py)."""
    import comfy.supported_models
    import torch
    from family_configs_033 import FAMILIES
    from family_configs_033_more import LTXAV

    _skip_on_older_host(name)
    shape = ms.SHAPES[name]
    latent = shape.latent(512, 33) if shape.video else shape.latent(1024)
    assert latent == LATENT_033[name]
    if not shape.audio_stream:  # (MiniMax H3's packed format counts its widest stream: 32, the audio's)
        assert latent[0] == getattr(comfy.supported_models, shape.family).latent_format.latent_channels
    keys, dim, multiple = TEXT_IN_033[name]
    built = _shapes(ms.build(ms.shallow(shape, 1)))
    keys = (keys,) if isinstance(keys, str) else keys
    assert sum(built[key][dim] for key in keys) * multiple == shape.text_dim
    tiny = next(f for f in [*FAMILIES, LTXAV] if f.name == TINY_033[name])
    want = tiny.extras(torch.Generator().manual_seed(0))
    cond = sample_cond(shape, size=512 if shape.video else 1024, frames=33 if shape.video else 1)
    assert set(cond["extras"]) == set(want)
    assert set(cond.get("unbatched", ())) == set(tiny.unbatched)
    for k, v in want.items():
        got = cond["extras"][k]
        if torch.is_tensor(v):
            assert got.dtype == v.dtype and got.ndim == v.ndim, k
        elif k == "latent_shapes":  # torch.Size per stream, batch 1: video then audio
            assert got == [torch.Size((1, *s)) for s in shape.latent_streams(512 if shape.video else 1024, 33)]
        else:
            assert got == v, k


@pytest.mark.core
def test_033_shallow_models_run_at_the_released_resolution_on_meta(comfy_root, comfy):
    """As test_shallow_models_run_at_the_released_resolution_on_meta, for the 0.33 shapes (MiniMax H3's
    forward reads the timestep's value: model_shapes.py reports it skipped, and the slow CPU test runs it)."""
    import os
    import subprocess

    _skip_on_older_host("krea2")
    from meta_run import META_READS_DATA

    names = [n for n in NEW_033 if ms.SHAPES[n].family not in META_READS_DATA]
    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    done = subprocess.run([sys.executable, "model_shapes.py", *names, "minimax_h3_t2i"], cwd=bench,
                          capture_output=True, text=True, env={**os.environ, "COMFYUI_PATH": comfy_root}, timeout=600)
    ok = [line for line in done.stdout.splitlines() if line.split(":")[0] in names and ": ok " in line]
    assert done.returncode == 0 and len(ok) == len(names), done.stdout + done.stderr[-2000:]
    assert "minimax_h3_t2i: skipped, cannot run on meta" in done.stdout


@pytest.mark.core
@pytest.mark.slow
def test_033_minimax_h3_runs_at_its_released_widths_on_cpu(comfy):
    """MiniMax H3 (which meta cannot run) at its released widths, one block per list (1.1 B parameters, bf16,
    ~2 GB), on a packed video + empty audio latent at 128x128x9: the output has the packed row's shape."""
    import torch
    from PipeTrain.engine.train.objective import model_kwargs

    _skip_on_older_host("minimax_h3_t2v")
    shape = ms.shallow(ms.SHAPES["minimax_h3_t2v"], 1)
    model = ms.build(shape, dtype=torch.bfloat16)
    model.diffusion_model.to_empty(device="cpu")
    model.diffusion_model.load_state_dict(random_state(model.diffusion_model))
    model.model_sampling.to("cpu")
    x0 = torch.randn((1, *shape.latent(128, 9)))
    cond = sample_cond(shape, size=128, frames=9)
    cond["cross_attn"] = cond["cross_attn"][:8]  # a short caption
    cond["extras"]["minimax_token_tags"] = cond["extras"]["minimax_token_tags"][:8]
    with torch.no_grad():
        out = model.apply_model(x0, torch.full((1,), 0.5), transformer_options={},
                                **model_kwargs(model, [cond], x0, torch.randn_like(x0)))
    assert out.shape == x0.shape and torch.isfinite(out).all()
