"""The stage layers of comfy.ldm.flux.model.Flux, the model class both Flux.1 (flux.py) and FLUX.2
(flux2.py) run, and the unpatchify Chroma (chroma.py) shares with them.

Mirrors BaseModel._apply_model + Flux._forward/forward_orig of ComfyUI 0.3.75, and what 0.33 added
where the host's model has it: a text norm before txt_in (`txt_norm`), text position ids on the axes
`params.txt_ids_dims` names (0.3.75: the 4th axis of 4-axis models), the single blocks' `img_slice`
option. Reference latents (ref_latents) follow their method (references.py). Each block gets what
forward_orig hands it: the caller's transformer_options (the engine's: sigmas) plus the block keys
(common.block_options).

Global modulation (FLUX.2: `params.global_modulation`): the blocks get no `vec`; three shared
modulation layers turn vec once into the shift/scale/gate rows every double block (img + txt) and
every single block reads. The embedding computes them (ComfyUI computes the single-block rows after
the double blocks, from the same vec: the same values) and they travel packed as tensors, `mods`:
dmods [B, 12, D] (img mod1, mod2, txt mod1, mod2; shift, scale, gate each) and smods [B, 3, D]. A
Flux.1 model has no mods. The final layer reads the unmodulated vec.

Tensors passed between stages:
  double-block stages: img (target tokens, then reference tokens), txt, *mods (dmods, smods), vec, pe, xt,
                       sigma, refs
  single-block stages: x (= cat(txt, img)), *mods (smods), vec, pe, xt, sigma, refs
The head needs xt and sigma for ComfyUI's calculate_denoised. `refs` is references.marker: its width
tells the head how many reference tokens follow the target's.
"""
from __future__ import annotations

import torch

from ..train.objective import transformer_options
from . import references
from .common import (
    BlockLayer,
    EmbedLayer,
    HeadLayer,
    apply_model_start,
    keep_in_graph,
    or_none,
    patch_grid,
    patch_tokens,
    refuse_unhandled,
    stage_input,
    two_stream_layers,
    with_img_slice,
)

# The kwargs of model.extra_conds these layers reproduce; anything else means a variant they do not.
_HANDLED = {"c_crossattn", "y", "guidance", "ref_latents", "ref_latents_method"}
_REF_METHODS = ("offset", "index", "uxo")  # references.method_code's names


def _txt_ids_dims(dm) -> list[int]:
    """The rope axes that carry the text token position: the host's own setting (0.33 and later), or
    0.3.75's rule (the 4th axis of Flux 2's four)."""
    dims = getattr(dm.params, "txt_ids_dims", None)
    if dims is not None:
        return list(dims)
    return [3] if len(dm.params.axes_dim) == 4 else []


def _join(img, txt):
    """The step between the double and the single blocks in forward_orig."""
    if img.dtype == torch.float16:
        img = torch.nan_to_num(img, nan=0.0, posinf=65504, neginf=-65504)
    return torch.cat((txt, img), 1)


def _pack(*mods) -> torch.Tensor:
    """ModulationOuts -> one [B, 3 * len(mods), D] tensor (the same values, rows shift, scale, gate)."""
    return torch.cat([t for m in mods for t in (m.shift, m.scale, m.gate)], dim=1)


def _unpack(packed: torch.Tensor, i: int):
    from comfy.ldm.flux.layers import ModulationOut

    return ModulationOut(*(packed[:, 3 * i + k:3 * i + k + 1] for k in range(3)))


def _modulation(dm) -> list:
    """The shared modulation layers of a global-modulation model (none for Flux.1)."""
    if not dm.params.global_modulation:
        return []
    return [dm.double_stream_modulation_img, dm.double_stream_modulation_txt, dm.single_stream_modulation]


def unpatchify(tokens, xt, patch: int):
    """forward_orig's last step in the Flux-code models: the target's tokens [B, rows * columns,
    C * patch * patch] back to a latent, cropped to xt's height and width."""
    from einops import rearrange

    h, w = xt.shape[-2:]
    rows, columns = patch_grid(h, w, patch)
    out = rearrange(tokens, "b (h w) (c ph pw) -> b c (h ph) (w pw)", h=rows, w=columns, ph=patch, pw=patch)
    return out[:, :, :h, :w]


