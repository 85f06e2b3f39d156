"""Full-size architectures for the GPU benchmarks, built from ComfyUI's own classes with random weights.

Random weights do the same work per step as trained ones, so a benchmark needs no download: each
shape here is the released model's configuration (what ComfyUI 0.3.75's detection reads from the real
file) plus the shape of one training sample (raw VAE latent and text conditioning, as the latent cache
holds them) at a stated resolution. There is one shape per model family ComfyUI trains. The families only
ComfyUI 0.33+ has are in model_shapes_033.py, merged into SHAPES here; host_lacks(name) says what an older
host is missing for one of them.

    shape = SHAPES["flux_dev"]
    model = build(shape, device="meta")           # ComfyUI BaseModel, no memory used
    write_random(shape, "flux_random.safetensors")  # shape_files.py: a file ComfyUI detects as that model
    small = shallow(shape, blocks=2)              # released widths, 2 blocks per block list
    detected(small)                               # (class, unet_config) detection makes of its file
    sample_cond(shape, size=1024)                 # shape_cond.py: one sample's cached conditioning

A shallow file of a family in DETECTION_PINS_DEPTH still detects as its class, but ComfyUI's loader
builds it at the released depth (its detection does not count blocks there): build such a shape with
build() and load the file's tensors into it instead of going through comfy.sd.

`python model_shapes.py [NAME...]` runs each shallow shape on the meta device at its benchmark size.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from model_shapes_033 import NEEDS, SHAPES_033


@dataclass(frozen=True)
class Shape:
    family: str  # class name in comfy.supported_models
    config: dict[str, Any]
    text_tokens: int
    text_dim: int
    pooled_dim: int = 0  # 0 = the model takes no pooled vector
    extras: dict[str, Any] = field(default_factory=dict)  # non-tensor conditioning (guidance, frame_rate, None)
    latent_channels: int = 16
    video: bool = False
    five_d: bool = False  # image models with a video-style [C, 1, H, W] latent (Qwen-Image's Wan VAE)
    spatial: int = 8  # image pixels per latent pixel of the family's VAE
    temporal: int = 4  # video frames per latent frame (video families)
    depth_keys: tuple[str, ...] = ()  # config keys holding block counts (what shallow() cuts)
    cond_tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)  # other tensor extras, cache form
    attention_mask: bool = False  # the text encoder returns a token mask (kept in the cache as [T] ones)
    reference_latents: int = 0  # reference images (edit models), each a raw latent of the sample's size
    first_frame: str = ""  # image-to-video: the start frame as CacheLatents' first_frame_style stores it
    clip_vision: tuple = ()  # (clip_vision_output field, tokens, width) the image-to-video model reads
    # [T] extras per text token, kept unbatched: name -> "ones" (long 1s), "weights" (float 1s) or "ids:N" (int32 < N)
    token_tensors: dict[str, str] = field(default_factory=dict)
    # models trained on ComfyUI's packed video + audio row (MiniMax H3): the audio stream's shape [C, ...]
    audio_stream: tuple[int, ...] = ()
    # config keys the released file keeps in its metadata ("config" -> "transformer"), where detection reads them
    file_config: tuple[str, ...] = ()

    def latent(self, size: int, frames: int = 1, height: int = 0) -> tuple[int, ...]:
        """Raw VAE latent of one sample (before process_latent_in, batch dim removed) at width `size` x
        `height` (default size), x `frames` for video families: what the family's VAE in ComfyUI outputs
        (comfy/sd.py VAE: spatial ratio 8, 16 or 32; temporal floor((frames + t - 1) / t)). With an
        audio_stream, the packed row [1, N] of video then audio (comfy.utils.pack_latents)."""
        streams = self.latent_streams(size, frames, height)
        if self.audio_stream:
            return (1, sum(math.prod(s) for s in streams))
        return streams[0]

    def latent_streams(self, size: int, frames: int = 1, height: int = 0) -> list[tuple[int, ...]]:
        """The latent's streams: the VAE latent, then the audio stream where there is one."""
        h, w = (height or size) // self.spatial, size // self.spatial
        if self.video:
            video = (self.latent_channels, (frames + self.temporal - 1) // self.temporal, h, w)
        else:
            video = (self.latent_channels, *((1,) if self.five_d else ()), h, w)
        return [video, *([self.audio_stream] if self.audio_stream else [])]


# Reused configurations (what ComfyUI's detection returns for the released files).
_FLUX_DEV = dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=4096,
                 hidden_size=3072, mlp_ratio=4.0, num_heads=24, depth=19, depth_single_blocks=38,
                 axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True)
