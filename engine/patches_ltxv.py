"""Out-of-place twin of LTXV's BasicTransformerBlock.forward (comfy/ldm/lightricks/model.py).

Upstream writes the residual with `x.addcmul_(...)` and `x += attn2(x, ...)`. attn2's query
projection (and a LoRA on it) saved `x`, so LoRA backward fails in fp32; and under per-block
checkpointing the block mutates its own input, so the recompute starts from the post-block value.
With a latent that requires grad that gives no error, only wrong gradients. This copy writes each
update into a new tensor, rounded to the residual's dtype where upstream's in-place op would have
stored it, so the output is bit-identical.

Only engine/patches.py swaps it in, after checking upstream's source against UPSTREAM_SHA256.
Importing this module needs ComfyUI on sys.path.
"""
from __future__ import annotations

import torch

import comfy.ldm.common_dit

MODULE = "comfy.ldm.lightricks.model"
FAMILIES = "LTXV"
BLOCK_CLASSES = ("BasicTransformerBlock",)

# sha256 of the whitespace-normalised upstream source (engine/patches.py: source_digest),
# ComfyUI 0.3.75. Update it only together with the rewrite it was checked against.
UPSTREAM_SHA256 = {
    "BasicTransformerBlock.forward": "a41c780c767b122a009ea2b217a92ea54ad9d6b667f9a84ffc53cae9b79e1407",
}


def _modulate(normed, scale, shift):
    # Upstream: torch.addcmul(normed, normed, scale).add_(shift); the add_ keeps addcmul's dtype.
    scaled = torch.addcmul(normed, normed, scale)
    return (scaled + shift).to(scaled.dtype)


def basic_transformer_block_forward(self, x, context=None, attention_mask=None, timestep=None, pe=None,
                                    transformer_options={}):
    # Six [B, 1 or tokens, D] modulation rows: the block's table plus the per-sample timestep part.
    table = self.scale_shift_table[None, None].to(device=x.device, dtype=x.dtype)
    ada = table + timestep.reshape(x.shape[0], timestep.shape[1], self.scale_shift_table.shape[0], -1)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = ada.unbind(dim=2)

    attn1_out = self.attn1(_modulate(comfy.ldm.common_dit.rms_norm(x), scale_msa, shift_msa),
                           pe=pe, transformer_options=transformer_options)
    x = torch.addcmul(x, attn1_out, gate_msa).to(x.dtype)

    cross = self.attn2(x, context=context, mask=attention_mask, transformer_options=transformer_options)
    x = (x + cross).to(x.dtype)

    ff_out = self.ff(_modulate(comfy.ldm.common_dit.rms_norm(x), scale_mlp, shift_mlp))
    return torch.addcmul(x, ff_out, gate_mlp).to(x.dtype)


# qualname under MODULE -> (replacement, the upstream qualnames whose source it copies).
REPLACEMENTS = {
    "BasicTransformerBlock.forward": (basic_transformer_block_forward, ("BasicTransformerBlock.forward",)),
}
