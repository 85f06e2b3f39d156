"""A tiny random-init Wan 2.1 t2v file that ComfyUI's detection loads, and a matching latent cache.
(dim 128: detection infers num_heads = dim // 128.)

The cache is written with PipeTrain's own cache writer from seeded random latents and text
embeddings: the engine tests need Wan-shaped data, not a Wan VAE/umT5 (ComfyUI has no tiny ones).
"""
from __future__ import annotations

from pathlib import Path

import torch

WAN_CONFIG = dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=128, ffn_dim=256,
                  freq_dim=256, text_dim=4096, out_dim=16, num_heads=1, num_layers=4, window_size=(-1, -1),
                  qk_norm=True, cross_attn_norm=True, eps=1e-6)
LATENT = (16, 3, 8, 8)  # channels, frames, height, width
TEXT = (8, 4096)  # tokens, width (detection fixes umT5's 4096)


CLIP_TOKENS = 5  # CLIP vision tokens for i2v (257 in real files; img_emb takes any count)


def build_base_model(seed: int = 0, i2v: bool = False):
    import comfy.supported_models

    if i2v:  # Wan 2.1 i2v: 16 latent + 4 mask + 16 image channels in, and an image embedder (img_emb)
        model = comfy.supported_models.WAN21_I2V(dict(WAN_CONFIG, model_type="i2v", in_dim=36)).get_model({})
    else:
        model = comfy.supported_models.WAN21_T2V(dict(WAN_CONFIG)).get_model({})
    gen = torch.Generator().manual_seed(seed)
    # Norm scales start at 1, also those not named "norm" (the i2v image embedder's LayerNorms are
    # img_emb.proj.0 and .4: a zero scale there would silence the CLIP vision tokens).
    norm_scales = {f"{m}.weight" for m, mod in model.diffusion_model.named_modules()
                   if isinstance(mod, (torch.nn.LayerNorm, torch.nn.RMSNorm))}
    with torch.no_grad():
        for name, p in model.diffusion_model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / p.shape[-1] ** 0.5))
            elif name in norm_scales:
                p.fill_(1.0)
            elif "norm" in name or name.endswith(".modulation"):
                p.copy_(torch.ones_like(p) if "norm" in name else torch.randn(p.shape, generator=gen) * 0.02)
            else:
                p.zero_()
    return model


def write_model(path: Path, seed: int = 0, i2v: bool = False) -> Path:
    from safetensors.torch import save_file

    model = build_base_model(seed, i2v)
    state = {k: v.contiguous() for k, v in model.diffusion_model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))
    return path


def write_cache(root: Path, items: int = 8, seed: int = 0, i2v: bool = False) -> str:
    """i2v: each item also has a start-frame latent (concat_latent_image) and CLIP vision tokens."""
    from PipeTrain.engine.cache.legacy import write_manifest
    from PipeTrain.engine.cache.writer import write_item
    from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec

    gen = torch.Generator().manual_seed(seed)
    spec = DatasetSpec(folders=(FolderSpec(str(root)),), resolution=64)
    cache = root / "cache"
    entries = []
    for i in range(items):
        latent = torch.randn((1, *LATENT), generator=gen)
        text = torch.randn((1, *TEXT), generator=gen)
        extras = {}
        if i2v:
            extras = {"concat_latent_image": torch.randn((1, *LATENT), generator=gen),
                      "clip_vision_output.penultimate_hidden_states": torch.randn((1, CLIP_TOKENS, 1280), generator=gen)}
        write_item(cache, i, latent, text, extras, f"item{i}.png", f"caption {i}", 1)
        entries.append({"file": f"items/{i:06d}.safetensors", "source": f"item{i}.png", "repeats": 1})
    write_manifest(cache, "0" * 16, spec, entries, list(LATENT), ["cross_attn"], {"test": "tiny wan"})
    return str(cache)
