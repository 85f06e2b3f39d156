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
]
# Families whose config is what 0.33.0's detection reads from their tiny state dict (test_families_033.py).
DETECTED = {"Krea2", "Anima", "Flux2"}
# What the host must have for each group (the tests skip naming it): Flux 2 is older than Klein, whose
# own part in ComfyUI is its text encoder (0.3.75 has the Flux2 class but no Klein text encoder).
NEEDS = {"Krea 2": "comfy.supported_models.Krea2", "Anima": "comfy.supported_models.Anima",
         "Flux 2 Klein": "comfy.text_encoders.flux.klein_te", "Ernie-Image": "comfy.supported_models.ErnieImage"}
