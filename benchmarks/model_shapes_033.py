"""Full-size shapes of the families only ComfyUI 0.33 and later have (needs ComfyUI 0.33+).

model_shapes.py merges these into its SHAPES (as model_shapes.Shape keyword arguments: this module
imports nothing, so model_shapes.py can import it while it runs as a script). NEEDS names, per shape,
what the host ComfyUI must have; model_shapes.host_lacks(name) checks it, and tests and scripts skip
a shape on an older host with that reason.

Each config is what 0.33.0's comfy/model_detection.py makes of the released file: the keys it pins,
plus the widths and depths it reads from tensors, at their released values. Where ComfyUI's code does
not give a released value, the comment says where it comes from. Text widths are the text encoders'
(comfy/text_encoders/*), tokens the encoder's padding or a 256-token caption where it does not pad.

LTX 2.3 (LTXAV) reads most of its configuration from the file's metadata ("config" -> "transformer"),
not from its tensors: its shape lists those keys in `file_config`, and write_random writes them there.
"""
from __future__ import annotations

# What detection gives every Flux 2 file (comfy/model_detection.py, 'flux2' branch), and the flags it reads
# as off from the tensors a Klein file lacks (vector_in, guidance_in: distilled, the yak MLP gate, txt_norm).
# num_heads = hidden_size / 128 (sum of axes_dim).
_FLUX2 = dict(image_model="flux2", axes_dim=[32, 32, 32, 32], mlp_ratio=3.0, theta=2000, out_channels=128,
              global_modulation=True, mlp_silu_act=True, qkv_bias=False, ops_bias=False, default_ref_method="index",
              ref_index_scale=10.0, txt_ids_dims=[3], patch_size=1, vec_in_dim=None, yak_mlp=False, txt_norm=False,
              in_channels=128, guidance_embed=False)
_FLUX_DEPTH = ("depth", "depth_single_blocks")
# Klein's text: Qwen3 hidden states of layers 9, 18, 27 stacked along the features (text_encoders/flux.py
# Qwen3_4BModel / Qwen3_8BModel), padded to 512 tokens (Qwen3Tokenizer min_length); with an attention mask.
_KLEIN_COND = dict(text_tokens=512, extras={"pooled_output": None}, attention_mask=True, latent_channels=128,
                   spatial=16, depth_keys=_FLUX_DEPTH)