_FLUX_DEPTH = ("depth", "depth_single_blocks")
_HUNYUAN = dict(image_model="hunyuan_video", mlp_ratio=4.0, theta=256, qkv_bias=True, meanflow=False,
                use_cond_type_embedding=False, vision_in_dim=None)
_COSMOS_COMMON = dict(max_img_h=240, max_img_w=240, max_frames=128, in_channels=16, out_channels=16,
                      patch_spatial=2, patch_temporal=1, concat_padding_mask=True, pos_emb_cls="rope3d",
                      pos_emb_interpolation="crop", use_adaln_lora=True, adaln_lora_dim=256)
# HiDream I1: which Llama-3.1 layer feeds each block (16 double then 32 single), as detection sets it.
_HIDREAM_LLAMA = list(range(32)) + [31] * 16

SHAPES: dict[str, Shape] = {
    "flux_dev": Shape("Flux", dict(_FLUX_DEV), text_tokens=512, text_dim=4096, pooled_dim=768,
                      extras={"guidance": 1.0}, depth_keys=_FLUX_DEPTH),
    "wan21_14b": Shape("WAN21_T2V", dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), in_dim=16,
                                         dim=5120, ffn_dim=13824, freq_dim=256, text_dim=4096, out_dim=16,
                                         num_heads=40, num_layers=40, window_size=(-1, -1), qk_norm=True,
                                         cross_attn_norm=True, eps=1e-6),
                       text_tokens=512, text_dim=4096, video=True, depth_keys=("num_layers",)),
    "wan21_1_3b": Shape("WAN21_T2V", dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), in_dim=16,
                                          dim=1536, ffn_dim=8960, freq_dim=256, text_dim=4096, out_dim=16,
                                          num_heads=12, num_layers=30, window_size=(-1, -1), qk_norm=True,
                                          cross_attn_norm=True, eps=1e-6),
                        text_tokens=512, text_dim=4096, video=True, depth_keys=("num_layers",)),
    "qwen_image": Shape("QwenImage", dict(image_model="qwen_image", in_channels=64, num_layers=60),
                        text_tokens=256, text_dim=3584, five_d=True, depth_keys=("num_layers",)),
    "sdxl": Shape("SDXL", {"use_checkpoint": False, "image_size": 32, "out_channels": 4,
                           "use_spatial_transformer": True, "legacy": False, "num_classes": "sequential",
                           "adm_in_channels": 2816, "in_channels": 4, "model_channels": 320,
                           "num_res_blocks": [2, 2, 2], "transformer_depth": [0, 0, 2, 2, 10, 10],
                           "channel_mult": [1, 2, 4], "transformer_depth_middle": 10,
                           "use_linear_in_transformer": True, "context_dim": 2048, "num_head_channels": 64,
                           "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
                           "use_temporal_attention": False, "use_temporal_resblock": False},
                  text_tokens=77, text_dim=2048, pooled_dim=1280, latent_channels=4),
    # ---- the other families of ComfyUI 0.3.75, released sizes (tokens: the text encoder's padding, or
    # a 256-token caption where it does not pad) ----
    # Chroma1-HD: Flux-schnell blocks with the distilled modulation approximator (n_layers 5, kept)
    "chroma": Shape("Chroma", dict(image_model="chroma", in_channels=64, out_channels=64, context_in_dim=4096,
                                   hidden_size=3072, mlp_ratio=4.0, num_heads=24, depth=19, depth_single_blocks=38,
                                   axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True, in_dim=64,
                                   out_dim=3072, hidden_dim=5120, n_layers=5),
                    text_tokens=256, text_dim=4096, extras={"pooled_output": None}, depth_keys=_FLUX_DEPTH),
    "flux_kontext": Shape("Flux", dict(_FLUX_DEV), text_tokens=512, text_dim=4096, pooled_dim=768,
                          extras={"guidance": 2.5}, depth_keys=_FLUX_DEPTH, reference_latents=1),
    # SD 3.5 Large: width = 64 x depth (MMDiT), so num_blocks carries the block count
    "sd35_large": Shape("SD3", dict(in_channels=16, out_channels=16, patch_size=2, depth=38, num_blocks=38,
                                    input_size=None, adm_in_channels=2048, num_patches=36864, pos_embed_max_size=192,
                                    context_embedder_config={"target": "torch.nn.Linear",
                                                             "params": {"in_features": 4096, "out_features": 2432}},
                                    qk_norm="rms", pos_embed_scaling_factor=None, x_block_self_attn_layers=[]),
                        text_tokens=154, text_dim=4096, pooled_dim=2048, depth_keys=("num_blocks",)),
    # AuraFlow v0.3 (max_seq 9216 = its 96x96 position table; v0.1/0.2 have 4096)
    "auraflow": Shape("AuraFlow", dict(max_seq=9216, cond_seq_dim=2048, n_double_layers=4, n_layers=36),
                      text_tokens=256, text_dim=2048, latent_channels=4, depth_keys=("n_double_layers", "n_layers")),
    "lumina2": Shape("Lumina2", dict(image_model="lumina2", patch_size=2, in_channels=16, dim=2304, cap_feat_dim=2304,
                                     n_layers=26, qk_norm=True, n_heads=24, n_kv_heads=8, axes_dims=[32, 32, 32],
                                     axes_lens=[300, 512, 512], rope_theta=10000.0, ffn_dim_multiplier=4.0),
                     text_tokens=256, text_dim=2304, attention_mask=True, depth_keys=("n_layers",)),
    "z_image": Shape("ZImage", dict(image_model="lumina2", patch_size=2, in_channels=16, dim=3840, cap_feat_dim=2560,
                                    n_layers=30, qk_norm=True, n_heads=30, n_kv_heads=30, axes_dims=[32, 48, 48],
                                    axes_lens=[1536, 512, 512], rope_theta=256.0, ffn_dim_multiplier=8.0 / 3.0,
                                    z_image_modulation=True, time_scale=1000.0, pad_tokens_multiple=32),
                     text_tokens=256, text_dim=2560, attention_mask=True, depth_keys=("n_layers",)),
    # HiDream I1 Full: cross_attn = T5 (128 tokens), conditioning_llama3 = all 32 Llama-3.1-8B layers
    "hidream_i1_full": Shape("HiDream", dict(image_model="hidream", attention_head_dim=128, axes_dims_rope=[64, 32, 32],
                                             caption_channels=[4096, 4096], max_resolution=[128, 128], in_channels=16,
                                             llama_layers=list(_HIDREAM_LLAMA), num_attention_heads=20,
                                             num_routed_experts=4, num_activated_experts=2, num_layers=16,
                                             num_single_layers=32, out_channels=16, patch_size=2, text_emb_dim=2048),
                             text_tokens=128, text_dim=4096, pooled_dim=2048,
                             cond_tensors={"conditioning_llama3": (32, 128, 4096)},
                             depth_keys=("num_layers", "num_single_layers")),
    "qwen_image_edit": Shape("QwenImage", dict(image_model="qwen_image", in_channels=64, num_layers=60),
                             text_tokens=256, text_dim=3584, five_d=True, depth_keys=("num_layers",),
                             reference_latents=1),
    # HunyuanImage 2.1 (base, not distilled): 32x VAE with 64 channels, ByT5 glyph mapper present
    "hunyuan_image21": Shape("HunyuanImage21", dict(_HUNYUAN, in_channels=64, out_channels=64, patch_size=[1, 1],
                                                    vec_in_dim=None, axes_dim=[64, 64], context_in_dim=3584,
                                                    hidden_size=3584, num_heads=28, depth=20, depth_single_blocks=40,
                                                    byt5=True, guidance_embed=False),
                             text_tokens=256, text_dim=3584, latent_channels=64, spatial=32, depth_keys=_FLUX_DEPTH),
    "omnigen2": Shape("Omnigen2", dict(image_model="omnigen2", axes_dim_rope=[40, 40, 40], axes_lens=[1024, 1664, 1664],
                                       ffn_dim_multiplier=None, hidden_size=2520, in_channels=16, multiple_of=256,
                                       norm_eps=1e-05, num_attention_heads=21, num_kv_heads=7, num_layers=32,
                                       num_refiner_layers=2, out_channels=None, patch_size=2, text_feat_dim=2048,
                                       timestep_scale=1000.0),
                      text_tokens=256, text_dim=2048, attention_mask=True, depth_keys=("num_layers",)),
    # Cosmos Predict2 2B text-to-image: Wan 2.1 VAE, so a [16, 1, h, w] latent
    "cosmos_predict2_2b": Shape("CosmosT2IPredict2", dict(
        _COSMOS_COMMON, image_model="cosmos_predict2", model_channels=2048, crossattn_emb_channels=1024,
        pos_emb_learnable=True, min_fps=1, max_fps=30, num_blocks=28, num_heads=16, extra_per_block_abs_pos_emb=False,
        rope_h_extrapolation_ratio=4.0, rope_w_extrapolation_ratio=4.0, rope_t_extrapolation_ratio=1.0,
        extra_h_extrapolation_ratio=1.0, extra_w_extrapolation_ratio=1.0, extra_t_extrapolation_ratio=1.0,
        rope_enable_fps_modulation=False),
                                text_tokens=512, text_dim=1024, five_d=True, attention_mask=True,
                                depth_keys=("num_blocks",)),
    # FLUX.2 [dev]: Mistral-Small-3 text (3 layers x 5120 = 15360 wide, padded to 512 tokens by extra_conds)
    "flux2_dev": Shape("Flux2", dict(image_model="flux2", axes_dim=[32, 32, 32, 32], num_heads=48, mlp_ratio=3.0,
                                     theta=2000, out_channels=128, global_modulation=True, vec_in_dim=None,
                                     mlp_silu_act=True, qkv_bias=False, ops_bias=False, default_ref_method="index",
                                     ref_index_scale=10.0, in_channels=128, hidden_size=6144, context_in_dim=15360,
                                     patch_size=1, depth=8, depth_single_blocks=48, guidance_embed=True),
                       text_tokens=512, text_dim=15360, extras={"pooled_output": None, "guidance": 4.0},
                       latent_channels=128, spatial=16, depth_keys=_FLUX_DEPTH),
    # LTX-Video 0.9.x 2B (files without a "config" metadata entry; later 0.9.x files may add one)
    "ltxv_2b": Shape("LTXV", dict(image_model="ltxv", num_layers=28, attention_head_dim=64, cross_attention_dim=2048),
                     text_tokens=128, text_dim=4096, extras={"frame_rate": 25.0}, attention_mask=True,
                     latent_channels=128, video=True, spatial=32, temporal=8, depth_keys=("num_layers",)),
    "hunyuan_video": Shape("HunyuanVideo", dict(_HUNYUAN, in_channels=16, out_channels=16, patch_size=[1, 2, 2],
                                                vec_in_dim=768, axes_dim=[16, 56, 56], context_in_dim=4096,
                                                hidden_size=3072, num_heads=24, depth=20, depth_single_blocks=40,
                                                byt5=False, guidance_embed=True),
                           text_tokens=256, text_dim=4096, pooled_dim=768, extras={"guidance": 6.0}, video=True,
                           depth_keys=_FLUX_DEPTH),
    # HunyuanVideo 1.5 (8.3B, 480p/720p t2v files): 65 input channels = 32 latent + 32 image + 1 mask. For
    # text-to-video extra_conds needs only pooled_output (None: HunyuanVideo's encode_adm reads the key):
    # concat_cond fills zeros for the absent image and mask, and without clip_vision_output no vision
    # tokens are added.
    "hunyuan_video15": Shape("HunyuanVideo15", dict(_HUNYUAN, in_channels=65, out_channels=32, patch_size=[1, 1, 1],
                                                    vec_in_dim=None, axes_dim=[16, 56, 56], context_in_dim=3584,
                                                    hidden_size=2048, num_heads=16, depth=54, depth_single_blocks=0,
                                                    byt5=True, guidance_embed=False, use_cond_type_embedding=True,
                                                    vision_in_dim=1152),
                             text_tokens=256, text_dim=3584, extras={"pooled_output": None}, latent_channels=32,
                             video=True, spatial=16, depth_keys=_FLUX_DEPTH),
    "cosmos1_7b_t2v": Shape("CosmosT2V", dict(
        _COSMOS_COMMON, image_model="cosmos", model_channels=4096, block_config="FA-CA-MLP", pos_emb_learnable=False,
        block_x_format="THWBD", affline_emb_norm=True, num_blocks=28, num_heads=32, extra_per_block_abs_pos_emb=True,
        rope_h_extrapolation_ratio=1.0, rope_w_extrapolation_ratio=1.0, rope_t_extrapolation_ratio=2.0,
        extra_per_block_abs_pos_emb_type="learnable"),
                            text_tokens=512, text_dim=1024, extras={"frame_rate": 24.0}, attention_mask=True,
                            video=True, temporal=8, depth_keys=("num_blocks",)),
    "wan22_5b": Shape("WAN22_T2V", dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), in_dim=48,
                                        dim=3072, ffn_dim=14336, freq_dim=256, text_dim=4096, out_dim=48, num_heads=24,
                                        num_layers=30, window_size=(-1, -1), qk_norm=True, cross_attn_norm=True,
                                        eps=1e-6),
                      text_tokens=512, text_dim=4096, latent_channels=48, video=True, spatial=16,
                      depth_keys=("num_layers",)),
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

