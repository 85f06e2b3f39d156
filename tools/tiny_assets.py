"""Tiny random-init model files that ComfyUI's stock loaders accept, plus a tiny dataset.

The offline demo and the tests need an SD1.5-shaped UNet, a VAE and a CLIP-L text encoder, and
no real weights can be downloaded. So the architectures are built with ComfyUI's own classes (its
model detection then recognises the files exactly as it would real ones) and every tensor is
given a value here from a seed: ComfyUI's layers allocate with torch.empty and never initialise.
ENVIRONMENT.md ("An offline demo graph with random-init files") records which shapes detection
accepts on ComfyUI 0.3.75.

    python -m tools.tiny_assets BASE_DIR      # a base dir for `main.py --base-directory BASE_DIR`
    python -m tools.tiny_assets BASE_DIR --extras edit video   # + the edit/video workflows' files

The edit (Flux Kontext) and video (HunyuanVideo) example workflows' files: tools/tiny_families.py.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import sys
import time

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bump whenever any generator below would write different bytes: write_demo_base then rewrites.
CONTENT_VERSION = 1
UNET_FILE = "pipetrain-tiny-unet.safetensors"
VAE_FILE = "pipetrain-tiny-taesd.safetensors"
CLIP_FILE = "pipetrain-tiny-clip-l.safetensors"
DATASET_DIR = "pipetrain-demo-dataset"
STAMP_FILE = "pipetrain-demo-assets.json"

# The smallest UNet that comfy.model_detection still calls SD15 (model_channels is pinned to 320).
UNET_CONFIG = dict(
    image_size=32, in_channels=4, out_channels=4, model_channels=320, num_res_blocks=[1],
    channel_mult=[1], transformer_depth=[1], transformer_depth_output=[1, 1],
    transformer_depth_middle=-2, context_dim=768, num_heads=8, use_linear_in_transformer=False,
    use_spatial_transformer=True, legacy=False,
)


def _ensure_comfy() -> None:
    """Make `comfy.*` importable: in-process tools may run before anything else touched ComfyUI."""
    if "comfy" in sys.modules:  # inside a ComfyUI server, or bootstrapped already
        return
    from engine.comfy_bootstrap import import_comfy

    import_comfy(os.environ.get("COMFYUI_PATH") or os.path.join(REPO_ROOT, ".comfyui", "ComfyUI"))


def _one_thread(fn):
    """Run `fn` with one intra-op thread. Generating weights is memory-bound, so a second thread
    gains little; on a busy 2-core machine it made writing the demo files 2-5x slower (3.3 s with
    one thread, 6.5-17.6 s with two), the threads waiting on each other behind other processes."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return wrapper


# ---------------------------------------------------------------- seeded initialisation

def _generator(seed: int, name: str) -> torch.Generator:
    # One random stream per tensor name: a tensor's values depend neither on iteration order nor
    # on which other layers exist, so a ComfyUI update that adds a layer leaves the rest as is.
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def _normal(shape, std: float, seed: int, name: str) -> torch.Tensor:
    return torch.randn(shape, generator=_generator(seed, name)) * std


@torch.no_grad()
def _init_all(module: torch.nn.Module, seed: int, skip: tuple[str, ...] = ()) -> None:
    """Norms 1/0, biases 0, embeddings N(0, 1), other weights N(0, 1/fan_in); nothing left empty."""
    for mod_name, mod in module.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if full in skip:
                continue
            if isinstance(mod, (torch.nn.GroupNorm, torch.nn.LayerNorm)):
                p.fill_(1.0 if p_name == "weight" else 0.0)
            elif p_name == "bias":
                p.zero_()
            elif p_name == "scale" and p.dim() == 1:  # RMSNorm gains (Flux-style q/k norms)
                p.fill_(1.0)
            elif isinstance(mod, torch.nn.Embedding):
                p.copy_(_normal(p.shape, 1.0, seed, full))  # one-hot input: fan_in is 1
            elif p.dim() >= 2:
                p.copy_(_normal(p.shape, p[0].numel() ** -0.5, seed, full))
            else:
                raise ValueError(f"tiny_assets has no init rule for parameter {full} {tuple(p.shape)}: add one.")
    # None of today's classes has buffers; one appearing upstream would be torch.empty garbage.
    buffers = [name for name, _ in module.named_buffers()]
    if buffers:
        raise ValueError(f"tiny_assets does not know how to fill buffers {buffers}: add a rule.")


