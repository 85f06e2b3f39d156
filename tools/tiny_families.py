"""Random-init files for the edit (Flux Kontext), video (HunyuanVideo) and Wan 2.2 experts example workflows.

Like tools/tiny_assets.py (helpers from tools/tiny_init.py, tiny_models.py, tiny_dataset.py):
ComfyUI's own classes, every tensor seeded, files its stock loaders detect as the real families.
Both models take the demo's CLIP-L conditioning, because ComfyUI 0.3.75's detection reads their
text widths from the file:

- Flux Kontext (comfy/model_detection.py, the Flux branch): context_in_dim from txt_in,
  vec_in_dim from vector_in, hidden_size from img_in; but num_heads is pinned to 24 and the rope
  axes to 16+56+56, so heads are 128 wide and hidden_size must be 3072. The smallest detectable
  Flux is then one double block and no single block: 394 M parameters (0.79 GB in bf16). (0.33.0
  reads num_heads as hidden_size // 128 instead, which this file also satisfies.) Its VAE is a
  16-channel TAESD ("taef1"; comfy/sd.py reads the channels from taesd_decoder.1.weight).
- HunyuanVideo (the "Hunyuan Video" branch): hidden_size from img_in.proj, num_heads =
  hidden_size // 128, context_in_dim from txt_in.input_embedder, vec_in_dim 768 (CLIP-L pooled)
  whenever vector_in exists: at hidden 128 it is 1.8 M parameters. Its VAE is a TAEHV
  (comfy/sd.py: "decoder.22.bias"; 16 latent channels; fp16 means HunyuanVideo's latent format).
"""
from __future__ import annotations

import os
import random
import shutil

import torch

from .tiny_config import host_config
from .tiny_dataset import COLOURS, SHAPES, _article, _draw
from .tiny_init import _atomic, _ensure_comfy, _init_all, _one_thread, _save, _write_text
from .tiny_models import build_tiny_taesd, write_tiny_unet

FLUX_FILE = "pipetrain-tiny-flux-kontext.safetensors"
FLUX_VAE_FILE = "pipetrain-tiny-taef1.safetensors"
HUNYUAN_FILE = "pipetrain-tiny-hunyuan-video.safetensors"
TAEHV_FILE = "pipetrain-tiny-taehv.safetensors"
EDIT_DIR = "pipetrain-demo-edit"
EDIT_CONTROL_DIR = "pipetrain-demo-edit-control"
EDIT_EXAMPLE = "pipetrain-demo-edit-input.png"  # a control image at the top of input/, for LoadImage
VIDEO_DIR = "pipetrain-demo-video"
VIDEO_FRAMES = 5  # 4k+1; TAEHV encodes 5 frames as 2 latent frames
# The Wan 2.2 experts workflow's low-noise expert: the demo UNet again (tiny_assets.UNET_FILE is the high-noise
# one). No tiny Wan 2.2 pair can be conditioned by the demo's CLIP-L (detection pins Wan's text width to umT5's
# 4096), so the demo shows the pair's graph on two SD1.5-shaped files; real Wan files go in the same loaders.
LOW_NOISE_FILE = "pipetrain-tiny-unet-low-noise.safetensors"
N_ITEMS = 8

FLUX_CONFIG = dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=768,
                   hidden_size=3072, mlp_ratio=4.0, num_heads=24, depth=1, depth_single_blocks=0,
                   axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True)
HUNYUAN_CONFIG = dict(image_model="hunyuan_video", in_channels=16, out_channels=16, vec_in_dim=768,
                      context_in_dim=768, hidden_size=128, mlp_ratio=4.0, num_heads=1, depth=1, depth_single_blocks=1,
                      axes_dim=[16, 56, 56], theta=256, patch_size=[1, 2, 2], qkv_bias=True, guidance_embed=True,
                      byt5=False, meanflow=False, use_cond_type_embedding=False, vision_in_dim=None)


