"""Tiny random-init configs of the other image and video diffusion classes ComfyUI 0.33.0's
comfy/supported_models.py lists (those tests/family_configs.py and tests/family_configs_033.py do
not build), with per-item conditioning in the form the latent cache holds it, for
tests/with_comfy/test_families_033_more.py. Same `Family` records (built with fc.build, batched with
fc.batch, trained by tests/family_harness.py); importing this module imports no ComfyUI code.

FAMILIES train (PATCHED: those only with PipeTrain's out-of-place forwards); HIDREAM_O1 is a class the
engine stops, with the reason it gives (docs/supported-models.md, "Other ComfyUI 0.33.0 classes").
"""
from __future__ import annotations

import torch

from family_configs import _FLUX, _WAN, T, Family, _r
from family_configs import FAMILIES as _OLD


def _recipe(name, **changes):
    """A tests/family_configs.py family's recipe with `changes`."""
    return dict(next(f for f in _OLD if f.name == name).recipe, **changes)


_K5 = dict(image_model="kandinsky5", in_visual_dim=16, out_visual_dim=16, in_text_dim=48, in_text_dim2=32, time_dim=32,
           model_dim=64, ff_dim=128, patch_size=(1, 2, 2), num_text_blocks=1, num_visual_blocks=2,
           axes_dims=(8, 12, 12))
_COG = dict(image_model="cogvideox", num_attention_heads=2, attention_head_dim=32, in_channels=16, out_channels=16,
            time_embed_dim=32, text_embed_dim=48, num_layers=2, sample_width=8, sample_height=8, sample_frames=9,
            max_text_seq_length=T, use_rotary_positional_embeddings=True)
_PIXELDIT = dict(image_model="pixeldit_t2i", in_channels=3, num_groups=2, hidden_size=64, pixel_hidden_size=8,
                 pixel_attn_hidden_size=32, pixel_num_groups=2, patch_depth=2, pixel_depth=1, patch_size=4,
                 txt_embed_dim=48, txt_max_length=T)
# JoyImage's class pins the rope axes (16, 56, 56: heads of 128).
_JOY = dict(image_model="joyimage", patch_size=[1, 2, 2], in_channels=16, hidden_size=256, num_attention_heads=2,
            text_dim=48, mlp_width_ratio=1.0, num_layers=1)
_MAGE = dict(image_model="mage_flow", in_channels=128, out_channels=128, num_layers=2, attention_head_dim=32,
             num_attention_heads=2, joint_attention_dim=48, axes_dims_rope=(8, 12, 12))
_BOOGU = dict(image_model="boogu", patch_size=2, in_channels=16, hidden_size=64, num_layers=2,
              num_double_stream_layers=1, num_refiner_layers=1, num_attention_heads=2, num_kv_heads=1, multiple_of=16,
              axes_dim_rope=(8, 12, 12), axes_lens=(1024, 512, 512), instruction_feat_dim=48)
_W = "Wan variants"


def _concat(channels):
    """A start frame or control latent as concat_latent_image (first_frame_style / control_style)."""
    return lambda g: {"concat_latent_image": _r(g, channels, 3, 8, 8)}


def _masked(g):
    """An unpadded caption's text mask (one caption: all ones)."""
    return {"attention_mask": torch.ones(T, dtype=torch.long)}


def _pooled(width):
    return lambda g: {"pooled_output": _r(g, width)}