def _save(tensors: dict[str, torch.Tensor], path: str, dtype: torch.dtype, seed: int) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().to(dtype).contiguous() for k, v in tensors.items()}
    for name, t in tensors.items():  # after the cast: an fp16 overflow would show up as inf here
        if not torch.isfinite(t).all():
            raise ValueError(f"tiny_assets produced non-finite values in {name}")
    meta = {"pipetrain.tiny_assets": f"random-init test weights, content v{CONTENT_VERSION}, seed {seed}"}
    _atomic(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def _write_text(path: str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    _atomic(path, write)


def _atomic(path: str, write) -> None:
    """write(tmp) then rename: a killed run never leaves a half file that looks complete."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # safetensors creates 0600 files; other users' servers must read them
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ---------------------------------------------------------------- UNet

@torch.no_grad()
def build_tiny_unet(seed: int = 0) -> torch.nn.Module:
    _ensure_comfy()
    import comfy.ops
    from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel

    unet = UNetModel(**UNET_CONFIG, operations=comfy.ops.disable_weight_init).eval()
    _init_all(unet, seed)
    # LDM training zero-initialises the output conv, which would make this untrained model
    # predict 0 whatever its input. Keep it random instead, rescaled so the prediction has unit
    # std at the input scale ComfyUI feeds (c_in * x ~ N(0, 1)) across the schedule.
    gen = _generator(seed, "unet-calibration")
    x = torch.randn(4, 4, 8, 8, generator=gen)
    context = torch.randn(4, 77, 768, generator=gen)  # a final LayerNorm makes CLIP outputs ~N(0, 1)
    out = unet(x, timesteps=torch.tensor([999.0, 600.0, 250.0, 20.0]), context=context)
    unet.out[-1].weight.div_(out.std())
    return unet


@_one_thread
def write_tiny_unet(path: str, seed: int = 0) -> None:
    """SD1.5-detected UNet (18.7 M params), bare LDM key names, fp16."""
    _save(build_tiny_unet(seed).state_dict(), path, torch.float16, seed)


# ---------------------------------------------------------------- TAESD (the VAE)
# A purely random TAESD turns every image into unrelated latents and every latent into a
# saturated picture. Instead three of the 64 channels carry colour straight through both halves
# (the other 61 stay random and feed a fourth, "texture" latent direction), and the colour <->
# latent maps use ComfyUI's own SD1.5 latent-to-RGB preview factors. So a latent decodes to the
# colours ComfyUI's live preview shows for it, and decode(encode(image)) is the image averaged
# over 8x8 blocks.
RGB = [0, 1, 2]


def _through(conv, kernel: torch.Tensor) -> None:
    """Colour channels of `conv`'s output read only their own input channel, with `kernel`."""
    conv.weight[RGB] = 0
    for c in RGB:
        conv.weight[c, c] = kernel
    if conv.bias is not None:
        conv.bias[RGB] = 0


@torch.no_grad()
def build_tiny_taesd(seed: int = 0, latent_format: str = "SD15") -> torch.nn.Module:
    """latent_format: the comfy.latent_formats class whose channels, scale/shift and preview
    factors the TAESD uses (SD15: 4 channels; Flux: 16, a "taef1")."""
    _ensure_comfy()
    import comfy.latent_formats
    import comfy.taesd.taesd

    fmt = getattr(comfy.latent_formats, latent_format)()
    taesd = comfy.taesd.taesd.TAESD(latent_channels=fmt.latent_channels).eval()
    _init_all(taesd, seed, skip=("vae_scale", "vae_shift"))
    # The values ComfyUI's VAELoader gives its own taesd/taef1: raw = model latent / scale + shift.
    taesd.vae_scale.fill_(fmt.scale_factor)
    taesd.vae_shift.fill_(getattr(fmt, "shift_factor", None) or 0.0)

    to_rgb = torch.tensor(fmt.latent_rgb_factors).T  # [3, C]: preview rgb in [-1, 1] from a latent
    bias = torch.tensor(getattr(fmt, "latent_rgb_factors_bias", None) or [0.0, 0.0, 0.0])
    from_rgb = torch.linalg.pinv(to_rgb)  # [C, 3]: the smallest latent that previews as that rgb
    texture_dir = torch.linalg.svd(to_rgb).Vh[3]  # a latent direction the preview ignores
    texture_dir *= torch.sign(texture_dir[texture_dir.abs().argmax()])  # SVD's sign is arbitrary

    center = torch.zeros(3, 3)
    center[1, 1] = 1.0
    avg2x2 = torch.zeros(3, 3)
    avg2x2[1:, 1:] = 0.25  # stride 2, padding 1: taps 1..2 cover input pixels 2i and 2i+1
    blocks = (comfy.taesd.taesd.Block,)

    enc, dec = taesd.taesd_encoder, taesd.taesd_decoder
    # Encoder input is the image in [0, 1]; colour channels stay non-negative, so ReLUs pass them.
    _through(enc[0], center)
    for layer in enc[1:14]:
        if isinstance(layer, blocks):
            layer.conv[4].weight[RGB] = 0  # the residual branch adds nothing to colour channels
            layer.conv[4].bias[RGB] = 0
        else:
            _through(layer, avg2x2)  # the three stride-2 convs
    head = enc[14]
    head.weight.zero_()
    head.bias.copy_(-from_rgb.sum(1) - from_rgb @ bias)  # latent = from_rgb @ (2 * rgb - 1 - bias)
    head.weight[:, RGB, 1, 1] = 2 * from_rgb
    # Texture direction: a random projection of the random features, scaled to std 0.5 and
    # centred on smooth random colour fields (deterministic calibration images).
    gen = _generator(seed, "taesd-calibration")
    images = torch.nn.functional.interpolate(torch.rand(8, 3, 4, 4, generator=gen), size=64, mode="bilinear")
    feats = enc[:14](images)[:, 3:]
    kernel = _normal((1, 61, 3, 3), (61 * 9) ** -0.5, seed, "taesd_encoder.texture")
    tex = torch.nn.functional.conv2d(feats, kernel, padding=1)
    kernel *= 0.5 / tex.std()
    head.weight[:, 3:] = texture_dir[:, None, None, None] * kernel
    head.bias += texture_dir * (-tex.mean() * 0.5 / tex.std())

    # Decoder: colour channels start at 0.5 + preview rgb / 2 and pass to the output unchanged.
    first = dec[1]
    first.weight[RGB] = 0
    first.weight[RGB, :, 1, 1] = to_rgb / 2
    first.bias[RGB] = 0.5 + bias / 2
    for layer in dec[2:19]:
        if isinstance(layer, blocks):
            layer.conv[4].weight[RGB] = 0
            layer.conv[4].bias[RGB] = 0
        elif isinstance(layer, torch.nn.Conv2d):
            _through(layer, center)  # the convs after each 2x upsample
    last = dec[19]
    last.weight.zero_()
    last.bias.zero_()
    for c in RGB:
        last.weight[c, c, 1, 1] = 1.0
    return taesd


@_one_thread
def write_tiny_vae(path: str, seed: int = 0) -> None:
    """TAESD in one file (taesd_encoder.*, taesd_decoder.*, vae_scale, vae_shift), fp16, 4.7 MiB."""
    _save(build_tiny_taesd(seed).state_dict(), path, torch.float16, seed)


# ---------------------------------------------------------------- CLIP-L

@torch.no_grad()
def build_tiny_clip(seed: int = 0) -> torch.nn.Module:
    _ensure_comfy()
    import comfy.clip_model
    import comfy.ops
    import comfy.sd1_clip

    with open(os.path.join(os.path.dirname(comfy.sd1_clip.__file__), "sd1_clip_config.json")) as f:
        config = json.load(f)
    # All 12 layers: CLIPLoader always builds 12, and missing layers crash or give NaN conds.
    clip = comfy.clip_model.CLIPTextModel(config, torch.float32, "cpu", comfy.ops.disable_weight_init)
    _init_all(clip, seed)
    return clip


@_one_thread
def write_tiny_clip(path: str, seed: int = 0) -> None:
    """CLIP-L text encoder, keys `text_model.*` + `text_projection.weight`, fp16 (236 MiB)."""
    _save(build_tiny_clip(seed).state_dict(), path, torch.float16, seed)


# ---------------------------------------------------------------- dataset

COLOURS = {
    "red": (215, 40, 40), "green": (40, 170, 60), "blue": (45, 80, 215), "yellow": (240, 210, 50),
    "purple": (140, 60, 170), "orange": (245, 140, 30), "white": (240, 240, 240), "black": (25, 25, 25),
}
SHAPES = ("circle", "square", "triangle", "diamond")


def load_tiny_encoders(vae_path: str, clip_path: str):
    """The tiny VAE and CLIP files loaded as ComfyUI's VAE and CLIP objects (what its loaders give)."""
    _ensure_comfy()
    import comfy.sd
    import comfy.utils

    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(vae_path))
    clip = comfy.sd.load_clip(ckpt_paths=[clip_path], clip_type=comfy.sd.CLIPType.STABLE_DIFFUSION)
    return vae, clip


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _dataset_stems(n: int) -> list[str]:
    return [f"image_{i:03d}" for i in range(n)]


def _draw(shape: str, fg, bg, size: int, rng: random.Random):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size))
    draw = ImageDraw.Draw(img)
    for y in range(size):  # vertical gradient: the background darkens to 70 % at the bottom
        k = 1.0 - 0.3 * y / max(size - 1, 1)
        draw.line([(0, y), (size, y)], fill=tuple(int(c * k) for c in bg))
    r = size * rng.uniform(0.22, 0.32)
    cx, cy = (size / 2 + rng.uniform(-0.12, 0.12) * size for _ in range(2))
    box = [cx - r, cy - r, cx + r, cy + r]
    if shape == "circle":
        draw.ellipse(box, fill=fg)
    elif shape == "square":
        draw.rectangle(box, fill=fg)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fg)
    else:
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fg)
    return img