class _Embed(EmbedLayer):
    def __init__(self, base, join: bool):
        dm = base.diffusion_model
        embedders = [dm.img_in, dm.time_in, dm.txt_in, *_modulation(dm)]
        if getattr(dm, "txt_norm", None) is not None:
            embedders.append(dm.txt_norm)
        if dm.params.guidance_embed:
            embedders.append(dm.guidance_in)
        if dm.vector_in is not None:
            embedders.append(dm.vector_in)
        super().__init__(base, embedders, join)  # join: only when the model has no double blocks

    def forward(self, inputs):
        """Flux._forward and forward_orig up to the blocks."""
        from comfy.ldm.flux.layers import timestep_embedding
        from comfy.model_base import convert_tensor

        xt, sigma, context, y, guidance, method, *refs = inputs
        base, dm = self._refs
        # An empty y / guidance stands for "absent" (first_stage_inputs keeps the tuple fixed).
        y, guidance = or_none(y), or_none(guidance)

        # BaseModel._apply_model
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        device = xc.device
        t = base.process_timestep(t, x=xt)
        y = None if y is None else convert_tensor(y, dtype, device)
        guidance = None if guidance is None else convert_tensor(guidance, dtype, device)

        # Flux._forward
        opts = transformer_options(sigma)  # the engine's: no rope_options
        img, img_ids = dm.process_img(xc, transformer_options=opts)
        img, img_ids, ref_tokens = _add_references(dm, img, img_ids, xc, [convert_tensor(r, dtype, device) for r in refs],
                                                   _ref_method(dm, references.code_of(method)), opts)
        txt_ids = torch.zeros((xc.shape[0], context.shape[1], len(dm.params.axes_dim)), device=device,
                              dtype=torch.float32)
        for axis in _txt_ids_dims(dm):  # the text position on these rope axes
            txt_ids[:, :, axis] = torch.linspace(0, context.shape[1] - 1, steps=context.shape[1], device=device,
                                                 dtype=torch.float32)

        # Flux.forward_orig, up to the blocks
        img = dm.img_in(img)
        vec = dm.time_in(timestep_embedding(t, 256).to(img.dtype))
        if dm.params.guidance_embed and guidance is not None:
            vec = vec + dm.guidance_in(timestep_embedding(guidance, 256).to(img.dtype))
        if dm.vector_in is not None:
            if y is None:
                y = torch.zeros((img.shape[0], dm.params.vec_in_dim), device=img.device, dtype=img.dtype)
            vec = vec + dm.vector_in(y[:, :dm.params.vec_in_dim])
        if getattr(dm, "txt_norm", None) is not None:
            context = dm.txt_norm(context)
        txt = dm.txt_in(context)
        pe = dm.pe_embedder(torch.cat((txt_ids, img_ids), dim=1))
        marker = references.marker(xt, ref_tokens)
        mods = ()
        if dm.params.global_modulation:  # forward_orig's modulation of the blocks (see the module docstring)
            mods = (_pack(*dm.double_stream_modulation_img(vec), *dm.double_stream_modulation_txt(vec)),
                    _pack(dm.single_stream_modulation(vec)[0]))
        if self.join:  # the single blocks read only the single-block rows
            return (_join(img, txt), *mods[1:], vec, pe, xt, sigma, marker)
        return (img, txt, *mods, vec, pe, xt, sigma, marker)


def _ref_method(dm, code: int) -> str:
    return getattr(dm.params, "default_ref_method", "offset") if code < 0 else _REF_METHODS[code]