def _diffusion_model(supported: str, config: dict, seed: int) -> torch.nn.Module:
    _ensure_comfy()
    import comfy.supported_models

    model = getattr(comfy.supported_models, supported)(host_config(config)).get_model({}).diffusion_model.eval()
    _init_all(model, seed)
    return model


@_one_thread
@torch.no_grad()
def write_tiny_flux(path: str, seed: int = 0) -> None:
    """Flux (guidance-distilled, so Kontext-style with ReferenceLatent): 1 double block, bf16."""
    _save(_diffusion_model("Flux", FLUX_CONFIG, seed).state_dict(), path, torch.bfloat16, seed)


@_one_thread
@torch.no_grad()
def write_tiny_hunyuan_video(path: str, seed: int = 0) -> None:
    """HunyuanVideo t2v, hidden 128, 1 double + 1 single block, fp16."""
    _save(_diffusion_model("HunyuanVideo", HUNYUAN_CONFIG, seed).state_dict(), path, torch.float16, seed)


@_one_thread
def write_tiny_taef1(path: str, seed: int = 0) -> None:
    """16-channel TAESD with Flux's scale/shift, colours passing through (see tiny_assets' TAESD)."""
    _save(build_tiny_taesd(seed, latent_format="Flux").state_dict(), path, torch.float16, seed)


@_one_thread
@torch.no_grad()
def write_tiny_taehv(path: str, seed: int = 0) -> None:
    """TAEHV for 16-channel (HunyuanVideo) latents, random weights, fp16 (what makes ComfyUI pick
    HunyuanVideo's latent format). The encoder's last conv is rescaled to unit-std latents."""
    _ensure_comfy()
    import comfy.taesd.taehv

    tae = comfy.taesd.taehv.TAEHV(latent_channels=16, show_progress_bar=False).eval()
    _init_all(tae, seed)
    frames = torch.rand(2, 3, 4, 32, 32, generator=torch.Generator().manual_seed(seed))  # [B, C, T, H, W]
    tae.encoder[-1].weight.div_(tae.encode(frames).std())
    _save(tae.state_dict(), path, torch.float16, seed)


# ---------------------------------------------------------------- datasets

def _stems(n: int) -> list[str]:
    return [f"pair_{i:03d}" for i in range(n)]


def _pick(n: int, seed: int, salt: str) -> list[tuple[str, str, str, str]]:
    """n distinct (shape, colour, background, second colour) with all three colours different."""
    rng = random.Random(f"{seed}:{salt}")
    combos = [(s, a, b, c) for s in SHAPES for a in COLOURS for b in COLOURS for c in COLOURS if len({a, b, c}) == 3]
    return rng.sample(combos, n)


def write_edit_dataset(folder: str, control_folder: str, n: int = N_ITEMS, size: int = 64, seed: int = 0) -> None:
    """Edit pairs: the control image is a shape on a background, the target (the dataset image) the
    same picture with the shape recoloured; the caption is the instruction ("make the circle red")."""
    for stem, (shape, before, bg, after) in zip(_stems(n), _pick(n, seed, "edit")):
        layout = random.Random(f"{seed}:{stem}").getstate()
        images = {}
        for role, fg in (("control", before), ("target", after)):
            rng = random.Random()
            rng.setstate(layout)  # same position and size in both images
            images[role] = _draw(shape, COLOURS[fg], COLOURS[bg], size, rng)
        _atomic(os.path.join(control_folder, stem + ".png"), lambda tmp, im=images["control"]: im.save(tmp, format="PNG"))
        _atomic(os.path.join(folder, stem + ".png"), lambda tmp, im=images["target"]: im.save(tmp, format="PNG"))
        _write_text(os.path.join(folder, stem + ".txt"), f"make the {shape} {after}\n")


