"""Tiny random-init configs of the families only ComfyUI 0.33 and later have, with per-item
conditioning in the form the latent cache holds it, for tests/with_comfy/test_families_033.py.

Same `Family` records as tests/family_configs.py (built with fc.build, batched with fc.batch, trained
by tests/family_harness.py). Importing this module imports no ComfyUI code, so it loads on 0.3.75
too, where the test skips these families (their classes are missing there).

Where 0.33.0's detection (comfy.model_detection) reads every width from the tensors, the config is
exactly what it detects for the tiny model's own state dict (test_families_033.py checks that):
- Krea 2: head size 128 is pinned, so `features` = 128 x heads; everything else is read from shapes
  (the text-fusion heads are not read at all: the default 20, so `txtdim` is a multiple of 20).
- Anima: Cosmos-Predict2 detection pins the text width (1024), the adaLN-LoRA width (256) and, below
  2048 channels, leaves the head count at the class default (16). Its LLM adapter (Qwen3 hidden
  states + T5 token ids -> 1024-wide context) has fixed widths in ComfyUI (about 134 M parameters):
  that is most of this "tiny" model.
- Flux 2 Klein: the Flux 2 keys detection pins (heads of 128 in four rope axes of 32, mlp_ratio 3,
  index reference method, ...) with Klein's own: no guidance embedding (distilled), a text input
  three hidden-state layers of a Qwen3 wide (4B: 3 x 2560; here 3 x 32).
Ernie-Image's detection returns only {"image_model": "ernie"}: every width and the depth are the
class defaults (hidden 4096, 36 layers). Its tiny config goes through comfy.supported_models directly.
Ideogram 4's detection returns the input width and the depth only, and its class pins every other width
(`Family.make` puts the tiny ones in after it).
"""
from __future__ import annotations

import torch

from family_configs import T, Family, _r

# What comfy/model_detection.py (0.33.0) gives every Flux 2 file, and the flags it reads as off from the
# tensors a Klein file lacks (vector_in, yak MLP gate, txt_norm).
_FLUX2_PINNED = dict(image_model="flux2", axes_dim=[32, 32, 32, 32], mlp_ratio=3.0, theta=2000, out_channels=128,
                     global_modulation=True, mlp_silu_act=True, qkv_bias=False, ops_bias=False,
                     default_ref_method="index", ref_index_scale=10.0, txt_ids_dims=[3], patch_size=1,
                     vec_in_dim=None, yak_mlp=False, txt_norm=False)
_KLEIN = dict(_FLUX2_PINNED, in_channels=128, hidden_size=256, num_heads=2, context_in_dim=3 * 32, depth=1,
              depth_single_blocks=1, guidance_embed=False)
# Klein's text encoder stacks 3 Qwen3 hidden-state layers along the features (4B: 3 x 2560).
_KLEIN_TEXT = 3 * 32

_KREA2 = dict(image_model="krea2", features=256, channels=16, patch=2, layers=2, heads=2, kvheads=1, txtlayers=3,
              txtdim=40)
_KREA2_TEXT = 3 * 40  # Krea2Tokenizer/TE: txtlayers hidden-state layers flattened into the feature dim

_ANIMA = dict(image_model="anima", max_img_h=240, max_img_w=240, max_frames=128, in_channels=16, out_channels=16,
              patch_spatial=2, patch_temporal=1, model_channels=256, concat_padding_mask=True,
              crossattn_emb_channels=1024, pos_emb_cls="rope3d", pos_emb_learnable=True, pos_emb_interpolation="crop",
              min_fps=1, max_fps=30, use_adaln_lora=True, adaln_lora_dim=256, num_blocks=2,
              extra_per_block_abs_pos_emb=False, rope_h_extrapolation_ratio=4.0, rope_w_extrapolation_ratio=4.0,
              rope_t_extrapolation_ratio=1.0, extra_h_extrapolation_ratio=1.0, extra_w_extrapolation_ratio=1.0,
              extra_t_extrapolation_ratio=1.0, rope_enable_fps_modulation=False)
_ANIMA_TEXT = 1024  # Qwen3-0.6B hidden states (the LLM adapter's fixed source width)

# Ideogram 4: detection reads only the input width and the depth; the class's __init__ then writes the
# released widths over the config (unet_extra_config: 18 heads of 256, text 13 x 4096 = 53248, ...), so
# the tiny widths go in after it (`_ideogram4`). mrope_section sums to head_dim / 2 (16 of 32, as
# upstream's [24, 20, 20] is 64 of 256), the H and W sections interleaved every third frequency.
_IDEOGRAM4 = dict(image_model="ideogram4", in_channels=128, num_layers=2)
_IDEOGRAM4_WIDTHS = dict(num_attention_heads=2, attention_head_dim=32, intermediate_size=128, adaln_dim=32,
                         llm_features_dim=48, rope_theta=10000, mrope_section=[8, 4, 4], norm_eps=1e-5)
