"""The demo's tiny random-init model files: an SD1.5-detected UNet, a TAESD VAE whose colours pass
through, and a CLIP-L text encoder, each built with ComfyUI's own classes (tools/tiny_init.py
seeds every tensor), plus loading the VAE and CLIP files as ComfyUI's loaders do.
"""
from __future__ import annotations

import json
import os

import torch

from .tiny_init import _ensure_comfy, _generator, _init_all, _normal, _one_thread, _save

# The smallest UNet that comfy.model_detection still calls SD15 (model_channels is pinned to 320).
UNET_CONFIG = dict(
    image_size=32, in_channels=4, out_channels=4, model_channels=320, num_res_blocks=[1],
    channel_mult=[1], transformer_depth=[1], transformer_depth_output=[1, 1],
    transformer_depth_middle=-2, context_dim=768, num_heads=8, use_linear_in_transformer=False,
    use_spatial_transformer=True, legacy=False,
)


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

    # As plain lists: ComfyUI 0.3.75 builds the halves as nn.Sequential, later versions as subclasses
    # of it with their own __init__, which nn.Sequential's slicing (type(self)(OrderedDict)) cannot call.
    enc, dec = list(taesd.taesd_encoder), list(taesd.taesd_decoder)
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
    feats = torch.nn.Sequential(*enc[:14])(images)[:, 3:]
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


def load_tiny_encoders(vae_path: str, clip_path: str):
    """The tiny VAE and CLIP files loaded as ComfyUI's VAE and CLIP objects (what its loaders give)."""
    _ensure_comfy()
    import comfy.sd
    import comfy.utils

    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(vae_path))
    clip = comfy.sd.load_clip(ckpt_paths=[clip_path], clip_type=comfy.sd.CLIPType.STABLE_DIFFUSION)
    return vae, clip
