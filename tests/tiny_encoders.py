"""Tiny encoders the video-dataset tests share (call after ComfyUI is imported): ComfyUI's own Wan 2.1
light video VAE with small random weights, and the demo's tiny image VAE + CLIP written to a folder."""
from __future__ import annotations

from pathlib import Path

import torch


def random_video_vae():
    """A random-weight Wan 2.1 light TAE (TAEHV): ComfyUI's own video VAE class and detection. Small
    weights: PyTorch's default init overflows through its 20 stacked blocks."""
    import comfy.sd
    import comfy.taesd.taehv

    gen = torch.Generator().manual_seed(0)
    sd = {k: (torch.randn(v.shape, generator=gen) * 0.02 if v.ndim >= 2 else torch.zeros_like(v))
          for k, v in comfy.taesd.taehv.TAEHV(latent_channels=16).state_dict().items()}
    return comfy.sd.VAE(sd=sd)


def tiny_image_encoders(folder: Path):
    """(image VAE, CLIP): the demo's tiny pair, written into `folder` and loaded the way ComfyUI loads them."""
    from tools.tiny_assets import load_tiny_encoders, write_tiny_clip, write_tiny_vae

    write_tiny_vae(str(folder / "vae.safetensors"), seed=0)
    write_tiny_clip(str(folder / "clip.safetensors"), seed=0)
    return load_tiny_encoders(str(folder / "vae.safetensors"), str(folder / "clip.safetensors"))