# Image-to-video variants: the same networks with the start frame (and CLIP vision tokens) they read.
_I2V_14B = dict(SHAPES["wan21_14b"].config, model_type="i2v", in_dim=36)  # + the image embedder (img_emb)
SHAPES.update({
    "wan21_i2v_14b": replace(SHAPES["wan21_14b"], family="WAN21_I2V", config=_I2V_14B, first_frame="wan_concat",
                             clip_vision=("penultimate_hidden_states", 257, 1280)),  # CLIP ViT-H/14 at 224
    "wan22_5b_ti2v": replace(SHAPES["wan22_5b"], first_frame="clean_first_frame"),
    "ltxv_2b_i2v": replace(SHAPES["ltxv_2b"], first_frame="clean_first_frame"),
    "hunyuan_video15_i2v": replace(SHAPES["hunyuan_video15"], first_frame="start_frame_concat",
                                   clip_vision=("last_hidden_state", 729, 1152)),  # SigLIP so400m at 384
})


# The families only ComfyUI 0.33+ has (model_shapes_033.py).
SHAPES.update({name: Shape(**fields) for name, fields in SHAPES_033.items()})


def host_lacks(name: str) -> str | None:
    """What the imported ComfyUI lacks for shape `name` (None: nothing), e.g. "comfy.supported_models.Krea2"."""
    import importlib

    need = NEEDS.get(name)
    if need is None:
        return None
    module, attr = need.rsplit(".", 1)
    try:
        return None if hasattr(importlib.import_module(module), attr) else need
    except ImportError:
        return need