FAMILIES = [
    Family("longcat_image", "LongCatImage", dict(_FLUX, guidance_embed=False, vec_in_dim=None, context_in_dim=48,
                                                   txt_ids_dims=[1, 2]),
           (16, 8, 8), 48, "t2i", lambda g: {"pooled_output": None}, group="LongCat-Image"),
    Family("chroma_radiance", "ChromaRadiance",
           _recipe("chroma", image_model="chroma_radiance", in_channels=3, out_channels=3, patch_size=4,
                nerf_hidden_size=16, nerf_mlp_ratio=2, nerf_depth=1, nerf_max_freqs=4, nerf_tile_size=0,
                nerf_final_head_type="linear", nerf_embedder_dtype=torch.float32),
           (3, 16, 16), 48, "t2i", lambda g: {"pooled_output": None, "guidance": 0.0}, group="Chroma Radiance"),
    Family("kandinsky5", "Kandinsky5", dict(_K5, visual_embed_dim=(2 * 16 + 1) * 4), (16, 3, 8, 8), 48, "t2v",
           _pooled(32), group="Kandinsky 5"),
    Family("kandinsky5_image", "Kandinsky5Image", dict(_K5, visual_embed_dim=16 * 4), (16, 8, 8), 48, "t2i",
           _pooled(32), group="Kandinsky 5"),
    Family("joyimage", "JoyImage", _JOY,
           (16, 1, 8, 8), 48, "t2i", group="JoyImage"),
    Family("joyimage_edit", "JoyImage", _JOY, (16, 1, 8, 8), 48, "edit",
           lambda g: {"reference_latents": [_r(g, 16, 1, 8, 8)]}, group="JoyImage"),
    Family("mage_flow", "MageFlow", _MAGE, (128, 4, 4), 48, "t2i", group="MageFlow"),
    Family("mage_flow_edit", "MageFlow", _MAGE, (128, 4, 4), 48, "edit",
           lambda g: {"reference_latents": [_r(g, 128, 4, 4)]}, group="MageFlow"),
    Family("boogu", "Boogu", _BOOGU, (16, 8, 8), 48, "t2i", _masked, group="Boogu"),
    Family("boogu_edit", "Boogu", _BOOGU, (16, 8, 8), 48, "edit",
           lambda g: {**_masked(g), "reference_latents": [_r(g, 16, 8, 8)]}, group="Boogu"),
    Family("cogvideox_t2v", "CogVideoX_T2V", _COG,
           (16, 3, 8, 8), 48, "t2v", group="CogVideoX"),
    Family("cogvideox_i2v", "CogVideoX_I2V", dict(_COG, in_channels=32), (16, 3, 8, 8), 48, "i2v",
           lambda g: {"concat_latent_image": _r(g, 16, 1, 8, 8)}, group="CogVideoX"),
    Family("cogvideox_inpaint", "CogVideoX_Inpaint", dict(_COG, in_channels=48), (16, 3, 8, 8), 48, "i2v",
           lambda g: {"concat_latent_image": _r(g, 32, 3, 8, 8)}, group="CogVideoX"),
    Family("lens", "Lens", dict(image_model="lens", patch_size=1, in_channels=128, out_channels=128, num_layers=2,
                                attention_head_dim=32, num_attention_heads=2, enc_hidden_dim=48,
                                axes_dims_rope=(8, 12, 12), multi_layer_encoder_feature=False),
           (128, 4, 4), 48, "t2i", group="Lens"),
    Family("zimage_pixel", "ZImagePixelSpace",
           dict(image_model="zimage_pixel", patch_size=4, in_channels=3, dim=256, cap_feat_dim=48, n_layers=1,
                n_refiner_layers=1, qk_norm=True, n_heads=8, n_kv_heads=8, axes_dims=[8, 12, 12],
                axes_lens=[1536, 512, 512], rope_theta=256.0, ffn_dim_multiplier=8 / 3, multiple_of=16,
                z_image_modulation=True, time_scale=1000.0, pad_tokens_multiple=32, decoder_hidden_size=32,
                decoder_num_res_blocks=1, decoder_max_freqs=4, decoder_in_channels=48),
           (3, 16, 16), 48, "t2i", group="Z-Image pixel space"),
    # Wan 2.1 / 2.2 variants: each trains on the conditioning the cache holds (text; the start frame or a
    # control latent as concat_latent_image). Their own inputs (VACE frames, camera poses, pose and face
    # videos, audio features, music) come from ComfyUI nodes the cache does not run: extra_conds then
    # gives zeros or leaves them out, as ComfyUI does without those nodes.
    Family("wan21_causal_ar", "WAN21_CausalAR_T2V", dict(_WAN, causal_ar=True), (16, 3, 8, 8), 48, "t2v", group=_W),
    Family("wan21_fun_control", "WAN21_FunControl2V", dict(_WAN, model_type="i2v", in_dim=48), (16, 3, 8, 8), 48,
           "edit", _concat(32), group=_W),  # control video + start image latents, 16 channels each
    Family("wan21_vace", "WAN21_Vace", dict(_WAN, model_type="vace", vace_layers=1, vace_in_dim=96), (16, 3, 8, 8), 48,
           "t2v", group=_W),
    Family("wan21_camera", "WAN21_Camera", dict(_WAN, model_type="camera", in_dim=32, in_dim_control_adapter=24),
           (16, 3, 8, 8), 48, "i2v", _concat(16), group=_W),
    Family("wan22_camera", "WAN22_Camera", dict(_WAN, model_type="camera_2.2", in_dim=36, in_dim_control_adapter=24),
           (16, 3, 8, 8), 48, "i2v", _concat(16), group=_W),
    Family("wan21_flow_rvs", "WAN21_FlowRVS", dict(_WAN, model_type="flow_rvs"), (16, 3, 8, 8), 48, "t2v", group=_W),
    Family("wan21_scail", "WAN21_SCAIL", dict(_WAN, model_type="scail", in_dim=20), (16, 3, 8, 8), 48, "t2v",
           group=_W),
    Family("wan21_scail2", "WAN21_SCAIL2", dict(_WAN, model_type="scail2", in_dim=20), (16, 3, 8, 8), 48, "t2v",
           group=_W),
    # Animate's motion encoder and HuMo's audio projection have fixed widths (31 M and 39 M parameters).
    Family("wan22_animate", "WAN22_Animate", dict(_WAN, model_type="animate", in_dim=36, motion_encoder_dim=32),
           (16, 3, 8, 8), 48, "t2v", group=_W),
    Family("wan_animate2", "WAN_Animate2", dict(_WAN, model_type="animate2", in_dim=36), (16, 3, 8, 8), 48, "t2v",
           group=_W),
    Family("wan21_humo", "WAN21_HuMo", dict(_WAN, model_type="humo"), (16, 3, 8, 8), 48, "t2v", group=_W),
    Family("wan22_s2v", "WAN22_S2V",
           dict(_WAN, model_type="s2v", audio_dim=32, cond_dim=16, audio_inject_layers=[0, 1]), (16, 3, 8, 8), 48,
           "t2v", group=_W),
    Family("wan22_wandancer", "WAN22_WanDancer",
           dict(_WAN, model_type="wandancer", in_dim=36, audio_inject_layers=[0], music_dim=32, music_heads=2,
                music_latent_dim=32),
           (16, 3, 8, 8), 48, "t2v", group=_W),
]