def _add_references(dm, img, img_ids, xc, refs, method, opts):
    """Flux._forward's reference-latent loop: the reference tokens appended after the target's."""
    p = dm.patch_size
    h_len, w_len = patch_grid(*xc.shape[-2:], p)
    h = w = index = 0
    before = img.shape[1]
    for ref in refs:
        if method == "index":
            index += dm.params.ref_index_scale
            h_offset = w_offset = 0
        elif method == "uxo":
            index = 0
            h_offset, w_offset = h_len * p + h, w_len * p + w
            h += ref.shape[-2]
            w += ref.shape[-1]
        else:
            index = 1
            h_offset, w_offset, h, w = references.offset_place(ref, h, w)
        # 0.33+ hands the references the caller's options too (0.3.75 none); the engine's hold no rope_options
        kontext, kontext_ids = dm.process_img(ref, index=index, h_offset=h_offset, w_offset=w_offset,
                                              transformer_options=opts)
        img = torch.cat([img, kontext], dim=1)
        img_ids = torch.cat([img_ids, kontext_ids], dim=1)
    return img, img_ids, img.shape[1] - before


class _Double(BlockLayer):
    def forward(self, inputs):
        img, txt, *mods, vec, pe, xt, sigma, refs = inputs
        if mods:  # global modulation: the block reads its rows instead of vec
            dmods = mods[0]
            block_vec = ((_unpack(dmods, 0), _unpack(dmods, 1)), (_unpack(dmods, 2), _unpack(dmods, 3)))
        else:
            block_vec = vec
        img, txt = self.block(img=img, txt=txt, vec=block_vec, pe=pe, attn_mask=None,
                              transformer_options=self.options(sigma, "double"))
        if self.join:  # the last double block hands the single blocks one joint sequence
            return (_join(img, txt), *mods[1:], vec, pe, xt, sigma, refs)
        return (img, txt, *mods, vec, pe, xt, sigma, refs)


class _Single(BlockLayer):
    def forward(self, inputs):
        x, *mods, vec, pe, xt, sigma, refs = inputs
        # forward_orig's `img_slice`: the target and reference tokens after the text
        image = patch_tokens(*xt.shape[-2:], self._dm[0].patch_size) + refs.shape[1] - 1
        x = self.block(x, vec=_unpack(mods[0], 0) if mods else vec, pe=pe, attn_mask=None,
                       transformer_options=with_img_slice(self.options(sigma, "single"), x, image))
        return (x, *mods, vec, pe, xt, sigma, refs)


class _Head(HeadLayer):
    def forward(self, inputs):
        x, *mods, vec, pe, xt, sigma, refs = inputs
        p = self._dm[0].patch_size
        end = x.shape[1] - (refs.shape[1] - 1)  # text tokens, target tokens, reference tokens
        img = x[:, end - patch_tokens(*xt.shape[-2:], p):end]  # forward_orig drops the text, _forward the references
        out = unpatchify(self.final_layer(img, vec), xt, p)  # vec is vec_orig: the unmodulated vec
        # pe, refs and mods: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), pe, refs, *mods)


def stage_layers(base_model) -> list:
    """forward_orig's order: the embedding, the double blocks (the last joins the streams), the single
    blocks, the head."""
    dm = base_model.diffusion_model
    return two_stream_layers(base_model, _Embed, _Double, _Single, _Head, dm.double_blocks, dm.single_blocks)


def stage_inputs(prepared, family: str) -> tuple[torch.Tensor, ...]:
    """The first stage's inputs (Flux.1 and FLUX.2 take the same conditioning): xt, sigma, context, y,
    guidance, reference method code, reference latents."""
    kw = prepared.kwargs
    refuse_unhandled(kw, _HANDLED, family, "text-to-image and reference latents only",
                     {"c_concat": "concat channels (Flux Fill / inpaint)", "attention_mask": "an attention mask"})
    xt = prepared.xt
    method = kw.get("ref_latents_method")  # absent: the model's default; unknown names act as offset
    references.refuse_method(method, family)
    code = references.method_code(method, _REF_METHODS, xt.device)
    # An absent pooled vector or guidance (FluxDisableGuidance) travels as common.stage_input's stand-in.
    return (xt, prepared.sigma, kw["c_crossattn"], stage_input(kw.get("y"), xt), stage_input(kw.get("guidance"), xt),
            code, *(kw.get("ref_latents") or ()))