SHAPES_033: dict[str, dict] = {
    # FLUX.2 [klein] 4B: 5 double + 20 single blocks at 3072 (24 heads), text 3 x 2560 (Qwen3-4B) = 7680.
    # Widths and depths: public descriptions of the released model (BFL's Klein4B params as described on
    # mintlify.com OminiX-MLX "flux-klein-mlx": 5 double, 20 single, 7680-wide text).
    "flux2_klein_4b": dict(family="Flux2", config=dict(_FLUX2, hidden_size=3072, num_heads=24, context_in_dim=3 * 2560,
                                                       depth=5, depth_single_blocks=20),
                           text_dim=3 * 2560, **_KLEIN_COND),
    # FLUX.2 [klein] 9B: 8 double + 24 single blocks at 4096 (32 heads), text 3 x 4096 (Qwen3-8B) = 12288
    # (happyin.space "FLUX.2 Klein 9B Architecture": hidden 4096, 8 double, 24 single).
    "flux2_klein_9b": dict(family="Flux2", config=dict(_FLUX2, hidden_size=4096, num_heads=32, context_in_dim=3 * 4096,
                                                       depth=8, depth_single_blocks=24),
                           text_dim=3 * 4096, **_KLEIN_COND),
    # Anima: Cosmos-Predict2-2B's network (2048 channels, 28 blocks; detection sets 16 heads at 2048) with the
    # LLM adapter (fixed widths). Text: Qwen3-0.6B last hidden states (1024) with its mask, plus the T5 token
    # ids and weights the adapter reads (text_encoders/anima.py). Qwen-Image's VAE: a [16, 1, h, w] latent.
    "anima": dict(family="Anima", config=dict(
        image_model="anima", max_img_h=240, max_img_w=240, max_frames=128, in_channels=16, out_channels=16,
        patch_spatial=2, patch_temporal=1, model_channels=2048, num_heads=16, num_blocks=28, concat_padding_mask=True,
        crossattn_emb_channels=1024, pos_emb_cls="rope3d", pos_emb_learnable=True, pos_emb_interpolation="crop",
        min_fps=1, max_fps=30, use_adaln_lora=True, adaln_lora_dim=256, extra_per_block_abs_pos_emb=False,
        rope_h_extrapolation_ratio=4.0, rope_w_extrapolation_ratio=4.0, rope_t_extrapolation_ratio=1.0,
        extra_h_extrapolation_ratio=1.0, extra_w_extrapolation_ratio=1.0, extra_t_extrapolation_ratio=1.0,
        rope_enable_fps_modulation=False),
                  text_tokens=256, text_dim=1024, extras={"pooled_output": None}, attention_mask=True,
                  token_tensors={"t5xxl_ids": "ids:32128", "t5xxl_weights": "weights"}, five_d=True,
                  depth_keys=("num_blocks",)),
    # Ernie-Image: detection returns {"image_model": "ernie"} only, so every width and the depth are
    # ErnieImageModel's defaults (hidden 4096, 32 heads, 36 layers, text 3072 = Ministral-3-3B's hidden
    # states); Flux 2's VAE (128 channels at 16x). num_layers is here for shallow(): detection pins the depth,
    # so a shallow file loads at 36 layers (model_shapes.DETECTION_PINS_DEPTH).
    "ernie_image": dict(family="ErnieImage", config=dict(image_model="ernie", num_layers=36), text_tokens=256,
                        text_dim=3072, latent_channels=128, spatial=16, depth_keys=("num_layers",)),
    # Ideogram 4: detection reads in_channels and the depth: 128 (32 VAE channels x 2x2) and 34 layers, the class
    # defaults and the release's (ideogram-oss/ideogram4 docs/model_architecture.md; 9.3B). Ideogram4's
    # unet_extra_config pins the rest (18 heads of 256, text 13 Qwen3-VL-8B layers x 4096 = 53248).
    "ideogram4": dict(family="Ideogram4", config=dict(image_model="ideogram4", in_channels=128, num_layers=34),
                      text_tokens=256, text_dim=13 * 4096, extras={"pooled_output": None}, attention_mask=True,
                      latent_channels=128, spatial=16, depth_keys=("num_layers",)),
    # Krea 2: detection pins head size 128 and reads the rest; the values are SingleStreamDiT's defaults
    # (6144 wide: 48 heads, 12 kv heads, 28 blocks; text fusion of 12 Qwen3-VL-4B layers x 2560 = 30720,
    # text_encoders/krea2.py), as released (Krea-2 Diffusers model cards: 12.9B, 28 blocks at 6144).
    # Qwen-Image VAE: a [16, 1, h, w] latent.
    "krea2": dict(family="Krea2", config=dict(image_model="krea2", features=6144, channels=16, patch=2, layers=28,
                                              heads=48, kvheads=12, txtlayers=12, txtdim=2560),
                  text_tokens=256, text_dim=12 * 2560, five_d=True, depth_keys=("layers",)),
}

# MiniMax H3: everything read from the tensors; the values are MiniMaxH3Model's defaults (5376 wide, 50
# blocks, 56 heads of 128, 2 token-refiner blocks, text 5120 = Qwen3-VL-32B layer-50 states, rope of 16
# frequencies), as released (PipeNetwork/minimax-h3-mlx README: 33B, 50 blocks, hidden 5376, 56x128 heads,
# ffn 14336). The time-embedder form (the class default; detection also knows the adaln curve-table form of
# pruned repacks).
# Trained as ComfyUI's sampler packs its latent: video [24, T, h, w] (16x, 4 frames per latent frame) then
# an audio stream of no frames [32, 2, 0], one row with `latent_shapes`; text tags 1 per token.
_MINIMAX_H3 = dict(family="MiniMaxH3", config=dict(
    image_model="minimax_h3", num_layers=50, token_refiner_num_layers=2, hidden_size=5376, latents_dim=24,
    audio_latents_dim=32, attention_head_dim=128, num_attention_heads=56, ffn_hidden_size=14336, text_dim=5120,
    timestep_input_dim=256, time_embed_hidden_size=5376, time_embed_dim=2688, rope_inv_freq_len=16),
                   text_tokens=256, text_dim=5120, extras={"pooled_output": None},
                   token_tensors={"minimax_token_tags": "ones"}, latent_channels=24, spatial=16,
                   audio_stream=(32, 2, 0), depth_keys=("num_layers", "token_refiner_num_layers"))