def write_tiny_dataset(folder: str, n: int = 8, size: int = 64, seed: int = 0) -> list[str]:
    """n PNGs of one coloured shape on a gradient, each with a `.txt` caption naming both colours."""
    combos = [(s, fg, bg) for s in SHAPES for fg in COLOURS for bg in COLOURS if fg != bg]
    if n > len(combos):
        raise ValueError(f"write_tiny_dataset makes at most {len(combos)} distinct images, asked for {n}")
    rng = random.Random(seed)
    chosen = rng.sample(combos, n)
    paths = []
    for stem, (shape, fg, bg) in zip(_dataset_stems(n), chosen):
        base = os.path.join(folder, stem)
        img = _draw(shape, COLOURS[fg], COLOURS[bg], size, rng)
        _atomic(base + ".png", lambda tmp: img.save(tmp, format="PNG"))
        caption = f"{_article(fg)} {fg} {shape} on {_article(bg)} {bg} background"
        _write_text(base + ".txt", caption + "\n")
        paths.append(base + ".png")
    return paths


# ---------------------------------------------------------------- a ComfyUI base directory

def _write_settings(path: str) -> None:
    # Without it the first page load shows a template dialog (browser tests); keep other settings.
    settings = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            settings = json.load(f)
    if settings.get("Comfy.TutorialCompleted") is not True:
        settings["Comfy.TutorialCompleted"] = True
        _write_text(path, json.dumps(settings, indent=2))