# Families whose detection does not count blocks (it derives the count from a width, or fixes it), so a
# file of a shallow() shape loads at the released depth, its extra blocks missing from the file: SD3
# (depth = width / 64), HiDream (16 + 32), Omnigen2 (32), Cosmos 1 and Predict2 (28 or 36 by width),
# Ernie-Image (0.33: every width and the depth are the class defaults, 36 layers).
DETECTION_PINS_DEPTH = frozenset({"SD3", "HiDream", "Omnigen2", "CosmosT2V", "CosmosT2IPredict2", "ErnieImage"})


def shallow(shape: Shape, blocks: int = 2) -> Shape:
    """`shape` with every block count (depth_keys) cut to min(count, blocks), widths unchanged: the released
    layers at a depth a GPU check can afford. Keys that depend on the count follow it (AuraFlow's n_layers
    counts the double layers too; HiDream's llama_layers names one Llama layer per block)."""
    cfg = dict(shape.config)
    if shape.family == "AuraFlow":
        double, single = cfg["n_double_layers"], cfg["n_layers"] - cfg["n_double_layers"]
        cfg["n_double_layers"] = min(double, blocks)
        cfg["n_layers"] = cfg["n_double_layers"] + min(single, blocks)
    else:
        for key in shape.depth_keys:
            cfg[key] = min(cfg[key], blocks)
    if shape.family == "HiDream":  # double blocks take the first entries, single blocks the rest
        layers, full_double = list(shape.config["llama_layers"]), shape.config["num_layers"]
        cfg["llama_layers"] = layers[:cfg["num_layers"]] + layers[full_double:full_double + cfg["num_single_layers"]]
    return replace(shape, config=cfg)