SHAPES_033["minimax_h3_t2i"] = dict(_MINIMAX_H3, five_d=True)
SHAPES_033["minimax_h3_t2v"] = dict(_MINIMAX_H3, video=True)
# With its sound, as Cache Latents' audio_vae packs it: 40 audio latent frames (a second at 40 per second).
SHAPES_033["minimax_h3_t2v_audio"] = dict(_MINIMAX_H3, video=True, audio_stream=(32, 2, 40))

# LTX 2.3 (22 B): detection reads the depth and two widths from the tensors and takes the rest from the
# file's metadata transformer section. Values as the released ltx-2.3-22b files declare them (public copies
# of that section, e.g. in FastVideo's and LTX-2 ports' loaders): 48 layers; video 32 heads x 128 (4096),
# audio 32 x 64 (2048); cross-attention adaLN, gated attention in blocks and connectors; the caption
# projection before the 8-layer text connectors (128 registers), done by the text encoder's dual projection,
# so the cached text is 4096 + 2048 wide and flagged unprocessed (extra_conds runs the connectors, frozen).
# Trained as ComfyUI's sampler packs its latent: video [128, T, h, w] (32x, 8 frames per latent frame) then
# audio [8, T, 16] at 25 latent frames a second (16 kHz, hop 160, 4x down), one second here.
_LTX23_FILE = dict(num_layers=48, num_attention_heads=32, attention_head_dim=128, cross_attention_dim=4096,
                   audio_num_attention_heads=32, audio_attention_head_dim=64, audio_cross_attention_dim=2048,
                   caption_channels=3840, in_channels=128, positional_embedding_theta=10000.0,
                   positional_embedding_max_pos=[20, 2048, 2048], audio_positional_embedding_max_pos=[20],
                   timestep_scale_multiplier=1000, av_ca_timestep_scale_multiplier=1000.0,
                   causal_temporal_positioning=True, use_middle_indices_grid=True, apply_gated_attention=True,
                   connector_apply_gated_attention=True, connector_attention_head_dim=128,
                   connector_num_attention_heads=32, connector_num_layers=8, audio_connector_attention_head_dim=64,
                   audio_connector_num_attention_heads=32, caption_projection_first_linear=False,
                   caption_proj_before_connector=True, cross_attention_adaln=True, rope_type="split",
                   frequencies_precision="float64")
SHAPES_033["ltx23_t2v"] = dict(family="LTXAV", config=dict(image_model="ltxav", use_keyframes_abs_pos_embedding=False,
                                                           **_LTX23_FILE),
                               file_config=tuple(_LTX23_FILE), text_tokens=256, text_dim=4096 + 2048,
                               extras={"unprocessed_ltxav_embeds": True}, latent_channels=128, video=True,
                               spatial=32, temporal=8, audio_stream=(8, 25, 16), depth_keys=("num_layers",))

# What the host ComfyUI must have for each shape (Flux 2 is older than Klein, whose own part is its text encoder).
NEEDS = {"flux2_klein_4b": "comfy.text_encoders.flux.klein_te", "flux2_klein_9b": "comfy.text_encoders.flux.klein_te",
         "anima": "comfy.supported_models.Anima", "ernie_image": "comfy.supported_models.ErnieImage",
         "ideogram4": "comfy.supported_models.Ideogram4", "krea2": "comfy.supported_models.Krea2",
         "minimax_h3_t2i": "comfy.supported_models.MiniMaxH3", "minimax_h3_t2v": "comfy.supported_models.MiniMaxH3",
         "minimax_h3_t2v_audio": "comfy.supported_models.MiniMaxH3", "ltx23_t2v": "comfy.supported_models.LTXAV"}
