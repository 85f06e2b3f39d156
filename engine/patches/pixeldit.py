"""Out-of-place modulation for PixelDiT's blocks (comfy/ldm/pixeldit/, ComfyUI 0.33+).

Upstream modulates a block's normed input with the module-level `apply_adaln_(x, shift, scale)`,
which rewrites `x` in place as `x + x * scale + shift`. Its first in-place step multiplies by `x`
itself, a tensor autograd saved for that very product, so LoRA backward fails ("modified by an
inplace operation"). Two block classes call it:
- `MMDiTBlockT2I` (model.py, the patch-level joint blocks) imports the helper by name into model.py,
  and otherwise builds every residual out of place: swapping model.py's `apply_adaln_` suffices.
- `PiTBlock` (modules.py, the pixel-level blocks) also adds its MLP residual into the stream in place,
  one chunk of rows at a time (`mlp_chunks`, to bound the MLP's peak memory at inference), after
  `norm2` saved that stream: its forward is replaced as a whole.
PiD (pid.py) builds on the same two classes, so it is covered too.

The replacements compute the same ops in the same order, each rounded to the stream's dtype where
upstream's in-place op stored it: the output is upstream's, bit for bit. Training keeps every MLP
chunk's activations for backward anyway, so the chunks are kept (the same rows, the same results)
and concatenated.
Importing this module imports no ComfyUI code (0.3.75 has no PixelDiT).
"""
from __future__ import annotations

import torch

from .fixes import Fix

MODEL = "comfy.ldm.pixeldit.model"
MODULES = "comfy.ldm.pixeldit.modules"


def adaln(x, shift, scale):
    """Upstream: x.addcmul_(x, scale).add_(shift); each in-place step stores in x's dtype."""
    scaled = torch.addcmul(x, x, scale).to(x.dtype)
    return (scaled + shift).to(x.dtype)


def _gated(residual, gate, update):
    # what upstream's residual.addcmul_(gate, update) stores: rounded to the residual's dtype
    return torch.addcmul(residual, gate, update).to(residual.dtype)


def pit_forward(self, x, s_cond, image_height, image_width, patch_size, mask=None, transformer_options={}):
    """PiTBlock.forward out of place: x is [B*L, P^2, pixel_dim] (pixel tokens per patch), s_cond the
    patch-level condition [B*L, context_dim]."""
    rows, pixels, _ = x.shape
    grid_h, grid_w = image_height // patch_size, image_width // patch_size
    patches = grid_h * grid_w
    batch = rows // patches

    shift, scale, gate = self.adaLN_modulation_msa(s_cond).view(rows, pixels, 3 * self.pixel_dim).chunk(3, dim=-1)
    normed = adaln(self.norm1(x), shift, scale)
    tokens = self.compress_to_attn(normed.view(rows, pixels * self.pixel_dim)).view(batch, patches, self.attn_dim)
    pos = self._fetch_pos(grid_h, grid_w, x.device, x.dtype, **(transformer_options.get("rope_options") or {}))
    attended = self.attn(tokens, pos, mask=mask, transformer_options=transformer_options)
    expanded = self.expand_from_attn(attended.view(batch * patches, self.attn_dim)).view(rows, pixels, self.pixel_dim)
    x = torch.addcmul(x, gate, expanded)  # out of place upstream too (its dtype promotes, as there)

    shift, scale, gate = self.adaLN_modulation_mlp(s_cond).view(rows, pixels, 3 * self.pixel_dim).chunk(3, dim=-1)
    mlp_in = adaln(self.norm2(x), shift, scale)
    step = (rows + self.mlp_chunks - 1) // self.mlp_chunks
    pieces = [_gated(x[lo:lo + step], gate[lo:lo + step], self.mlp(mlp_in[lo:lo + step]))
              for lo in range(0, rows, step)]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


FIXES = (
    Fix("pixeldit-adaln 0.33", MODEL, ("MMDiTBlockT2I",), {"apply_adaln_": adaln}, since="0.33.0", before=None),
    Fix("pixeldit-pit 0.33", MODULES, ("PiTBlock",), {"PiTBlock.forward": pit_forward}, since="0.33.0", before=None),
)