def write_demo_base(base_dir: str, seed: int = 0, extras: tuple[str, ...] = ()) -> dict:
    """Lay out models, the demo dataset and UI settings under a ComfyUI base directory.

    Files already written by the same CONTENT_VERSION and seed (per the stamp file) are kept.
    Returns {"unet", "vae", "clip"}: names as ComfyUI lists them; "dataset": the dataset's absolute
    folder; "base_dir": the absolute base directory. extras: also the files of the "edit" (Flux
    Kontext, 0.8 GB) and/or "video" (HunyuanVideo) example workflows (tools/tiny_families.py),
    returned under those keys; files of extras written by an earlier call stay in the stamp.
    """
    from . import tiny_families

    base = os.path.abspath(base_dir)
    dataset = os.path.join(base, "input", DATASET_DIR)
    n_images = 8
    models = os.path.join(base, "models")
    groups = [  # (the files a step writes, relative to base; the step)
        ([f"models/diffusion_models/{UNET_FILE}"],
         lambda: write_tiny_unet(os.path.join(models, "diffusion_models", UNET_FILE), seed)),
        ([f"models/vae/{VAE_FILE}"], lambda: write_tiny_vae(os.path.join(models, "vae", VAE_FILE), seed)),
        ([f"models/text_encoders/{CLIP_FILE}"],
         lambda: write_tiny_clip(os.path.join(models, "text_encoders", CLIP_FILE), seed)),
        ([f"input/{DATASET_DIR}/{s}{ext}" for s in _dataset_stems(n_images) for ext in (".png", ".txt")],
         lambda: write_tiny_dataset(dataset, n=n_images, size=64, seed=seed)),
    ]
    extra_groups = tiny_families.groups(base, seed)
    unknown = sorted(set(extras) - set(extra_groups))
    if unknown:
        raise ValueError(f"write_demo_base extras {unknown}: choose from {sorted(extra_groups)}")
    for name in extras:
        groups += extra_groups[name]
    stamp_path = os.path.join(base, STAMP_FILE)
    want = {"content_version": CONTENT_VERSION, "seed": seed}
    stamp = {}
    if os.path.isfile(stamp_path):
        with open(stamp_path, encoding="utf-8") as f:
            stamp = json.load(f)
    known = stamp.get("files", {}) if all(stamp.get(k) == v for k, v in want.items()) else {}

    def current(rel: str) -> bool:
        path = os.path.join(base, rel)
        return rel in known and os.path.isfile(path) and os.path.getsize(path) == known[rel]

    for rels, write in groups:
        if not all(current(rel) for rel in rels):
            write()
    files = {rel: size for rel, size in known.items() if current(rel)}  # other extras' files, still valid
    files.update({rel: os.path.getsize(os.path.join(base, rel)) for rels, _ in groups for rel in rels})
    _write_text(stamp_path, json.dumps({**want, "files": dict(sorted(files.items()))}, indent=1))
    _write_settings(os.path.join(base, "user", "default", "comfy.settings.json"))
    extra_names = tiny_families.names(base)
    return {"unet": UNET_FILE, "vae": VAE_FILE, "clip": CLIP_FILE, "dataset": dataset, "base_dir": base,
            **{name: extra_names[name] for name in extras}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write PipeTrain's tiny random-init demo assets.")
    parser.add_argument("base_dir", help="ComfyUI base directory to populate (for main.py --base-directory)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extras", nargs="*", default=[], choices=["edit", "video"],
                        help="also the files of these example workflows (edit: Flux Kontext, 0.8 GB; video: HunyuanVideo)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = write_demo_base(args.base_dir, seed=args.seed, extras=tuple(args.extras))
    print(json.dumps(result, indent=2))
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