def write_video_dataset(folder: str, n: int = N_ITEMS, size: int = 64, frames: int = VIDEO_FRAMES,
                        seed: int = 0) -> None:
    """n lossless FFV1 .mkv clips of a shape sliding right over a background, captioned."""
    import av
    import numpy as np
    from PIL import Image

    for stem, (shape, fg, bg, _) in zip(_stems(n), _pick(n, seed, "video")):
        still = _draw(shape, COLOURS[fg], COLOURS[bg], size, random.Random(f"{seed}:{stem}"))
        base = np.asarray(still)
        step = max(1, size // (4 * frames))

        def write(tmp: str, base=base, step=step) -> None:
            with av.open(tmp, "w", format="matroska") as out:
                stream = out.add_stream("ffv1", rate=8)
                stream.width = stream.height = size
                stream.pix_fmt = "yuv444p"
                for i in range(frames):
                    frame = np.roll(base, (i - frames // 2) * step, axis=1)  # the picture slides right
                    for packet in stream.encode(av.VideoFrame.from_image(Image.fromarray(frame))):
                        out.mux(packet)
                for packet in stream.encode():
                    out.mux(packet)

        _atomic(os.path.join(folder, stem + ".mkv"), write)
        _write_text(os.path.join(folder, stem + ".txt"),
                    f"{_article(fg)} {fg} {shape} sliding right on {_article(bg)} {bg} background\n")


# ---------------------------------------------------------------- groups for write_demo_base

def groups(base: str, seed: int) -> dict[str, list]:
    """Per workflow: [(files relative to base, the step writing them)], for tiny_assets.write_demo_base."""
    models = os.path.join(base, "models")
    inp = os.path.join(base, "input")
    edit_files = [f"input/{EDIT_DIR}/{s}{ext}" for s in _stems(N_ITEMS) for ext in (".png", ".txt")]
    control_files = [f"input/{EDIT_CONTROL_DIR}/{s}.png" for s in _stems(N_ITEMS)]

    def edit_data() -> None:
        write_edit_dataset(os.path.join(inp, EDIT_DIR), os.path.join(inp, EDIT_CONTROL_DIR), seed=seed)
        first = os.path.join(inp, EDIT_CONTROL_DIR, _stems(1)[0] + ".png")
        _atomic(os.path.join(inp, EDIT_EXAMPLE), lambda tmp: shutil.copyfile(first, tmp))

    return {
        "edit": [
            ([f"models/diffusion_models/{FLUX_FILE}"],
             lambda: write_tiny_flux(os.path.join(models, "diffusion_models", FLUX_FILE), seed)),
            ([f"models/vae/{FLUX_VAE_FILE}"], lambda: write_tiny_taef1(os.path.join(models, "vae", FLUX_VAE_FILE), seed)),
            (edit_files + control_files + [f"input/{EDIT_EXAMPLE}"], edit_data),
        ],
        "video": [
            ([f"models/diffusion_models/{HUNYUAN_FILE}"],
             lambda: write_tiny_hunyuan_video(os.path.join(models, "diffusion_models", HUNYUAN_FILE), seed)),
            ([f"models/vae/{TAEHV_FILE}"], lambda: write_tiny_taehv(os.path.join(models, "vae", TAEHV_FILE), seed)),
            ([f"input/{VIDEO_DIR}/{s}{ext}" for s in _stems(N_ITEMS) for ext in (".mkv", ".txt")],
             lambda: write_video_dataset(os.path.join(inp, VIDEO_DIR), seed=seed)),
        ],
        "experts": [
            ([f"models/diffusion_models/{LOW_NOISE_FILE}"],
             lambda: write_tiny_unet(os.path.join(models, "diffusion_models", LOW_NOISE_FILE), seed)),
        ],
    }


def names(base: str) -> dict[str, dict]:
    """What write_demo_base returns for each extra workflow: file names as ComfyUI lists them, folders."""
    inp = os.path.join(base, "input")
    return {
        "edit": {"unet": FLUX_FILE, "vae": FLUX_VAE_FILE, "dataset": os.path.join(inp, EDIT_DIR),
                 "control": os.path.join(inp, EDIT_CONTROL_DIR), "image": EDIT_EXAMPLE},
        "video": {"unet": HUNYUAN_FILE, "vae": TAEHV_FILE, "dataset": os.path.join(inp, VIDEO_DIR),
                  "frames": VIDEO_FRAMES},
        "experts": {"low_noise": LOW_NOISE_FILE},
    }

