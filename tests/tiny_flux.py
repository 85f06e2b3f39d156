"""A tiny random-init Flux.1 model (built in memory) and Flux-shaped conditioning for the adapter tests.

ComfyUI's detection pins Flux's widths (24 heads, rope axes 16+56+56, so hidden 3072, T5 4096,
mlp ratio 4): the smallest file it loads as Flux is hundreds of millions of parameters, too slow
for CPU tests. So the model is built directly from a tiny config (MODEL-NOTES.md) through
comfy.supported_models.Flux, the same classes a detected file gets.
"""
from __future__ import annotations

import torch

from tools.tiny_config import host_config

FLUX_CONFIG = dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=64,
                   hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=2, depth_single_blocks=2, axes_dim=[8, 12, 12],
                   theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True)
LATENT = (16, 6, 10)  # channels, height, width: h != w catches a transposed unpatchify
TEXT = 7  # tokens


def build_base_model(seed: int = 0, guidance_embed: bool = True, **config):
    """config: changes to FLUX_CONFIG (keys the host's FluxParams has)."""
    import comfy.supported_models

    config = host_config(dict(FLUX_CONFIG, guidance_embed=guidance_embed, **config))  # + what newer ComfyUIs require
    model = comfy.supported_models.Flux(config).get_model({})
    gen = torch.Generator().manual_seed(seed)
    # ComfyUI's layers skip initialisation (weights normally come from a file): fill every tensor.
    with torch.no_grad():
        for name, p in model.diffusion_model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif "norm" in name or name.endswith(".scale"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model


def conds(batch: int, pooled: bool = True, guidance: float | None = 3.5, seed: int = 1,
          latent: tuple[int, ...] = LATENT, refs: tuple[tuple[int, int], ...] = (),
          ref_method: str | None = None) -> tuple[torch.Tensor, list]:
    """(latents [B, 16, H, W], conds in the form engine.train.sample_order.collate returns).

    refs: (height, width) of Kontext reference latents per item (ReferenceLatent), ref_method its
    ref_latents_method (None: the model's default)."""
    gen = torch.Generator().manual_seed(seed)
    latents = torch.randn((batch, *latent), generator=gen)
    out = []
    for _ in range(batch):
        extras = {"pooled_output": torch.randn(FLUX_CONFIG["vec_in_dim"], generator=gen) if pooled else None,
                  "guidance": guidance}
        if refs:
            extras["reference_latents"] = [torch.randn((1, latent[0], h, w), generator=gen) for h, w in refs]
        if ref_method is not None:
            extras["ref_latents_method"] = ref_method
        out.append({"cross_attn": torch.randn((TEXT, FLUX_CONFIG["context_in_dim"]), generator=gen), "extras": extras})
    return latents, out