def build(shape: Shape, device: str = "meta", dtype=None):
    """ComfyUI's BaseModel for `shape`, weights uninitialised (device 'meta' allocates nothing).

    dtype: the weights' dtype, set the way ComfyUI's loader sets it (the model then casts its inputs
    to it); None leaves ComfyUI's default (float32)."""
    import comfy.supported_models

    from PipeTrain.tools.tiny_config import host_config  # the keys a newer host's classes require, as detection fills them

    config = getattr(comfy.supported_models, shape.family)(host_config(shape.config))
    if dtype is not None:
        config.set_inference_dtype(dtype, None)
    return config.get_model({}, device=device)


def file_metadata(shape: Shape) -> dict[str, str] | None:
    """The safetensors metadata write_random gives the file: the shape's file_config keys (at the shape's,
    possibly shallow, values) as the released file's "config" entry holds them; None for other shapes."""
    if not shape.file_config:
        return None
    return {"config": json.dumps({"transformer": {k: shape.config[k] for k in shape.file_config}})}


def detect(state_dict: dict, metadata: dict | None = None) -> tuple[str, dict] | None:
    """(supported-model class name, unet_config) that ComfyUI's detection (the steps of
    comfy.sd.load_diffusion_model_state_dict) picks for a diffusion-model state dict; meta tensors do.
    The pack's own header check (nodes/preflight.py) runs the same steps before every launch."""
    from PipeTrain.nodes.preflight import model_config

    config, _, _ = model_config(state_dict, metadata)
    return None if config is None else (type(config).__name__, dict(config.unet_config))