# Classes ComfyUI 0.3.75 has too that tests/family_configs.py does not build: these also run on 0.3.75.
_UNET = {"use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True, "legacy": False,
         "in_channels": 4, "model_channels": 32, "num_res_blocks": [1, 1], "transformer_depth": [0, 1],
         "channel_mult": [1, 2], "transformer_depth_middle": 1, "use_linear_in_transformer": False, "context_dim": 64,
         "transformer_depth_output": [0, 0, 1, 1], "use_temporal_attention": False, "use_temporal_resblock": False,
         "adm_in_channels": None, "num_classes": None}
_SD20 = dict(_UNET, use_linear_in_transformer=True, num_heads=-1, num_head_channels=16)
_PIXART = dict(input_size=64, patch_size=4, in_channels=4, hidden_size=96, depth=2, num_heads=2, caption_channels=48,
               model_max_length=T, pe_interpolation=1)  # PixArt's pos-embed base size needs latents of 33+ pixels
_HYDIT = dict(input_size=(8, 8), patch_size=2, in_channels=4, hidden_size=64, depth=2, num_heads=2, text_states_dim=48,
              text_states_dim_t5=40, text_len=T, text_len_t5=T)


def _hydit_extras(g):
    """HunyuanDiT's two text encoders: CLIP (cross_attn, its mask) and mT5-XL (conditioning_mt5xl, its mask)."""
    ones = torch.ones(T, dtype=torch.long)
    return {"attention_mask": ones, "conditioning_mt5xl": _r(g, T, 40), "attention_mask_mt5xl": ones}


