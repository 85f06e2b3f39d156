"""Krea 2 (comfy.ldm.krea2.model.SingleStreamDiT, ComfyUI 0.33+) as pipeline stage layers.

Mirrors SingleStreamDiT._forward of ComfyUI 0.33.0: the latent (the Wan VAE's one-frame video latent, its
frame folded into the batch as upstream folds frames) cut into patches, reference latents appended after the target's
tokens when a reference method is set (each at its own index; "index_timestep_zero" modulates them as at
timestep 0 with a second timestep vector), the text fused from its Qwen3-VL layers by the model's own text
fusion transformer (part of the embedding, like its projections), then one sequence of text and image
tokens through the blocks, and the last layer on the target's tokens. Tensors passed between stages: the
sequence, the modulation vector tvec, the rope table, the timestep embedding t (the last layer reads it),
an integer tensor of the sizes the head needs (text tokens, target tokens, the first timestep-zero token or
-1), plus xt and sigma for calculate_denoised.
"""
from __future__ import annotations

import torch
from torch import nn

from . import references
from .common import (BlockLayer, EmbedLayer, HeadLayer, apply_model_start, block_list_layers, host_class, keep_in_graph,
                     refuse_unhandled, require_text)

_HANDLED = {"c_crossattn", "ref_latents", "ref_latents_method"}
# Reference methods as codes for the first stage (references.method_code): -1 the model's default (Krea 2
# files set none: references then do nothing, as in upstream); any other name counts as "index".
_METHODS = ("index", "index_timestep_zero")


def _method(dm, code: int) -> str | None:
    return dm.default_ref_method if code == -1 else _METHODS[code]


def _frames_in_batch(x):
    """A 5-D latent [B, C, T, H, W] as [B*T, C, H, W] (upstream's fold), a 4-D one as it is."""
    if x.ndim != 5:
        return x
    b, c, t, h, w = x.shape
    return x.reshape(b * t, c, h, w)


class _Embed(EmbedLayer):
    def __init__(self, base):
        dm = base.diffusion_model
        super().__init__(base, [dm.first, dm.tmlp, dm.tproj, dm.txtfusion, dm.txtmlp])

    def forward(self, inputs):
        from comfy.ldm.flux.layers import timestep_embedding
        from comfy.model_base import convert_tensor
        import comfy.utils

        from ..train.objective import transformer_options

        xt, sigma, context, method, *refs = inputs
        base, dm = self._refs
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        t = base.process_timestep(t, x=xt)
        refs = [convert_tensor(r, dtype, xc.device) for r in refs]
        # SingleStreamDiT._forward up to the blocks
        x = _frames_in_batch(xc)
        batch = x.shape[0]
        context = dm._unpack_context(context)
        img, positions, _, _ = dm.process_img(x)
        image_tokens = img.shape[1]
        zero_from = -1
        method = _method(dm, references.code_of(method))
        if method is not None and refs:
            tokens, places = [img], [positions]
            for index, ref in enumerate(refs, 1):
                ref = comfy.utils.repeat_to_batch_size(_frames_in_batch(ref), batch)
                ref_tokens, ref_positions, _, _ = dm.process_img(ref, index=index)
                tokens.append(ref_tokens)
                places.append(ref_positions)
            img, positions = torch.cat(tokens, dim=1), torch.cat(places, dim=1)
            if method == "index_timestep_zero":
                zero_from = image_tokens
        img = dm.first(img)
        t_emb = dm.tmlp(timestep_embedding(t, dm.tdim).unsqueeze(1).to(img.dtype))
        tvec = dm.tproj(t_emb)
        if zero_from >= 0:
            t0 = dm.tmlp(timestep_embedding(torch.zeros_like(t), dm.tdim).unsqueeze(1).to(img.dtype))
            tvec = torch.cat((tvec, dm.tproj(t0)), dim=0)
        text = dm.txtmlp(dm.txtfusion(context, mask=None, transformer_options=transformer_options(sigma)))
        text_tokens = text.shape[1]
        text_positions = torch.zeros(batch, text_tokens, 3, device=text.device, dtype=torch.float32)
        x = torch.cat((text, img), dim=1)
        if zero_from >= 0:
            zero_from += text_tokens
        freqs = dm.pe_embedder(torch.cat((text_positions, positions), dim=1))
        sizes = torch.tensor([text_tokens, image_tokens, zero_from], dtype=torch.long, device=x.device)
        return x, tvec, freqs, t_emb, sizes, xt, sigma


class _Block(BlockLayer):
    def forward(self, inputs):
        x, tvec, freqs, t_emb, sizes, xt, sigma = inputs
        text_tokens, _, zero_from = sizes.tolist()
        options = {**self.options(sigma, "single"), "img_slice": [text_tokens, x.shape[1]]}
        x = self.block(x, tvec, freqs, None, timestep_zero_index=None if zero_from < 0 else zero_from,
                       transformer_options=options)
        return x, tvec, freqs, t_emb, sizes, xt, sigma


class _Head(HeadLayer):
    owned = ("last",)

    def forward(self, inputs):
        from einops import rearrange

        x, tvec, freqs, t_emb, sizes, xt, sigma = inputs
        dm = self._dm[0]
        text_tokens, image_tokens, _ = sizes.tolist()
        frame = _frames_in_batch(xt)
        p = dm.patch
        rows, columns = -(-frame.shape[-2] // p), -(-frame.shape[-1] // p)
        out = self.last(x, t_emb)[:, text_tokens:text_tokens + image_tokens, :]
        out = rearrange(out, "b (h w) (c ph pw) -> b c (h ph) (w pw)", h=rows, w=columns, ph=p, pw=p, c=dm.channels)
        out = out[:, :, :frame.shape[-2], :frame.shape[-1]]
        if xt.ndim == 5:
            b, _, frames, height, width = xt.shape
            out = out.reshape(b, frames, dm.channels, height, width).movedim(1, 2)
        # tvec and the rope table: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), tvec, freqs)


class Krea2Adapter:
    name = "krea2"
    partition = "uniform"  # identical blocks: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:  # ComfyUI 0.33+
        return type(base_model.diffusion_model) is host_class("comfy.ldm.krea2.model", "SingleStreamDiT")

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "Krea 2", "text-to-image and edit reference latents only",
                         {"c_concat": "concat channels", "attention_mask": "an attention mask"})
        require_text(kw, "Krea 2")
        code = references.method_code(kw.get("ref_latents_method"), _METHODS, prepared.xt.device)
        return (prepared.xt, prepared.sigma, kw["c_crossattn"], code, *(kw.get("ref_latents") or ()))

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        return block_list_layers(base_model, _Embed, _Block, _Head, base_model.diffusion_model.blocks)
