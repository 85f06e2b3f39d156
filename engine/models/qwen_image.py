"""Qwen-Image and Qwen-Image-Edit (comfy.ldm.qwen_image.model.QwenImageTransformer2DModel) as pipeline
stage layers.

Mirrors BaseModel._apply_model + QwenImageTransformer2DModel._forward of ComfyUI 0.3.75: text context
and, for the Edit models, reference latents (ref_latents: any number and sizes, each ref_latents_method;
their tokens follow the target's). ControlNet and the block patches of other custom nodes are not
reproduced. What ComfyUI 0.33 changed follows the host's model: a model with `default_ref_method`
(0.33+) reads a missing method as that default and knows "negative_index" (references at indices
-1, -2, ...); its "index_timestep_zero" (a second, zero timestep for the references) is refused.
0.33's extra_conds passes the text attention mask: the integer mask travels and each block turns
it into _forward's additive one. The head unpatchifies frames too (0.33's layout, the same for one).

Tensors passed between stages: img (target tokens, then reference tokens), txt, temb, pe (the block
inputs) plus xt and sigma, which the head needs for ComfyUI's calculate_denoised. The target's tokens
come first, so the head finds them from xt's shape alone. The last block hands on only img and temb:
its text output is unused, as in ComfyUI (so that block's text-stream LoRA gets no gradient there either).
"""
from __future__ import annotations

import torch
from torch import nn

from . import references
from .common import (
    BlockLayer,
    EmbedLayer,
    HeadLayer,
    additive_mask,
    apply_model_start,
    integer_input,
    patches,
    refuse_unhandled,
    require_final_layer,
    require_integer_mask,
)

_HANDLED = {"c_crossattn", "ref_latents", "ref_latents_method", "attention_mask"}
# Reference layouts as codes for the first stage (references.method_code): -1 the model's default, 0
# offset (also any name not here).
_METHODS = ("offset", "index", "negative_index")


def _method(dm, code: int) -> str:
    """The layout _forward uses for the method code: 0.3.75 knows only "index" (its default) and the
    offset layout; a host model with `default_ref_method` also "negative_index"."""
    default = getattr(dm, "default_ref_method", None)
    if code == -1:  # the model's default ("index" on a host without the setting)
        code = 1 if default is None else _METHODS.index(default) if default in _METHODS else 0
    if code == 2 and default is None:  # a host without it reads the name as the offset layout
        code = 0
    return _METHODS[code]


def _additive(mask, dtype):
    """_forward's conversion (0.33+) of an integer text mask to the additive one the blocks take."""
    return mask if torch.is_floating_point(mask) else additive_mask(mask, dtype)


class _Embed(EmbedLayer):
    def __init__(self, base):
        dm = base.diffusion_model
        super().__init__(base, [dm.img_in, dm.txt_norm, dm.txt_in, dm.time_text_embed])

    def forward(self, inputs):
        from comfy.model_base import convert_tensor

        xt, sigma, context, mask, method, *refs = inputs
        base, dm = self._refs

        # BaseModel._apply_model
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        device = xc.device
        t = base.process_timestep(t, x=xt)
        refs = [convert_tensor(r, dtype, device) for r in refs]

        # QwenImageTransformer2DModel._forward, up to the blocks
        img, img_ids, _ = dm.process_img(xc)
        img, img_ids = _add_references(dm, img, img_ids, refs, _method(dm, references.code_of(method)))
        p = dm.patch_size
        txt_start = round(max(((xc.shape[-1] + (p // 2)) // p) // 2, ((xc.shape[-2] + (p // 2)) // p) // 2))
        txt_ids = torch.arange(txt_start, txt_start + context.shape[1], device=device).reshape(1, -1, 1)
        txt_ids = txt_ids.repeat(xc.shape[0], 1, 3)
        pe = dm.pe_embedder(torch.cat((txt_ids, img_ids), dim=1)).to(xc.dtype).contiguous()
        img = dm.img_in(img)
        txt = dm.txt_in(dm.txt_norm(context))
        temb = dm.time_text_embed(t, img)
        return img, txt, mask, temb, pe, xt, sigma


def _add_references(dm, img, img_ids, refs, method: str):
    """_forward's reference-latent loop: the reference tokens appended after the target's."""
    h = w = index = 0
    for ref in refs:
        if method == "index":
            index += 1
            h_offset = w_offset = 0
        elif method == "negative_index":
            index -= 1
            h_offset = w_offset = 0
        else:
            index = 1
            h_offset, w_offset, h, w = references.offset_place(ref, h, w)
        tokens, ids, _ = dm.process_img(ref, index=index, h_offset=h_offset, w_offset=w_offset)
        img = torch.cat([img, tokens], dim=1)
        img_ids = torch.cat([img_ids, ids], dim=1)
    return img, img_ids


class _Block(BlockLayer):
    def __init__(self, block, index: int, total: int):
        super().__init__(block, index, total)
        self.last = index == total - 1

    def forward(self, inputs):
        img, txt, mask, temb, pe, xt, sigma = inputs
        # _forward writes block_type "double" etc. into transformer_options before each block
        txt, img = self.block(hidden_states=img, encoder_hidden_states=txt,
                              encoder_hidden_states_mask=_additive(mask, img.dtype) if mask.numel() else None,
                              temb=temb, image_rotary_emb=pe,
                              transformer_options=self.options(sigma, "double"))
        if self.last:  # the head reads neither the text stream nor pe (the mask is integer: no gradient)
            return img, temb, xt, sigma
        return img, txt, mask, temb, pe, xt, sigma


class _Head(HeadLayer):
    owned = ("norm_out", "proj_out")

    def forward(self, inputs):
        img, temb, xt, sigma = inputs
        p = self._dm[0].patch_size
        # process_img's padded input shape [B, C, T, H, W] (H and W up to a multiple of the patch), from xt
        shape = (*xt.shape[:3], patches(xt.shape[-2], p) * p, patches(xt.shape[-1], p) * p)
        target = shape[2] * (shape[-2] // 2) * (shape[-1] // 2)
        out = self.proj_out(self.norm_out(img, temb))
        # frames, rows, columns, channels, 2 x 2 (0.33's layout; 0.3.75 runs one frame, where both agree)
        out = out[:, :target].view(shape[0], shape[2], shape[-2] // 2, shape[-1] // 2, shape[1], 2, 2)
        out = out.permute(0, 4, 1, 2, 5, 3, 6).reshape(shape)[:, :, :, :xt.shape[-2], :xt.shape[-1]]
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
        method = kw.get("ref_latents_method")
        references.refuse_method(method, "Qwen-Image")
        # a missing method is the model's default; any name _forward does not know is the offset layout
        code = references.method_code(method, _METHODS, xt.device)
        mask = kw.get("attention_mask")
        require_integer_mask(mask, "Qwen-Image")
        # an integer stand-in where absent: DeepSpeed expects no gradient for it where the last block drops it
        return (xt, prepared.sigma, kw["c_crossattn"], integer_input(mask, xt), code, *(kw.get("ref_latents") or ()))

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        require_final_layer(dm, "Qwen-Image", "norm_out")
        total = len(dm.transformer_blocks)
        return [_Embed(base_model), *[_Block(b, i, total) for i, b in enumerate(dm.transformer_blocks)],
                _Head(base_model)]