OLDER = [
    Family("flux_schnell", "FluxSchnell", dict(_FLUX, guidance_embed=False), (16, 8, 8), 64, "t2i", _pooled(32),
           group="Flux.1 schnell"),
    # Flux Fill: the masked image as concat_latent_image, the mask at pixel size (64 channels once folded).
    Family("flux_fill", "FluxInpaint", dict(_FLUX, in_channels=96), (16, 8, 8), 64, "edit",
           lambda g: {"pooled_output": _r(g, 32), "guidance": 30.0, "concat_latent_image": _r(g, 16, 8, 8),
                      "concat_mask": (torch.rand(1, 64, 64, generator=g) > 0.5).float()}, group="Flux.1 Fill"),
    Family("pixart_alpha", "PixArtAlpha", dict(_PIXART, image_model="pixart_alpha", micro_condition=True),
           (4, 64, 64), 48, "t2i", group="PixArt"),
    Family("pixart_sigma", "PixArtSigma", dict(_PIXART, image_model="pixart_sigma", micro_condition=False),
           (4, 64, 64), 48, "t2i", group="PixArt"),
    Family("hunyuan_dit", "HunyuanDiT", dict(_HYDIT, image_model="hydit", size_cond=[1024, 1024, 1024, 1024, 0, 0],
                                             use_style_cond=True),
           (4, 8, 8), 48, "t2i", _hydit_extras, group="HunyuanDiT"),
    Family("hunyuan_dit1", "HunyuanDiT1", dict(_HYDIT, image_model="hydit1", size_cond=False, use_style_cond=False),
           (4, 8, 8), 48, "t2i", _hydit_extras, group="HunyuanDiT"),
    # Mochi's block asserts the released visual MLP width (12288 = hidden_size_x x mlp_ratio_x).
    Family("mochi", "GenmoMochi", dict(image_model="mochi_preview", patch_size=2, in_channels=12, hidden_size_x=64,
                                       hidden_size_y=32, depth=1, num_heads=2, mlp_ratio_x=192.0, mlp_ratio_y=2.0,
                                       use_t5=True, t5_feat_dim=48, t5_token_length=T, learn_sigma=False,
                                       timestep_scale=1000.0, qk_norm=True, qkv_bias=False, out_bias=True,
                                       attn_drop=0.0, patch_embed_bias=True, posenc_preserve_area=True,
                                       timestep_mlp_bias=True, attend_to_padding=False, rope_theta=10000.0),
           (12, 3, 8, 8), 48, "t2v", _masked, group="Mochi"),
    # Stage C (the prior); no image prompt: extra_conds gives the zero CLIP image embedding (768 wide).
    Family("cascade_c", "Stable_Cascade_C", dict(stable_cascade_stage="c", c_in=16, c_out=16, c_r=16, c_cond=64,
                                                 c_hidden=[64, 64], nhead=[2, 2], blocks=[[1, 1], [1, 1]],
                                                 block_repeat=[[1, 1], [1, 1]], level_config=["CTA", "CTA"],
                                                 c_clip_text=48, c_clip_text_pooled=32, c_clip_img=768, c_clip_seq=2,
                                                 switch_level=[False]),
           (16, 8, 8), 48, "t2i", lambda g: {"pooled_output": _r(g, 1, 32)}, group="Stable Cascade"),
    Family("sd15", "SD15", dict(_UNET, num_heads=2, num_head_channels=-1), (4, 16, 16), 64, "t2i", group="SD 1.x/2.x"),
    Family("sd20", "SD20", _SD20, (4, 16, 16), 64, "t2i", group="SD 1.x/2.x"),
    Family("sd15_ip2p", "SD15_instructpix2pix", dict(_UNET, in_channels=8, num_heads=2, num_head_channels=-1),
           (4, 16, 16), 64, "edit", lambda g: {"concat_latent_image": _r(g, 4, 16, 16)}, group="SD 1.x/2.x"),
    Family("sdxl_refiner", "SDXLRefiner", dict(_SD20, adm_in_channels=32 + 5 * 256, num_classes="sequential"),
           (4, 16, 16), 64, "t2i", _pooled(32), group="SDXL"),
    Family("sdxl_ip2p", "SDXL_instructpix2pix", _recipe("sdxl", in_channels=8), (4, 16, 16), 64, "edit",
           lambda g: {"pooled_output": _r(g, 32), "concat_latent_image": _r(g, 4, 16, 16)}, group="SDXL"),
]
FAMILIES += OLDER