_IDEOGRAM4_TEXT = 48  # Qwen3-VL-8B: 13 tapped hidden-state layers of 4096, flattened (53248)

# MiniMax H3: exactly what detection reads from the tensors (comfy/model_detection.py 'minimax_h3').
# 2 heads of 32 with a partial rope (3 axes x 4 frequencies = 24 of 32 dims, as upstream's 96 of 128).
_MINIMAX_H3 = dict(image_model="minimax_h3", num_layers=2, token_refiner_num_layers=1, hidden_size=64,
                   latents_dim=24, audio_latents_dim=32, attention_head_dim=32, num_attention_heads=2,
                   ffn_hidden_size=64, text_dim=48, timestep_input_dim=32, time_embed_hidden_size=64,
                   time_embed_dim=32, rope_inv_freq_len=4)
_MINIMAX_H3_TEXT = 48  # Qwen3-VL-32B's layer-50 hidden states (5120)

_ERNIE = dict(image_model="ernie", hidden_size=64, num_attention_heads=2, num_layers=2, ffn_hidden_size=128,
              in_channels=128, out_channels=128, patch_size=1, text_in_dim=48, rope_theta=256,
              rope_axes_dim=(8, 12, 12))


def _anima_extras(g):
    """What comfy/text_encoders/anima.py's AnimaTEModel adds for one caption: the T5 token ids (int32)
    and their prompt weights (float), both [L] without a batch dim, next to the Qwen3 attention mask."""
    ids = torch.randint(1, 32128, (5,), generator=g, dtype=torch.int32)
    weights = torch.tensor([1.0, 1.0, 1.2, 1.2, 1.0])
    return {"pooled_output": None, "attention_mask": torch.ones(T, dtype=torch.long), "t5xxl_ids": ids,
            "t5xxl_weights": weights}


def _ideogram4(config):
    """Ideogram 4's BaseModel with the tiny widths put over the ones its class pins."""
    import comfy.supported_models as sm

    model_config = sm.Ideogram4(config)
    model_config.unet_config.update(_IDEOGRAM4_WIDTHS)
    return model_config.get_model({})


def _ideogram4_extras(g, padded=0):
    """What Ideogram4TEModel gives for one caption: the Qwen3-VL attention mask next to no pooled output.
    One caption is never padded (all ones: Ideogram4.extra_conds drops such a mask); `padded` zeros at
    the end stand for a caption padded to a longer one's length (the mask then reaches the model)."""
    mask = torch.ones(T, dtype=torch.long)
    if padded:
        mask[-padded:] = 0
    return {"pooled_output": None, "attention_mask": mask}


def _minimax_h3(config):
    """MiniMax H3's BaseModel; its rope frequencies are a torch.empty buffer a file fills (rope.inv_freq)."""
    import comfy.supported_models as sm

    model = sm.MiniMaxH3(config).get_model({})
    rope = model.diffusion_model.rope
    n = rope.inv_freq.shape[0]
    rope.inv_freq.copy_(1.0 / 10000.0 ** (torch.arange(n, dtype=torch.float32) / n))
    return model


def _packed_av(video, audio_frames: int = 0):
    """A MiniMax H3 latent as ComfyUI's sampler gives it to the model (comfy.utils.pack_latents of the
    video + audio NestedTensor): video [24, T, H, W] and an audio stream [32, 2, frames] (default none),
    flattened into one row [1, N], with the two shapes under `latent_shapes` (BaseModel._apply_model unpacks
    by them; the objective sets them on the model too, so the audio is carried at audio_scale as in sampling)."""
    shapes = [torch.Size((1, *video)), torch.Size((1, 32, 2, audio_frames))]
    return (1, sum(int(s[1:].numel()) for s in shapes)), shapes


def _minimax_extras(shapes):
    """What MiniMaxH3TEModel gives for a text-only caption: per-token adaLN tags (1 = text, [L] long,
    kept without a batch dim), no pooled output; plus the packed latent's stream shapes."""
    return lambda g: {"pooled_output": None, "minimax_token_tags": torch.ones(T, dtype=torch.long),
                      "latent_shapes": shapes}


_H3_IMAGE, _H3_IMAGE_SHAPES = _packed_av((24, 1, 4, 4))
_H3_VIDEO, _H3_VIDEO_SHAPES = _packed_av((24, 2, 4, 4))
_H3_AV, _H3_AV_SHAPES = _packed_av((24, 2, 4, 4), audio_frames=3)  # what Cache Latents' audio_vae writes


