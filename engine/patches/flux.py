"""Out-of-place forwards for the Flux-style blocks of comfy/ldm/flux/layers.py.

Used by Flux, Flux Kontext, Chroma, Flux 2, HunyuanVideo, HunyuanVideo 1.5 and HunyuanImage 2.1.
Upstream updates the residual stream in place (`img += ...`, `x += ...`, and slice `*=` / `+=` in
`apply_mod` when `modulation_dims` is set). Autograd saved those tensors (LayerNorm and LoRA
inputs), so LoRA backward fails, and a checkpointed block recomputes from an already-updated
input. These functions do the same arithmetic into new tensors, rounding to the residual's dtype
exactly where the in-place op would have stored into it, so outputs are bit-identical.

Two fixes, one per upstream shape of these functions:
- 0.3.75 up to 0.33: `apply_mod` picks a modulation row with `m[:, row]`; the double block has
  `flipped_img_txt` (image tokens first).
- 0.33 and later: rows are kept as a range (`m[:, row:row + 1]`), `flipped_img_txt` is gone, both
  blocks run the `attn1_patch` / `attn1_output_patch` hooks of transformer_options, and the single
  block has the `yak_mlp` activation. Read against 0.38.1 too: there the norms go through
  `modulated_norm`, which in training mode is exactly `apply_mod(norm(x), 1 + scale, shift)`, and
  attention gets the block's `comfy_attention` choice, which these forwards pass on where it exists.
engine/patches/trainable.py admits one only after the probe saw it reproduce upstream's output.
Importing this module needs ComfyUI on sys.path.
"""
from __future__ import annotations

import comfy.ldm.flux.layers as flux_layers
import torch

from .fixes import Fix

MODULE = "comfy.ldm.flux.layers"
BLOCKS = ("DoubleStreamBlock", "SingleStreamBlock")


def into(residual, update):
    """What `residual += update` stores, as a new tensor: computed in the promoted dtype and
    rounded once to the residual's dtype (a no-op cast when the dtypes already agree)."""
    return (residual + update).to(residual.dtype)


def _make_apply_mod(keep_row_dim: bool):
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
            pick = slice(row, row + 1) if keep_row_dim else row
            part = (tensor[:, lo:hi] * m_mult[:, pick]).to(tensor.dtype)
            if m_add is not None:
                part = (part + m_add[:, pick]).to(tensor.dtype)
            tensor = torch.cat((tensor[:, :lo], part, tensor[:, hi:]), dim=1)
        return tensor
    return apply_mod


apply_mod_row = _make_apply_mod(keep_row_dim=False)    # 0.3.75
apply_mod_range = _make_apply_mod(keep_row_dim=True)   # 0.33.0


def _attn1_patches(transformer_options, q, k, v, pe, attn_mask, extra_options):
    for patch in transformer_options.get("patches", {}).get("attn1_patch", ()):
        out = patch(q, k, v, pe=pe, attn_mask=attn_mask, extra_options=extra_options)
        q, k, v = out.get("q", q), out.get("k", k), out.get("v", v)
        pe, attn_mask = out.get("pe", pe), out.get("attn_mask", attn_mask)
    return q, k, v, pe, attn_mask


def _attn1_output_patches(transformer_options, attn, extra_options):
    for patch in transformer_options.get("patches", {}).get("attn1_output_patch", ()):
        attn = patch(attn, extra_options)
    return attn


def _attention_choice(block) -> dict:
    # Newer blocks carry the attention implementation their checkpoint asks for and hand it to
    # attention() (0.36 and later); older ones have no such attribute.
    choice = getattr(block, "comfy_attention", None)
    return {} if choice is None else {"preferred_attention": choice}


