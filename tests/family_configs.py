"""Tiny random-init configs of every model family ComfyUI 0.3.75 has, and per-item conditioning
in the form the latent cache holds it (engine/cache/format.py: ComfyUI's cond names, batch dim
removed), for tests/with_comfy/test_families_*.py.

The configs are the smallest ones ComfyUI's classes accept (MODEL-NOTES.md, "Tiny recipe"), written
as ComfyUI 0.3.75 takes them (`Family.recipe`); `Family.config` adds what a newer host's classes
require, with the values its detection gives a real file (tools/tiny_config.py). They are built
through `comfy.supported_models.<Class>(config).get_model({})`, the classes ComfyUI's detection
picks for real files: detection itself pins full-size widths for most families (ENVIRONMENT.md), so
a tiny detectable file exists only for Wan and SD1.5-class UNets (tests/tiny_detected.py replaces
the pinned values for the engine runs of some others).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from tools.tiny_config import host_config

T = 6  # text tokens: unpadded, so no attention mask is needed (MODEL-NOTES.md finding 7)

_LUMINA = dict(image_model="lumina2", patch_size=2, in_channels=16, dim=64, cap_feat_dim=48, n_layers=2,
               n_refiner_layers=1, qk_norm=True, n_heads=2, n_kv_heads=1, axes_dims=[8, 12, 12],
               axes_lens=[300, 512, 512], rope_theta=10000.0, ffn_dim_multiplier=4.0, multiple_of=16)
_FLUX = dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=64, hidden_size=64,
             mlp_ratio=4.0, num_heads=2, depth=1, depth_single_blocks=1, axes_dim=[8, 12, 12], theta=10000,
             patch_size=2, qkv_bias=True, guidance_embed=True)
_HUNYUAN = dict(image_model="hunyuan_video", in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=48,
                hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=1, depth_single_blocks=1, axes_dim=[8, 12, 12],
                theta=256, patch_size=[1, 2, 2], qkv_bias=True, guidance_embed=True, byt5=False, meanflow=False,
                use_cond_type_embedding=False, vision_in_dim=None)
_WAN = dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=64, ffn_dim=128,
            freq_dim=256, text_dim=48, out_dim=16, num_heads=2, num_layers=2, window_size=(-1, -1), qk_norm=True,
            cross_attn_norm=True, eps=1e-6)


@dataclass(frozen=True)
class Family:
    """One tiny model plus the cond dict of one cached item for one mode."""
    name: str
    supported: str  # comfy.supported_models class name
    recipe: dict  # the tiny config as ComfyUI 0.3.75 takes it; build with `config`
    latent: tuple  # raw VAE latent of one item, batch dim removed
    text_width: int
    mode: str  # t2i | t2v | i2v | edit | guidance
    extras: Callable[[torch.Generator], dict[str, Any]] = field(default=lambda g: {})
    group: str = ""  # ComfyUI code family (for the docs table)
    train: dict = field(default_factory=dict)  # objective options (t_range for the Wan 2.2 experts)
    # extras ComfyUI keeps without a batch dim (Anima's T5 token ids): the cache lists them as unbatched
    unbatched: tuple = ()
    # config -> BaseModel, where `comfy.supported_models.<supported>(config).get_model({})` cannot give the
    # tiny model (Ideogram 4's class pins the released widths over any config; MiniMax H3 leaves a buffer
    # to the file); None: that call
    make: Callable[[dict], Any] | None = None

    @property
    def config(self) -> dict:
        """The recipe plus the keys the imported ComfyUI's model class requires (a fresh dict)."""
        return host_config(self.recipe)


def _r(g, *shape):
    return torch.randn(shape, generator=g)


def _first_frame_kept(frames, h, w):
    """A latent noise mask as ComfyUI's image-to-video latent nodes make it (batch dim removed):
    0 on the given first frame (kept clean), 1 on the frames to generate."""
    mask = torch.ones(1, frames, h, w)
    mask[:, 0] = 0.0
    return mask


