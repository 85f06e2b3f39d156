"""Qwen-Image and Qwen-Image-Edit (comfy.ldm.qwen_image.model.QwenImageTransformer2DModel) as pipeline
stage layers.

Mirrors BaseModel._apply_model + QwenImageTransformer2DModel._forward of ComfyUI 0.3.75: text context
and, for the Edit models, reference latents (ref_latents: any number and sizes, each ref_latents_method;
their tokens follow the target's). ComfyUI's QwenImage extra_conds never passes an attention mask or a
guidance value; ControlNet and the block patches of other custom nodes are not reproduced.

Tensors passed between stages: img (target tokens, then reference tokens), txt, temb, pe (the block
inputs) plus xt and sigma, which the head needs for ComfyUI's calculate_denoised. The target's tokens
come first, so the head finds them from xt's shape alone. The last block hands on only img and temb:
its text output is unused, as in ComfyUI (so that block's text-stream LoRA gets no gradient there either).
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import ConfigError
from .common import EmbedLayer, HeadLayer, apply_model_start, block_options, refuse_unhandled

_HANDLED = {"c_crossattn", "ref_latents", "ref_latents_method"}


class _Embed(EmbedLayer):
    def __init__(self, base):
        dm = base.diffusion_model
        super().__init__(base, [dm.img_in, dm.txt_norm, dm.txt_in, dm.time_text_embed])

    def forward(self, inputs):
        from comfy.model_base import convert_tensor

        xt, sigma, context, index_method, *refs = inputs
        base, dm = self._refs

        # BaseModel._apply_model
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        device = xc.device
        t = base.process_timestep(t, x=xt)
        refs = [convert_tensor(r, dtype, device) for r in refs]

        # QwenImageTransformer2DModel._forward, up to the blocks
        img, img_ids, _ = dm.process_img(xc)
        img, img_ids = _add_references(dm, img, img_ids, refs, bool(index_method.reshape(-1)[0]))
        p = dm.patch_size
        txt_start = round(max(((xc.shape[-1] + (p // 2)) // p) // 2, ((xc.shape[-2] + (p // 2)) // p) // 2))
        txt_ids = torch.arange(txt_start, txt_start + context.shape[1], device=device).reshape(1, -1, 1)
        txt_ids = txt_ids.repeat(xc.shape[0], 1, 3)
        pe = dm.pe_embedder(torch.cat((txt_ids, img_ids), dim=1)).to(xc.dtype).contiguous()
        img = dm.img_in(img)
        txt = dm.txt_in(dm.txt_norm(context))
        temb = dm.time_text_embed(t, img)
        return img, txt, temb, pe, xt, sigma


def _add_references(dm, img, img_ids, refs, index_method: bool):
    """_forward's reference-latent loop: the reference tokens appended after the target's."""
    h = w = index = 0
    for ref in refs:
        if index_method:
            index += 1
            h_offset = w_offset = 0
        else:
            index, h_offset, w_offset = 1, 0, 0
            if ref.shape[-2] + h > ref.shape[-1] + w:
                w_offset = w
            else:
                h_offset = h
            h = max(h, ref.shape[-2] + h_offset)
            w = max(w, ref.shape[-1] + w_offset)
        tokens, ids, _ = dm.process_img(ref, index=index, h_offset=h_offset, w_offset=w_offset)
        img = torch.cat([img, tokens], dim=1)
        img_ids = torch.cat([img_ids, ids], dim=1)
    return img, img_ids


class _Block(nn.Module):
    def __init__(self, block, index: int, total: int):
        super().__init__()
        self.block = block
        self.index, self.total = index, total
        self.last = index == total - 1

    def forward(self, inputs):
        img, txt, temb, pe, xt, sigma = inputs
        # _forward writes block_type "double" etc. into transformer_options before each block
        txt, img = self.block(hidden_states=img, encoder_hidden_states=txt, encoder_hidden_states_mask=None,
                              temb=temb, image_rotary_emb=pe,
                              transformer_options=block_options(sigma, "double", self.index, self.total))
        if self.last:  # the head reads neither the text stream nor pe
            return img, temb, xt, sigma
        return img, txt, temb, pe, xt, sigma


class _Head(HeadLayer):
    owned = ("norm_out", "proj_out")

    def forward(self, inputs):
        img, temb, xt, sigma = inputs
        p = self._dm[0].patch_size
        # process_img's padded input shape [B, C, T, H, W] (H and W up to a multiple of the patch), from xt
        shape = (*xt.shape[:3], -(-xt.shape[-2] // p) * p, -(-xt.shape[-1] // p) * p)
        target = (shape[-2] // 2) * (shape[-1] // 2)
        out = self.proj_out(self.norm_out(img, temb))
        out = out[:, :target].view(shape[0], shape[-2] // 2, shape[-1] // 2, shape[1], 2, 2)
        out = out.permute(0, 3, 1, 4, 2, 5).reshape(shape)[:, :, :, :xt.shape[-2], :xt.shape[-1]]
        return self.model_sampling.calculate_denoised(sigma, out.float(), xt)


class QwenImageAdapter:
    name = "qwen_image"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.qwen_image.model
        import comfy.model_base

        return (type(base_model) is comfy.model_base.QwenImage
                and type(base_model.diffusion_model) is comfy.ldm.qwen_image.model.QwenImageTransformer2DModel)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "Qwen-Image", "text-to-image and Edit reference latents only")
        xt = prepared.xt
        # _forward treats a missing method as "index" and any other name as the offset layout.
        index_method = kw.get("ref_latents_method", "index") == "index"
        code = torch.tensor([int(index_method)], device=xt.device)
        return (xt, prepared.sigma, kw["c_crossattn"], code, *(kw.get("ref_latents") or ()))

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        if not hasattr(dm, "norm_out"):
            raise ConfigError("this Qwen-Image model has no final layer: pipeline_stages > 1 needs the full model.")
        total = len(dm.transformer_blocks)
        return [_Embed(base_model), *[_Block(b, i, total) for i, b in enumerate(dm.transformer_blocks)],
                _Head(base_model)]
