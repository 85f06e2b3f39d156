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


# A tiny LTX 2.x audio VAE (comfy/ldm/lightricks/vae/audio_vae.py, ComfyUI 0.33+): 8 latent channels x 16
# frequency bins (the per-channel statistics are 128 wide, as in the released file), small convolutions and
# vocoder. The config travels in the file's metadata, as in the released file.
_AUDIO_ENCODER = {"double_z": True, "mel_bins": 64, "z_channels": 8, "resolution": 256, "downsample_time": False,
                  "in_channels": 2, "out_ch": 2, "ch": 8, "ch_mult": [1, 2, 4], "num_res_blocks": 1,
                  "attn_resolutions": [], "dropout": 0.0, "mid_block_add_attention": False, "norm_type": "pixel",
                  "causality_axis": "height"}
_AUDIO_CONFIG = {"audio_vae": {"model": {"params": {"ddconfig": _AUDIO_ENCODER, "sampling_rate": 16000}},
                               "preprocessing": {"stft": {"filter_length": 1024, "hop_length": 160}}},
                 "vocoder": {"upsample_initial_channel": 16, "upsample_rates": [2], "upsample_kernel_sizes": [4],
                             "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3, 5]]}}


def write_tiny_ltx_audio_vae(path: Path) -> Path:
    """The file as LTX 2.x checkpoints hold the audio VAE (keys audio_vae.* and vocoder.*, config in the
    metadata), random small weights, unit statistics; what Load LTXV Audio VAE loads."""
    import json

    from comfy.ldm.lightricks.vae.audio_vae import AudioVAE
    from safetensors.torch import save_file

    metadata = {"config": json.dumps(_AUDIO_CONFIG)}
    gen = torch.Generator().manual_seed(0)
    sd = {}
    for key, value in AudioVAE(metadata).state_dict().items():
        if value.ndim >= 2:
            value = torch.randn(value.shape, generator=gen) * 0.05
        else:
            value = torch.ones_like(value) if "std-of-means" in key else torch.zeros_like(value)
        sd[key.replace("autoencoder.", "audio_vae.", 1)] = value.contiguous()
    save_file(sd, str(path), metadata=metadata)
    return path