def detected(shape: Shape) -> tuple[str, dict] | None:
    """What ComfyUI's detection makes of the file write_random(shape) writes (read from a meta build)."""
    return detect(build(shape).diffusion_model.state_dict(), file_metadata(shape))


def param_count(shape: Shape) -> int:
    return sum(p.numel() for p in build(shape).diffusion_model.state_dict().values())


def main() -> None:
    """`python model_shapes.py [--blocks N] NAME...`: meta_forward of each shape (cut to N blocks per list)
    at 1024x1024, or 512x512x33 for video; prints one line per shape, exits 1 if any fails. Skipped, with
    the reason: shapes the host ComfyUI lacks (host_lacks) and families meta cannot run (META_READS_DATA)."""
    import argparse

    from bench_env import setup
    from meta_run import META_READS_DATA, meta_forward

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("names", nargs="*", default=[n for n in SHAPES if not n.startswith("tiny")])
    parser.add_argument("--blocks", type=int, default=2)
    args = parser.parse_args()
    setup(pytorch_attention=True)
    failed = 0
    for name in args.names:
        shape = shallow(SHAPES[name], args.blocks)
        size, frames = (512, 33) if shape.video else (1024, 1)
        skip = (f"needs {host_lacks(name)} (ComfyUI 0.33+)" if host_lacks(name)
                else f"cannot run on meta: {META_READS_DATA[shape.family]}" if shape.family in META_READS_DATA else "")
        if skip:
            print(f"{name}: skipped, {skip}", flush=True)
            continue
        try:
            out = meta_forward(shape, size, frames)
            ok = out == shape.latent(size, frames)
            print(f"{name}: {'ok' if ok else 'WRONG OUTPUT'} latent {shape.latent(size, frames)} -> {out}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported per shape
            ok = False
            print(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        failed += not ok
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
