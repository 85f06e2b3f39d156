"""Out-of-place modulation for MiniMax H3's DiTBlock (comfy/ldm/minimax/model.py, ComfyUI 0.33+).

Upstream's block hands its residual stream to two module-level helpers that update it in place,
one packed-sequence segment (text, audio, video rows; token-tag runs inside the text) at a time:
- `_mod_scale_shift(h, shift, scale, segments)`: `h[a:b].mul_(1 + scale_row).add_(shift_row)` on
  the block's normed input;
- `_mod_gate(x, gate, other, segments)`: `x[a:b].addcmul_(other[a:b], gate_row)` on the block's
  input itself, the residual.
The second writes into the block's input (autograd saved it for the norm and the LoRA on the first
layers, so LoRA backward fails; under checkpointing the recompute would start from the updated
stream). These replacements compute each segment's rows into a new tensor with the same ops in
the same dtype (a segment's modulation row is cast to the stream's dtype first, as upstream does),
and keep the rows outside every segment as they are: the output is upstream's, bit for bit.

Both helpers are only called by DiTBlock.forward, which uses their return values, so swapping them
makes the block out-of-place whatever else its forward does (ComfyUI 0.38's adds an `attention`
argument for attention patches). The fused `rms_rope_split_half` its attention calls in training
mode needs the comfy-kitchen backward (kitchen.py); the probe admits the two together.
Importing this module imports no ComfyUI code (0.3.75 has no MiniMax H3).
"""
from __future__ import annotations

from itertools import pairwise

import torch

from .fixes import Fix

MODULE = "comfy.ldm.minimax.model"


def _row(vecs, row, dtype):
    # a mod-row index, or a per-token LongTensor of mod-row indices (upstream's _mod_row)
    return vecs[row].to(dtype)


def _bounds(segments, n):
    return [(*slice(a, b).indices(n)[:2], row) for a, b, row in segments]


def _splice(t, segments, update):
    """`t` with rows lo:hi of each (lo, hi, row) segment replaced by update(t[lo:hi], lo, hi, row),
    applied in order as upstream's in-place loop would; a new tensor, `t` untouched."""
    spans = _bounds(segments, t.shape[0])
    ordered = all(lo <= hi for lo, hi, _ in spans) and all(prev[1] <= nxt[0] for prev, nxt in pairwise(spans))
    if not ordered:  # overlapping or unsorted: one segment at a time, each on the result of the last
        for lo, hi, row in spans:
            hi = max(lo, hi)
            t = torch.cat((t[:lo], update(t[lo:hi], lo, hi, row), t[hi:]))
        return t
    pieces, at = [], 0
    for lo, hi, row in spans:
        pieces.append(t[at:lo])
        pieces.append(update(t[lo:hi], lo, hi, row))
        at = hi
    pieces.append(t[at:])
    return torch.cat(pieces)


def mod_scale_shift(h, shift, scale, segments):
    """Upstream: h[a:b].mul_(1.0 + scale_row).add_(shift_row) per segment; each step rounds to h's dtype."""
    def update(rows, lo, hi, row):
        scaled = (rows * (1.0 + _row(scale, row, h.dtype))).to(h.dtype)
        return (scaled + _row(shift, row, h.dtype)).to(h.dtype)
    return _splice(h, segments, update)


def mod_gate(x, gate, other, segments):
    """Upstream: x[a:b].addcmul_(other[a:b], gate_row) per segment; rows outside the segments keep x."""
    def update(rows, lo, hi, row):
        return torch.addcmul(rows, other[lo:hi], _row(gate, row, x.dtype)).to(x.dtype)
    return _splice(x, segments, update)


FIXES = (
    Fix("minimax-mod 0.33", MODULE, ("DiTBlock",), {"_mod_scale_shift": mod_scale_shift, "_mod_gate": mod_gate},
        since="0.33.0", before=None),
)