def _klein_extras(g):
    return {"pooled_output": None, "attention_mask": torch.ones(T, dtype=torch.long)}


FAMILIES = [
    Family("krea2", "Krea2", _KREA2, (16, 1, 8, 8), _KREA2_TEXT, "t2i", group="Krea 2"),
    # Edit: reference latents take effect only with a reference method (Krea 2 files set none; ComfyUI's
    # "Edit Model Reference Method" node puts it in the conditioning).
    Family("krea2_edit", "Krea2", _KREA2, (16, 1, 8, 8), _KREA2_TEXT, "edit",
           lambda g: {"reference_latents": [_r(g, 16, 1, 8, 8)], "reference_latents_method": "index"},
           group="Krea 2"),
    # Reference tokens modulated as at timestep 0: the block's other code path (per-range, in place inside it).
    Family("krea2_edit_t0", "Krea2", _KREA2, (16, 1, 8, 8), _KREA2_TEXT, "edit",
           lambda g: {"reference_latents": [_r(g, 16, 1, 8, 8)], "reference_latents_method": "index_timestep_zero"},
           group="Krea 2"),
    Family("anima", "Anima", _ANIMA, (16, 1, 8, 8), _ANIMA_TEXT, "t2i", _anima_extras, group="Anima",
           unbatched=("t5xxl_ids", "t5xxl_weights")),
    Family("flux2_klein", "Flux2", _KLEIN, (128, 4, 4), _KLEIN_TEXT, "t2i", _klein_extras, group="Flux 2 Klein"),
    Family("flux2_klein_edit", "Flux2", _KLEIN, (128, 4, 4), _KLEIN_TEXT, "edit",
           lambda g: {**_klein_extras(g), "reference_latents": [_r(g, 128, 4, 4), _r(g, 128, 2, 4)]},
           group="Flux 2 Klein"),
    Family("ernie_image", "ErnieImage", _ERNIE, (128, 4, 4), 48, "t2i", group="Ernie-Image"),
    Family("ideogram4", "Ideogram4", _IDEOGRAM4, (128, 4, 4), _IDEOGRAM4_TEXT, "t2i", _ideogram4_extras,
           group="Ideogram 4", make=_ideogram4),
    # Padded text rows: the block-diagonal segment mask and zeroed text indicators of upstream's other path.
    Family("ideogram4_padded", "Ideogram4", _IDEOGRAM4, (128, 4, 4), _IDEOGRAM4_TEXT, "t2i",
           lambda g: _ideogram4_extras(g, padded=2), group="Ideogram 4", make=_ideogram4),
    Family("minimax_h3_t2i", "MiniMaxH3", _MINIMAX_H3, _H3_IMAGE, _MINIMAX_H3_TEXT, "t2i",
           _minimax_extras(_H3_IMAGE_SHAPES), group="MiniMax H3", unbatched=("minimax_token_tags",),
           make=_minimax_h3),
    Family("minimax_h3_t2v", "MiniMaxH3", _MINIMAX_H3, _H3_VIDEO, _MINIMAX_H3_TEXT, "t2v",
           _minimax_extras(_H3_VIDEO_SHAPES), group="MiniMax H3", unbatched=("minimax_token_tags",),
           make=_minimax_h3),
    Family("minimax_h3_t2v_audio", "MiniMaxH3", _MINIMAX_H3, _H3_AV, _MINIMAX_H3_TEXT, "t2v",
           _minimax_extras(_H3_AV_SHAPES), group="MiniMax H3", unbatched=("minimax_token_tags",),
           make=_minimax_h3),
]
# Families whose config is what 0.33.0's detection reads from their tiny state dict (test_families_033.py).
DETECTED = {"Krea2", "Anima", "Flux2", "MiniMaxH3"}
# Families whose detection reads only these keys (the rest are the class's defaults or pins, full size):
# a tiny file of theirs does not load as the tiny model.
PARTLY_DETECTED = {"ErnieImage": ("image_model",), "Ideogram4": ("image_model", "in_channels", "num_layers")}
# What the host must have for each group (the tests skip naming it): Flux 2 is older than Klein, whose
# own part in ComfyUI is its text encoder (0.3.75 has the Flux2 class but no Klein text encoder).
NEEDS = {"Krea 2": "comfy.supported_models.Krea2", "Anima": "comfy.supported_models.Anima",
         "Flux 2 Klein": "comfy.text_encoders.flux.klein_te", "Ernie-Image": "comfy.supported_models.ErnieImage",
         "Ideogram 4": "comfy.supported_models.Ideogram4", "MiniMax H3": "comfy.supported_models.MiniMaxH3"}