FAMILIES = [
    Family("sdxl", "SDXL", {"use_checkpoint": False, "image_size": 32, "out_channels": 4,
                            "use_spatial_transformer": True,
                            "legacy": False, "num_classes": "sequential", "adm_in_channels": 32 + 6 * 256,
                            "in_channels": 4, "model_channels": 32, "num_res_blocks": [1, 1],
                            "transformer_depth": [0, 1], "channel_mult": [1, 2], "transformer_depth_middle": 1,
                            "use_linear_in_transformer": True, "context_dim": 64,
                            "transformer_depth_output": [0, 0, 1, 1], "use_temporal_attention": False,
                            "use_temporal_resblock": False},
           (4, 16, 16), 64, "t2i", lambda g: {"pooled_output": _r(g, 32)}),
    Family("sd3", "SD3", {"in_channels": 16, "patch_size": 2, "out_channels": 16, "depth": 2, "input_size": None,
                          "adm_in_channels": 32,
                          "context_embedder_config": {"target": "torch.nn.Linear",
                                                      "params": {"in_features": 64, "out_features": 128}},
                          "num_patches": 256, "pos_embed_max_size": 16, "pos_embed_scaling_factor": None,
                          "qk_norm": "rms", "x_block_self_attn_layers": [0]},
           (16, 8, 8), 64, "t2i", lambda g: {"pooled_output": _r(g, 32)}),
    Family("auraflow", "AuraFlow", {"max_seq": 64, "cond_seq_dim": 32, "n_double_layers": 1, "n_layers": 2, "dim": 64,
                                    "n_heads": 2, "global_conddim": 64, "in_channels": 4, "out_channels": 4,
                                    "patch_size": 2},
           (4, 8, 8), 32, "t2i"),
    Family("flux", "Flux", _FLUX, (16, 8, 8), 64, "guidance",
           lambda g: {"pooled_output": _r(g, 32), "guidance": 3.5}),
    Family("flux_kontext", "Flux", _FLUX, (16, 8, 8), 64, "edit",
           lambda g: {"pooled_output": _r(g, 32), "guidance": 2.5, "reference_latents": [_r(g, 16, 8, 12)]}),
    Family("chroma", "Chroma", dict(image_model="chroma", in_channels=64, out_channels=64, context_in_dim=48,
                                    hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=1, depth_single_blocks=1,
                                    axes_dim=[8, 12, 12], theta=10000, patch_size=2, qkv_bias=True, in_dim=64,
                                    out_dim=64, hidden_dim=32, n_layers=2),
           (16, 8, 8), 48, "t2i", lambda g: {"pooled_output": None, "guidance": 0.0}),
    Family("hidream", "HiDream", dict(image_model="hidream", attention_head_dim=32, axes_dims_rope=[16, 8, 8],
                                      caption_channels=[64, 40], max_resolution=[32, 32], in_channels=16,
                                      llama_layers=[0, 1, 1], num_attention_heads=2, num_routed_experts=2,
                                      num_activated_experts=2, num_layers=1, num_single_layers=2, out_channels=16,
                                      patch_size=2, text_emb_dim=32),
           (16, 8, 8), 64, "t2i", lambda g: {"pooled_output": _r(g, 32), "conditioning_llama3": _r(g, 2, T, 40)}),
    Family("lumina2", "Lumina2", _LUMINA, (16, 8, 8), 48, "t2i"),
    Family("z_image", "ZImage", dict(_LUMINA, dim=256, n_heads=8, n_kv_heads=8, n_layers=1, axes_lens=[1536, 512, 512],
                                     rope_theta=256.0, ffn_dim_multiplier=8 / 3, z_image_modulation=True,
                                     time_scale=1000.0, pad_tokens_multiple=32),
           (16, 8, 8), 48, "t2i"),
    Family("qwen_image", "QwenImage", dict(image_model="qwen_image", in_channels=64, out_channels=16, num_layers=2,
                                           attention_head_dim=32, num_attention_heads=2, joint_attention_dim=48,
                                           axes_dims_rope=(8, 12, 12), patch_size=2),
           (16, 1, 8, 8), 48, "t2i"),
    Family("qwen_image_edit", "QwenImage", dict(image_model="qwen_image", in_channels=64, out_channels=16, num_layers=2,
                                                attention_head_dim=32, num_attention_heads=2, joint_attention_dim=48,
                                                axes_dims_rope=(8, 12, 12), patch_size=2),
           (16, 1, 8, 8), 48, "edit", lambda g: {"reference_latents": [_r(g, 16, 1, 8, 8), _r(g, 16, 1, 4, 8)]}),
    Family("hunyuan_image21", "HunyuanImage21", dict(_HUNYUAN, in_channels=64, out_channels=64, vec_in_dim=None,
                                                     guidance_embed=False, axes_dim=[16, 16], patch_size=[1, 1]),
           (64, 8, 8), 48, "t2i"),
    # The distilled variant: meanflow (time_r_in) and embedded guidance.
    Family("hunyuan_image21_distilled", "HunyuanImage21",
           dict(_HUNYUAN, in_channels=64, out_channels=64, vec_in_dim=None, guidance_embed=True, meanflow=True,
                axes_dim=[16, 16], patch_size=[1, 1]),
           (64, 8, 8), 48, "guidance", lambda g: {"guidance": 3.5}),
    # The refiner: its latent format folds frame pairs into channels (raw 32 -> 64 in the model), and the
    # image to refine comes as concat_latent_image with noise_augmentation (ComfyUI's HunyuanRefinerLatent).
    Family("hunyuan_image21_refiner", "HunyuanImage21Refiner",
           dict(_HUNYUAN, in_channels=128, out_channels=64, vec_in_dim=None, guidance_embed=True,
                patch_size=[1, 1, 1]),
           (32, 1, 8, 8), 48, "edit",
           lambda g: {"guidance": 3.5, "concat_latent_image": _r(g, 32, 1, 8, 8), "noise_augmentation": 0.1}),
    Family("omnigen2", "Omnigen2", dict(image_model="omnigen2", axes_dim_rope=[8, 12, 12], axes_lens=[1024, 1664, 1664],
                                        ffn_dim_multiplier=None, hidden_size=64, in_channels=16, multiple_of=16,
                                        norm_eps=1e-5, num_attention_heads=2, num_kv_heads=1, num_layers=2,
                                        num_refiner_layers=1, out_channels=None, patch_size=2, text_feat_dim=48,
                                        timestep_scale=1000.0),
           (16, 8, 8), 48, "edit",
           lambda g: {"attention_mask": torch.ones(T, dtype=torch.long), "reference_latents": [_r(g, 16, 8, 8)]}),
    Family("cosmos_predict2", "CosmosT2IPredict2", dict(
        image_model="cosmos_predict2", max_img_h=240, max_img_w=240, max_frames=128, in_channels=16, out_channels=16,
        patch_spatial=2, patch_temporal=1, model_channels=64, concat_padding_mask=True, crossattn_emb_channels=48,
        pos_emb_cls="rope3d", pos_emb_learnable=True, pos_emb_interpolation="crop", min_fps=1, max_fps=30,
        use_adaln_lora=True, adaln_lora_dim=16, num_blocks=2, num_heads=2, extra_per_block_abs_pos_emb=False,
        rope_h_extrapolation_ratio=4.0, rope_w_extrapolation_ratio=4.0, rope_t_extrapolation_ratio=1.0,
        extra_h_extrapolation_ratio=1.0, extra_w_extrapolation_ratio=1.0, extra_t_extrapolation_ratio=1.0,
        rope_enable_fps_modulation=False),
           (16, 1, 8, 8), 48, "t2i"),
    Family("flux2", "Flux2", dict(image_model="flux2", axes_dim=[8, 8, 8, 8], num_heads=2, mlp_ratio=3.0, theta=2000,
                                  out_channels=128, global_modulation=True, vec_in_dim=None, mlp_silu_act=True,
                                  qkv_bias=False, ops_bias=False, default_ref_method="index", ref_index_scale=10.0,
                                  in_channels=128, hidden_size=64, context_in_dim=96, patch_size=1, depth=1,
                                  depth_single_blocks=1, guidance_embed=True),
           (128, 4, 4), 96, "edit",
           lambda g: {"pooled_output": None, "guidance": 3.5, "reference_latents": [_r(g, 128, 4, 4)]}),
    Family("ltxv", "LTXV", dict(image_model="ltxv", in_channels=128, cross_attention_dim=64, attention_head_dim=32,
                                num_attention_heads=2, caption_channels=48, num_layers=2),
           (128, 2, 2, 2), 48, "t2v",
           lambda g: {"attention_mask": torch.ones(T, dtype=torch.long), "frame_rate": 25.0}),
    Family("ltxv_i2v", "LTXV", dict(image_model="ltxv", in_channels=128, cross_attention_dim=64, attention_head_dim=32,
                                    num_attention_heads=2, caption_channels=48, num_layers=2),
           (128, 2, 2, 2), 48, "i2v", lambda g: {"attention_mask": torch.ones(T, dtype=torch.long), "frame_rate": 25.0,
                                                 "denoise_mask": _first_frame_kept(2, 2, 2)}),
    Family("hunyuan_video", "HunyuanVideo", _HUNYUAN, (16, 2, 8, 8), 48, "guidance",
           lambda g: {"pooled_output": _r(g, 32), "guidance": 6.0}),
    Family("hunyuan_video15_i2v", "HunyuanVideo15", dict(_HUNYUAN, in_channels=65, out_channels=32, vec_in_dim=None,
                                                         guidance_embed=False, depth=1, depth_single_blocks=0,
                                                         patch_size=[1, 1, 1], byt5=False,
                                                         use_cond_type_embedding=True, vision_in_dim=1152),
           (32, 2, 4, 4), 48, "i2v",
           lambda g: {"pooled_output": None, "concat_latent_image": _r(g, 32, 2, 4, 4),
                      "concat_mask": torch.cat([torch.zeros(1, 1, 4, 4), torch.ones(1, 1, 4, 4)], dim=1),
                      "clip_vision_output": {"last_hidden_state": _r(g, 4, 1152)}}),
    Family("cosmos1", "CosmosT2V", dict(
        image_model="cosmos", max_img_h=240, max_img_w=240, max_frames=128, in_channels=16, out_channels=16,
        patch_spatial=2, patch_temporal=1, model_channels=64, block_config="FA-CA-MLP", concat_padding_mask=True,
        pos_emb_cls="rope3d", pos_emb_learnable=False, pos_emb_interpolation="crop", block_x_format="THWBD",
        affline_emb_norm=True, use_adaln_lora=True, adaln_lora_dim=16, num_blocks=2, num_heads=2,
        extra_per_block_abs_pos_emb=True, rope_h_extrapolation_ratio=1.0, rope_w_extrapolation_ratio=1.0,
        rope_t_extrapolation_ratio=2.0, extra_per_block_abs_pos_emb_type="learnable", crossattn_emb_channels=48),
           (16, 2, 8, 8), 48, "t2v", lambda g: {"frame_rate": 24.0}),
    Family("wan21_t2v", "WAN21_T2V", _WAN, (16, 3, 8, 8), 48, "t2v"),
    Family("wan21_i2v", "WAN21_I2V", dict(_WAN, model_type="i2v", in_dim=36), (16, 3, 8, 8), 48, "i2v",
           lambda g: {"concat_latent_image": _r(g, 16, 3, 8, 8),
                      "concat_mask": torch.cat([torch.zeros(1, 1, 8, 8), torch.ones(1, 2, 8, 8)], dim=1),
                      "clip_vision_output": {"penultimate_hidden_states": _r(g, 5, 1280)}}),
    Family("wan22_5b", "WAN22_T2V", dict(_WAN, in_dim=48, out_dim=48), (48, 3, 8, 8), 48, "t2v"),
    # TI2V: the start frame is encoded into the latent and kept clean by the latent's noise mask.
    Family("wan22_5b_ti2v", "WAN22_T2V", dict(_WAN, in_dim=48, out_dim=48), (48, 3, 8, 8), 48, "i2v",
           lambda g: {"denoise_mask": _first_frame_kept(3, 8, 8)}),
    # Wan 2.2 A14B: two experts of the Wan 2.1 classes, each trained on its own noise range (t = sigma here).
    Family("wan22_a14b_high", "WAN21_T2V", _WAN, (16, 3, 8, 8), 48, "t2v", train={"t_range": (0.875, 1.0)}),
    Family("wan22_a14b_low_i2v", "WAN21_T2V", dict(_WAN, in_dim=36), (16, 3, 8, 8), 48, "i2v",
           lambda g: {"concat_latent_image": _r(g, 16, 3, 8, 8),
                      "concat_mask": torch.cat([torch.zeros(1, 1, 8, 8), torch.ones(1, 2, 8, 8)], dim=1)},
           train={"t_range": (0.0, 0.9)}),
]
_VIDEO_CLASSES = {"LTXV", "HunyuanVideo", "HunyuanVideo15", "CosmosT2V", "WAN21_T2V", "WAN21_I2V", "WAN22_T2V"}
IMAGE = [f for f in FAMILIES if f.supported not in _VIDEO_CLASSES]
VIDEO = [f for f in FAMILIES if f.supported in _VIDEO_CLASSES]