# PixelDiT: its blocks write the adaLN modulation into the norm output (comfy/ldm/pixeldit apply_adaln_:
# addcmul_ / add_) and PiTBlock adds its MLP residual in place: PipeTrain's out-of-place forwards
# (engine/patches/pixeldit.py) train it; without them the probe refuses both block classes.
PIXELDIT = Family("pixeldit_t2i", "PixelDiTT2I", _PIXELDIT, (3, 16, 16), 48, "t2i", _masked, group="PixelDiT")
FAMILIES.append(PIXELDIT)
# LTX 2.3 (LTXAV): cross-attention adaLN, gated attention, the text connectors after the caption projection
# (here none: the text encoder's dual projection gives video + audio widths, 64 + 32, flagged unprocessed so
# extra_conds runs the connectors). Its latent is ComfyUI's packed video + audio pair (comfy.utils.pack_latents,
# `latent_shapes`): with an audio stream of no frames the model returns the video alone, which
# BaseModel._apply_model cannot compare with the packed input, so the test latent has 3 audio frames.
_LTXAV = dict(image_model="ltxav", in_channels=128, audio_in_channels=128, cross_attention_dim=64,
              audio_cross_attention_dim=32, attention_head_dim=32, num_attention_heads=2, audio_attention_head_dim=16,
              audio_num_attention_heads=2, caption_channels=48, num_layers=2, connector_num_layers=1,
              connector_attention_head_dim=32, connector_num_attention_heads=2, audio_connector_attention_head_dim=16,
              audio_connector_num_attention_heads=2, caption_proj_before_connector=True,
              caption_projection_first_linear=False, cross_attention_adaln=True, apply_gated_attention=True)
# LTX 2.0: plain text cross-attention, the text encoder's connectors already applied (compat mode: video and
# audio context, caption_channels each); for the block tests of test_patches_ltxav.py.
_LTXAV_20 = dict(_LTXAV, caption_proj_before_connector=False, caption_projection_first_linear=True,
                 cross_attention_adaln=False, apply_gated_attention=False)


def _packed(*streams):
    """(packed latent [1, N], its `latent_shapes`): streams packed into one row as comfy.utils.pack_latents does."""
    shapes = [torch.Size((1, *s)) for s in streams]
    return (1, sum(torch.Size(s).numel() for s in streams)), shapes


_AV_LATENT, _AV_SHAPES = _packed((128, 2, 2, 2), (8, 3, 16))  # video [C, T, H, W] + audio [8, T, 16 bins]
LTXAV = Family("ltxav_t2v", "LTXAV", _LTXAV, _AV_LATENT, 96, "t2v",
               lambda g: {"unprocessed_ltxav_embeds": True, "latent_shapes": _AV_SHAPES}, group="LTX 2.3")
LTXAV_20 = Family("ltxav20_t2v", "LTXAV", _LTXAV_20, _AV_LATENT, 96, "t2v",
                  lambda g: {"latent_shapes": _AV_SHAPES}, group="LTX 2.3")
FAMILIES.append(LTXAV)
# Families that train only with PipeTrain's out-of-place forwards: block class -> the fixes the probe picks.
PATCHED = [
    (PIXELDIT, {"comfy.ldm.pixeldit.model.MMDiTBlockT2I": "pixeldit-adaln 0.33",
                "comfy.ldm.pixeldit.modules.PiTBlock": "pixeldit-pit 0.33"}),
    (LTXAV, {"comfy.ldm.lightricks.av_model.BasicAVTransformerBlock": "ltxav-block 0.33"}),
]


def _hidream_o1_extras(g):
    """What HiDreamO1TE gives for one caption: no text features, the token ids in HiDreamO1Tokenizer's
    chat template ([L] long; it ends in the image-start and timestep tokens the model looks for)."""
    ids = [151644, 872, 198, *torch.randint(10, 1000, (3,), generator=g).tolist(), 151645, 198, 151644, 77091, 198,
           151669, 151673]
    return {"pooled_output": None, "text_input_ids": torch.tensor(ids, dtype=torch.long)}


# HiDream-O1: a Qwen3-VL whose decoder layers are the blocks, two levels down (language_model.layers), where
# engine.memory.blocks does not look (and comfy/text_encoders/llama.py's TransformerBlock writes its MLP
# residual into its input: torch.add(..., out=x)); the vocabulary (151936 x 32) is most of this tiny model.
HIDREAM_O1 = Family("hidream_o1", "HiDreamO1", dict(
    image_model="hidream_o1",
    text_config_overrides=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=16, rope_dims=[4, 2, 2]),
    vision_config_overrides=dict(hidden_size=32, num_heads=2, intermediate_size=64, depth=1, num_position_embeddings=64,
                                 deepstack_visual_indexes=())),
    (3, 64, 64), 1, "t2i", _hidream_o1_extras, group="HiDream-O1")
