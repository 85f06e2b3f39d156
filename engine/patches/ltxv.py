"""Out-of-place forwards for LTX-Video's BasicTransformerBlock (comfy/ldm/lightricks/model.py).

Upstream writes the residual with `x.addcmul_(...)` and `x += attn2(x, ...)`. attn2's query
projection (and a LoRA on it) saved `x`, so LoRA backward fails; under per-block checkpointing the
block mutates its own input, so the recompute starts from the post-block value and, with a latent
that requires grad, gives no error, only wrong gradients. These copies write each update into a
new tensor, rounded to the residual's dtype where upstream's in-place op would have stored it.

Two fixes, one per upstream shape of the block:
- 0.3.75 up to 0.33: six modulation rows; modulated norm as `addcmul(n, n, scale).add_(shift)`.
- 0.33 and later: a self-attention mask and `prompt_timestep` arguments, three more rows for the
  cross-attention adaLN variant (LTX 2.x), and in training mode (the flag PipeTrain always sets)
  the modulated norm as `rms_norm(x) * (1 + scale) + shift`.
Importing this module needs ComfyUI on sys.path.
"""
from __future__ import annotations

import comfy.ldm.common_dit
import comfy.ldm.lightricks.model as ltxv_model
import torch

from .fixes import Fix
from .flux import into

MODULE = "comfy.ldm.lightricks.model"


def _rows(self, x, timestep, lo, hi):
    table = self.scale_shift_table[None, None, lo:hi].to(device=x.device, dtype=x.dtype)
    return (table + timestep.reshape(x.shape[0], timestep.shape[1], self.scale_shift_table.shape[0], -1)[:, :, lo:hi]
            ).unbind(dim=2)


def _modulate_075(normed, scale, shift):
    # Upstream: torch.addcmul(normed, normed, scale).add_(shift); the add_ keeps addcmul's dtype.
    scaled = torch.addcmul(normed, normed, scale)
    return (scaled + shift).to(scaled.dtype)


def forward_075(self, x, context=None, attention_mask=None, timestep=None, pe=None, transformer_options={}):
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = _rows(self, x, timestep, 0, None)
    attn1_out = self.attn1(_modulate_075(comfy.ldm.common_dit.rms_norm(x), scale_msa, shift_msa),
                           pe=pe, transformer_options=transformer_options)
    x = torch.addcmul(x, attn1_out, gate_msa).to(x.dtype)
    x = into(x, self.attn2(x, context=context, mask=attention_mask, transformer_options=transformer_options))
    ff_out = self.ff(_modulate_075(comfy.ldm.common_dit.rms_norm(x), scale_mlp, shift_mlp))
    return torch.addcmul(x, ff_out, gate_mlp).to(x.dtype)


def forward_033(self, x, context=None, attention_mask=None, timestep=None, pe=None, transformer_options={},
                self_attention_mask=None, prompt_timestep=None):
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = _rows(self, x, timestep, 0, 6)
    normed = comfy.ldm.common_dit.rms_norm(x) * (1 + scale_msa) + shift_msa
    attn1_out = self.attn1(normed, pe=pe, mask=self_attention_mask, transformer_options=transformer_options)
    x = into(x, attn1_out * gate_msa)
    if self.cross_attention_adaln:
        shift_q, scale_q, gate_q = _rows(self, x, timestep, 6, 9)
        cross = ltxv_model.apply_cross_attention_adaln(x, context, self.attn2, shift_q, scale_q, gate_q,
                                                       self.prompt_scale_shift_table, prompt_timestep,
                                                       attention_mask, transformer_options)
    else:
        cross = self.attn2(x, context=context, mask=attention_mask, transformer_options=transformer_options)
    x = into(x, cross)
    ff_out = self.ff(_modulate_075(comfy.ldm.common_dit.rms_norm(x), scale_mlp, shift_mlp))
    return torch.addcmul(x, ff_out, gate_mlp).to(x.dtype)


FIXES = (
    Fix("ltxv-block 0.3.75", MODULE, ("BasicTransformerBlock",), {"BasicTransformerBlock.forward": forward_075},
        since="0.3.75", before="0.33.0"),
    Fix("ltxv-block 0.33", MODULE, ("BasicTransformerBlock",), {"BasicTransformerBlock.forward": forward_033},
        since="0.33.0", before=None),
)