def init_weights(module: torch.nn.Module, seed: int = 0) -> None:
    """ComfyUI's layers skip initialisation (weights come from a file): fill every tensor, seeded."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # Buffers are computed at build time (rope tables), except SD3's torch.empty `pos_embed`.
        buffers = [(n, b) for n, b in module.named_buffers() if n.endswith("pos_embed")]
        for name, p in list(module.named_parameters()) + buffers:
            if not p.is_floating_point():
                continue
            if p.ndim >= 2:
                fan_in = max(1, p[0].numel())
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
            elif "norm" in name or name.endswith(("scale", ".weight")):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def build(family: Family, seed: int = 0):
    """ComfyUI's BaseModel for the family, random-initialised (same seed: same weights)."""
    import comfy.supported_models as sm

    if family.make is not None:
        model = family.make(dict(family.config))
    else:
        model = getattr(sm, family.supported)(dict(family.config)).get_model({})
    init_weights(model.diffusion_model, seed)
    return model


def batch(family: Family, seed: int = 1) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """(latents [1, ...], conds) as engine.train.sample_order.collate returns them from a cache."""
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn((1, *family.latent), generator=g)
    cond = {"cross_attn": torch.randn((T, family.text_width), generator=g), "extras": family.extras(g)}
    if family.unbatched:
        cond["unbatched"] = family.unbatched
    return latents, [cond]
