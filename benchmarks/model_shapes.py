"""Full-size architectures for the GPU benchmarks, built from ComfyUI's own classes with random weights.

Random weights do the same work per step as trained ones, so a benchmark needs no download: each
shape here is the released model's configuration (what ComfyUI's detection reads from the real
file) plus the shape of one training sample (latent and text conditioning) at a stated resolution.

    shape = SHAPES["flux_dev"]
    model = build(shape, device="meta")           # ComfyUI BaseModel, no memory used
    write_random(shape, "flux_random.safetensors")  # a file ComfyUI's loader detects as that model
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Shape:
    family: str  # class name in comfy.supported_models
    config: dict[str, Any]
    text_tokens: int
    text_dim: int
    pooled_dim: int = 0  # 0 = the model takes no pooled vector
    extras: dict[str, Any] = field(default_factory=dict)  # non-tensor conditioning (e.g. guidance)
    latent_channels: int = 16
    video: bool = False
    five_d: bool = False  # image models with a video-style [C, 1, H, W] latent (Qwen-Image's Wan VAE)

    def latent(self, size: int, frames: int = 1, height: int = 0) -> tuple[int, ...]:
        """Latent shape of one sample at width `size` x `height` (default size; x frames for video models;
        4x temporal, 8x spatial)."""
        h, w = (height or size) // 8, size // 8
        if self.video:
            return (self.latent_channels, (frames - 1) // 4 + 1, h, w)
        return (self.latent_channels, *((1,) if self.five_d else ()), h, w)


SHAPES: dict[str, Shape] = {
    "flux_dev": Shape("Flux", dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=768,
                                   context_in_dim=4096, hidden_size=3072, mlp_ratio=4.0, num_heads=24, depth=19,
                                   depth_single_blocks=38, axes_dim=[16, 56, 56], theta=10000, patch_size=2,
                                   qkv_bias=True, guidance_embed=True),
                      text_tokens=512, text_dim=4096, pooled_dim=768, extras={"guidance": 1.0}),
    "wan21_14b": Shape("WAN21_T2V", dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), in_dim=16,
                                         dim=5120, ffn_dim=13824, freq_dim=256, text_dim=4096, out_dim=16,
                                         num_heads=40, num_layers=40, window_size=(-1, -1), qk_norm=True,
                                         cross_attn_norm=True, eps=1e-6),
                       text_tokens=512, text_dim=4096, video=True),
    "wan21_1_3b": Shape("WAN21_T2V", dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), in_dim=16,
                                          dim=1536, ffn_dim=8960, freq_dim=256, text_dim=4096, out_dim=16,
                                          num_heads=12, num_layers=30, window_size=(-1, -1), qk_norm=True,
                                          cross_attn_norm=True, eps=1e-6),
                        text_tokens=512, text_dim=4096, video=True),
    "qwen_image": Shape("QwenImage", dict(image_model="qwen_image", in_channels=64, num_layers=60),
                        text_tokens=256, text_dim=3584, five_d=True),
    "sdxl": Shape("SDXL", {"use_checkpoint": False, "image_size": 32, "out_channels": 4,
                           "use_spatial_transformer": True, "legacy": False, "num_classes": "sequential",
                           "adm_in_channels": 2816, "in_channels": 4, "model_channels": 320,
                           "num_res_blocks": [2, 2, 2], "transformer_depth": [0, 0, 2, 2, 10, 10],
                           "channel_mult": [1, 2, 4], "transformer_depth_middle": 10,
                           "use_linear_in_transformer": True, "context_dim": 2048, "num_head_channels": 64,
                           "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
                           "use_temporal_attention": False, "use_temporal_resblock": False},
                  text_tokens=77, text_dim=2048, pooled_dim=1280, latent_channels=4),
    # CPU dry runs of the scripts (seconds, not a benchmark)
    "tiny_wan": Shape("WAN21_T2V", dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), in_dim=16,
                                        dim=128, ffn_dim=256, freq_dim=256, text_dim=4096, out_dim=16, num_heads=1,
                                        num_layers=4, window_size=(-1, -1), qk_norm=True, cross_attn_norm=True,
                                        eps=1e-6),
                      text_tokens=8, text_dim=4096, video=True),
    # 8 blocks: enough layers (embedding, 8 blocks, head) for an 8-stage CPU dry run
    "tiny_wan_8blocks": Shape("WAN21_T2V", dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2),
                                                in_dim=16, dim=128, ffn_dim=256, freq_dim=256, text_dim=4096, out_dim=16,
                                                num_heads=1, num_layers=8, window_size=(-1, -1), qk_norm=True,
                                                cross_attn_norm=True, eps=1e-6),
                              text_tokens=8, text_dim=4096, video=True),
}


def build(shape: Shape, device: str = "meta"):
    """ComfyUI's BaseModel for `shape`, weights uninitialised (device 'meta' allocates nothing)."""
    import comfy.supported_models

    return getattr(comfy.supported_models, shape.family)(dict(shape.config)).get_model({}, device=device)


def write_random(shape: Shape, path: str | Path, seed: int = 0) -> int:
    """Write a bf16 random-init diffusion-model file ComfyUI detects as `shape`; returns the parameter count.

    Matrices ~ N(0, 0.02), norm scales 1, other vectors 0. Drawn on the GPU when there is one (a 12B
    model takes minutes to draw on a CPU).
    """
    import torch
    from safetensors.torch import save_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    state, count = {}, 0
    for name, p in build(shape).diffusion_model.state_dict().items():
        if p.ndim >= 2:
            t = torch.randn(p.shape, generator=gen, device=device, dtype=torch.bfloat16).mul_(0.02)
        else:
            t = (torch.ones if "norm" in name else torch.zeros)(p.shape, dtype=torch.bfloat16, device=device)
        state[name] = t.cpu()
        count += t.numel()
    tmp = Path(f"{path}.tmp")
    save_file(state, str(tmp))
    tmp.replace(path)
    return count


def sample_cond(shape: Shape, device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """One sample's conditioning in the cache's form: {"cross_attn": [T, D], "extras": {...}}."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    extras: dict[str, Any] = dict(shape.extras)
    if shape.pooled_dim:
        extras["pooled_output"] = torch.randn(shape.pooled_dim, generator=gen).to(device)
    cross = torch.randn((shape.text_tokens, shape.text_dim), generator=gen).to(device)
    return {"cross_attn": cross, "extras": extras}
