"""Out-of-place twins of the Flux-style block forwards in comfy/ldm/flux/layers.py.

Upstream updates the residual stream in place (`img += ...`, `x += ...`, and slice `*=`/`+=` in
`apply_mod` when `modulation_dims` is set). Autograd saved those tensors (LayerNorm and LoRA
inputs), so LoRA backward fails, and a checkpointed block recomputes from an already-updated
input. These functions do the same arithmetic into new tensors. Same signatures, same return
values, same rounding (a result is cast back to the residual's dtype exactly where the in-place
op would have written into it), so outputs are bit-identical.

Only engine/patches.py swaps these in, and only after checking that upstream's source still hashes
to UPSTREAM_SHA256 (see there). Importing this module needs ComfyUI on sys.path.
"""
from __future__ import annotations

import torch

import comfy.ldm.flux.layers as flux_layers

MODULE = "comfy.ldm.flux.layers"
FAMILIES = "Flux, Flux Kontext, Chroma, Flux2, HunyuanVideo, HunyuanVideo-1.5, HunyuanImage-2.1"
BLOCK_CLASSES = ("DoubleStreamBlock", "SingleStreamBlock")

# sha256 of the whitespace-normalised upstream source (engine/patches.py: source_digest),
# ComfyUI 0.3.75. Update a digest only together with the rewrite below it was checked against.
UPSTREAM_SHA256 = {
    "apply_mod": "379b3b94ca1cc77faed4b93c30914cc9a6f11bca4740ad18e02ca68fd4d6947a",
    "DoubleStreamBlock.forward": "ccc37d635727399ef1f71e623ee551a16b836163aedcba9b9eaec4326213beda",
    "SingleStreamBlock.forward": "9f98d5b8b16098735807d256bcde344857560ef673694e2a9ada8887fa7edcaf",
}


def _into(residual, update):
    # What `residual += update` stores, as a new tensor: computed in the promoted dtype and
    # rounded once to the residual's dtype (a no-op cast when the dtypes already agree).
    return (residual + update).to(residual.dtype)


def apply_mod(tensor, m_mult, m_add=None, modulation_dims=None):
    if modulation_dims is None:
        if m_add is not None:
            return torch.addcmul(m_add, tensor, m_mult)
        return tensor * m_mult
    # Per-token-range modulation (HunyuanVideo's guiding frame): upstream scales and shifts slices
    # of `tensor` in place; rebuild the tensor around each modified range instead. The two steps
    # stay separate (not one addcmul) because upstream rounds after each of them.
    for start, end, row in modulation_dims:
        lo, hi, _ = slice(start, end).indices(tensor.shape[1])
        hi = max(lo, hi)
        part = (tensor[:, lo:hi] * m_mult[:, row]).to(tensor.dtype)
        if m_add is not None:
            part = (part + m_add[:, row]).to(tensor.dtype)
        tensor = torch.cat((tensor[:, :lo], part, tensor[:, hi:]), dim=1)
    return tensor


def _stream_qkv(num_heads, norm, attn, x, mod, dims):
    """One stream's attention inputs: norm, modulate, qkv projection, split heads, QK-norm."""
    qkv = attn.qkv(apply_mod(norm(x), (1 + mod.scale), mod.shift, dims))
    q, k, v = qkv.view(qkv.shape[0], qkv.shape[1], 3, num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k = attn.norm(q, k, v)
    return q, k, v


def _stream_update(x, attn_out, attn, norm2, mlp, mod1, mod2, dims):
    """One stream's gated attention-projection and MLP residual updates."""
    x = _into(x, apply_mod(attn.proj(attn_out), mod1.gate, None, dims))
    hidden = mlp(apply_mod(norm2(x), (1 + mod2.scale), mod2.shift, dims))
    return _into(x, apply_mod(hidden, mod2.gate, None, dims))


def double_stream_forward(self, img, txt, vec, pe, attn_mask=None, modulation_dims_img=None,
                          modulation_dims_txt=None, transformer_options={}):
    if self.modulation:
        img_mod1, img_mod2 = self.img_mod(vec)
        txt_mod1, txt_mod2 = self.txt_mod(vec)
    else:  # Chroma / Flux2: the model hands in precomputed ModulationOut pairs
        (img_mod1, img_mod2), (txt_mod1, txt_mod2) = vec

    img_q, img_k, img_v = _stream_qkv(self.num_heads, self.img_norm1, self.img_attn, img, img_mod1,
                                      modulation_dims_img)
    txt_q, txt_k, txt_v = _stream_qkv(self.num_heads, self.txt_norm1, self.txt_attn, txt, txt_mod1,
                                      modulation_dims_txt)

    # Joint attention over one sequence; HunyuanVideo puts the image tokens first ("flipped").
    if self.flipped_img_txt:
        first, qs, ks, vs = img.shape[1], (img_q, txt_q), (img_k, txt_k), (img_v, txt_v)
    else:
        first, qs, ks, vs = txt.shape[1], (txt_q, img_q), (txt_k, img_k), (txt_v, img_v)
    attn = flux_layers.attention(torch.cat(qs, dim=2), torch.cat(ks, dim=2), torch.cat(vs, dim=2),
                                 pe=pe, mask=attn_mask, transformer_options=transformer_options)
    if self.flipped_img_txt:
        img_attn, txt_attn = attn[:, :first], attn[:, first:]
    else:
        txt_attn, img_attn = attn[:, :first], attn[:, first:]

    img = _stream_update(img, img_attn, self.img_attn, self.img_norm2, self.img_mlp, img_mod1, img_mod2,
                         modulation_dims_img)
    txt = _stream_update(txt, txt_attn, self.txt_attn, self.txt_norm2, self.txt_mlp, txt_mod1, txt_mod2,
                         modulation_dims_txt)

    if txt.dtype == torch.float16:
        txt = torch.nan_to_num(txt, nan=0.0, posinf=65504, neginf=-65504)
    return img, txt


def single_stream_forward(self, x, vec, pe, attn_mask=None, modulation_dims=None, transformer_options={}):
    if self.modulation:
        mod, _ = self.modulation(vec)
    else:
        mod = vec

    fused = self.linear1(apply_mod(self.pre_norm(x), (1 + mod.scale), mod.shift, modulation_dims))
    qkv, mlp = torch.split(fused, [3 * self.hidden_size, self.mlp_hidden_dim_first], dim=-1)
    q, k, v = qkv.view(qkv.shape[0], qkv.shape[1], 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k = self.norm(q, k, v)
    attn = flux_layers.attention(q, k, v, pe=pe, mask=attn_mask, transformer_options=transformer_options)
    output = self.linear2(torch.cat((attn, self.mlp_act(mlp)), 2))

    x = _into(x, apply_mod(output, mod.gate, None, modulation_dims))
    if x.dtype == torch.float16:
        x = torch.nan_to_num(x, nan=0.0, posinf=65504, neginf=-65504)
    return x


# qualname under MODULE -> (replacement, the upstream qualnames whose source it copies). A block
# forward inlines apply_mod's semantics, so it is only valid while apply_mod is unchanged too.
# Replacing the module-level apply_mod also makes LastLayer (HunyuanVideo's head with
# modulation_dims) out-of-place.
REPLACEMENTS = {
    "apply_mod": (apply_mod, ("apply_mod",)),
    "DoubleStreamBlock.forward": (double_stream_forward, ("DoubleStreamBlock.forward", "apply_mod")),
    "SingleStreamBlock.forward": (single_stream_forward, ("SingleStreamBlock.forward", "apply_mod")),
}