def _make_double(apply_mod, hooks: bool):
    def stream_qkv(num_heads, norm, attn, x, mod, dims):
        """One stream's attention inputs: norm, modulate, qkv projection, split heads, QK-norm."""
        qkv = attn.qkv(apply_mod(norm(x), (1 + mod.scale), mod.shift, dims))
        q, k, v = qkv.view(qkv.shape[0], qkv.shape[1], 3, num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = attn.norm(q, k, v)
        return q, k, v

    def stream_update(x, attn_out, attn, norm2, mlp, mod1, mod2, dims):
        """One stream's gated attention-projection and MLP residual updates."""
        x = into(x, apply_mod(attn.proj(attn_out), mod1.gate, None, dims))
        hidden = mlp(apply_mod(norm2(x), (1 + mod2.scale), mod2.shift, dims))
        return into(x, apply_mod(hidden, mod2.gate, None, dims))

    def forward(self, img, txt, vec, pe, attn_mask=None, modulation_dims_img=None, modulation_dims_txt=None,
                transformer_options={}):
        if self.modulation:
            img_mod1, img_mod2 = self.img_mod(vec)
            txt_mod1, txt_mod2 = self.txt_mod(vec)
        else:  # Chroma / Flux 2: the model hands in precomputed ModulationOut pairs
            (img_mod1, img_mod2), (txt_mod1, txt_mod2) = vec
        img_q, img_k, img_v = stream_qkv(self.num_heads, self.img_norm1, self.img_attn, img, img_mod1,
                                         modulation_dims_img)
        txt_q, txt_k, txt_v = stream_qkv(self.num_heads, self.txt_norm1, self.txt_attn, txt, txt_mod1,
                                         modulation_dims_txt)
        # Joint attention over one sequence; 0.3.x HunyuanVideo puts the image tokens first ("flipped").
        flipped = getattr(self, "flipped_img_txt", False)
        if flipped:
            first, qs, ks, vs = img.shape[1], (img_q, txt_q), (img_k, txt_k), (img_v, txt_v)
        else:
            first, qs, ks, vs = txt.shape[1], (txt_q, img_q), (txt_k, img_k), (txt_v, img_v)
        q, k, v = torch.cat(qs, dim=2), torch.cat(ks, dim=2), torch.cat(vs, dim=2)
        if hooks:
            extra = {**transformer_options, "img_slice": [txt.shape[1], q.shape[2]]}
            q, k, v, pe, attn_mask = _attn1_patches(transformer_options, q, k, v, pe, attn_mask, extra)
        attn = flux_layers.attention(q, k, v, pe=pe, mask=attn_mask, transformer_options=transformer_options,
                                     **_attention_choice(self))
        if hooks:
            attn = _attn1_output_patches(transformer_options, attn, extra)
        if flipped:
            img_attn, txt_attn = attn[:, :first], attn[:, first:]
        else:
            txt_attn, img_attn = attn[:, :first], attn[:, first:]
        img = stream_update(img, img_attn, self.img_attn, self.img_norm2, self.img_mlp, img_mod1, img_mod2,
                            modulation_dims_img)
        txt = stream_update(txt, txt_attn, self.txt_attn, self.txt_norm2, self.txt_mlp, txt_mod1, txt_mod2,
                            modulation_dims_txt)
        if txt.dtype == torch.float16:
            txt = torch.nan_to_num(txt, nan=0.0, posinf=65504, neginf=-65504)
        return img, txt
    return forward


def _make_single(apply_mod, hooks: bool):
    def forward(self, x, vec, pe, attn_mask=None, modulation_dims=None, transformer_options={}):
        mod = self.modulation(vec)[0] if self.modulation else vec
        fused = self.linear1(apply_mod(self.pre_norm(x), (1 + mod.scale), mod.shift, modulation_dims))
        qkv, mlp = torch.split(fused, [3 * self.hidden_size, self.mlp_hidden_dim_first], dim=-1)
        q, k, v = qkv.view(qkv.shape[0], qkv.shape[1], 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.norm(q, k, v)
        if hooks:
            extra = dict(transformer_options)
            q, k, v, pe, attn_mask = _attn1_patches(transformer_options, q, k, v, pe, attn_mask, extra)
        attn = flux_layers.attention(q, k, v, pe=pe, mask=attn_mask, transformer_options=transformer_options,
                                     **_attention_choice(self))
        if hooks:
            attn = _attn1_output_patches(transformer_options, attn, extra)
        if getattr(self, "yak_mlp", False):  # SiLU of the second half gates the first
            half = self.mlp_hidden_dim_first // 2
            mlp = self.mlp_act(mlp[..., half:]) * mlp[..., :half]
        else:
            mlp = self.mlp_act(mlp)
        x = into(x, apply_mod(self.linear2(torch.cat((attn, mlp), 2)), mod.gate, None, modulation_dims))
        if x.dtype == torch.float16:
            x = torch.nan_to_num(x, nan=0.0, posinf=65504, neginf=-65504)
        return x
    return forward


def _fix(name, apply_mod, hooks, since, before):
    # Replacing the module-level apply_mod also makes LastLayer (HunyuanVideo's head with
    # modulation_dims) out of place.
    return Fix(name, MODULE, BLOCKS, {
        "apply_mod": apply_mod,
        "DoubleStreamBlock.forward": _make_double(apply_mod, hooks),
        "SingleStreamBlock.forward": _make_single(apply_mod, hooks),
    }, since=since, before=before)


FIXES = (
    _fix("flux-layers 0.3.75", apply_mod_row, hooks=False, since="0.3.75", before="0.33.0"),
    _fix("flux-layers 0.33", apply_mod_range, hooks=True, since="0.33.0", before=None),
)
