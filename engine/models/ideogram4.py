"""Ideogram 4 (comfy.ldm.ideogram4.model.Ideogram4Transformer2DModel, ComfyUI 0.33+) as pipeline stage layers.

Mirrors its _forward -> _run_conditional -> _backbone of ComfyUI 0.33.0: one packed sequence of the text
rows (Qwen3-VL features, normed and projected) and the image tokens (2x2 patches of the latent), each row
marked text or image by an indicator, Qwen3-VL's interleaved 3-axis rope, a padded text turned into a
block-diagonal mask (padding rows attend only to each other, as upstream's segment ids do), and the model
sees 1 - t and predicts the negated velocity. Text to image only (the image-only branch, which upstream
takes without text, is refused). Tensors passed between stages: the sequence h, the integer segment ids of
a padded text (or an empty stand-in; each block makes the additive mask from them), the rope matrix, the
adaLN input, plus xt and sigma for calculate_denoised.
"""
from __future__ import annotations

import torch
from torch import nn

from .common import (BlockLayer, EmbedLayer, HeadLayer, apply_model_start, block_list_layers, host_class,
                     integer_input, keep_in_graph, or_none, refuse_unhandled, require_text)

_HANDLED = {"c_crossattn", "attention_mask"}


def _segments(text_mask, batch: int, text: int, images: int, device):
    """(indicator, segment ids or None) as _run_conditional sets them: every text row is an LLM token, every
    image row an output image token; a padded text's rows get the padding indicator and a segment of their own."""
    from comfy.ldm.ideogram4 import model as ideogram

    rows = text + images
    indicator = torch.empty(batch, rows, dtype=torch.long, device=device)
    indicator[:, :text] = ideogram.LLM_TOKEN_INDICATOR
    indicator[:, text:] = ideogram.OUTPUT_IMAGE_INDICATOR
    if text_mask is None:
        return indicator, None
    segments = torch.ones(batch, rows, dtype=torch.long, device=device)
    pad = text_mask == 0
    segments[:, :text][pad] = ideogram.SEQUENCE_PADDING_INDICATOR
    indicator[:, :text][pad] = 0
    return indicator, segments


def _attention_mask(segments, dtype):
    """The additive mask _backbone gives every layer: 0 where two rows share a segment, -max of dtype elsewhere.
    Made in each block from the integer segment ids, which cross the stages without a gradient (an additive
    mask would have to stay in the graph, and its -max entries sum to -inf)."""
    if segments is None:
        return None
    same = (segments.unsqueeze(2) == segments.unsqueeze(1)).unsqueeze(1)
    return torch.zeros_like(same, dtype=dtype).masked_fill_(~same, -torch.finfo(dtype).max)


class _Embed(EmbedLayer):
    def __init__(self, base):
        dm = base.diffusion_model
        super().__init__(base, [dm.input_proj, dm.llm_cond_norm, dm.llm_cond_proj, dm.t_embedding, dm.adaln_proj,
                                dm.embed_image_indicator])

    def forward(self, inputs):
        import torch.nn.functional as F
        from comfy.ldm.ideogram4 import model as ideogram
        from comfy.model_base import convert_tensor
        from comfy.text_encoders.llama import precompute_freqs_cis

        xt, sigma, context, text_mask = inputs
        base, dm = self._refs
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        text_mask = or_none(text_mask)
        if text_mask is not None:
            text_mask = convert_tensor(text_mask, dtype, xc.device)
        t = 1.0 - base.process_timestep(t, x=xt)
        # _run_conditional up to _backbone
        batch, _, rows, columns = xc.shape
        image = dm._img_to_tokens(xc)
        text = context.shape[1]
        x = torch.zeros(batch, text + image.shape[1], image.shape[-1], dtype=image.dtype, device=xc.device)
        x[:, text:] = image
        positions = torch.arange(text, device=xc.device).view(-1, 1).expand(text, 3)
        positions = torch.cat([positions, dm._image_position_ids(rows, columns, xc.device)], dim=0)
        indicator, segments = _segments(text_mask, batch, text, image.shape[1], xc.device)
        # _backbone up to the layers
        is_image = (indicator == ideogram.OUTPUT_IMAGE_INDICATOR).to(x.dtype).unsqueeze(-1)
        x = x * is_image
        h = dm.input_proj(x) * is_image
        t_cond = dm.t_embedding(t, dtype=x.dtype)
        if t.dim() == 1:
            t_cond = t_cond.unsqueeze(1)
        adaln_input = F.silu(dm.adaln_proj(t_cond))
        is_text = (indicator[:, :text] == ideogram.LLM_TOKEN_INDICATOR).to(x.dtype).unsqueeze(-1)
        llm = dm.llm_cond_proj(dm.llm_cond_norm(context * is_text)) * is_text
        h[:, :text] = h[:, :text] + llm
        h = h + dm.embed_image_indicator((indicator == ideogram.OUTPUT_IMAGE_INDICATOR).to(torch.long),
                                         out_dtype=h.dtype)
        freqs = precompute_freqs_cis(dm.head_dim, positions.transpose(0, 1), dm.rope_theta, rope_dims=dm.mrope_section,
                                     interleaved_mrope=True, device=xc.device)
        freqs = ideogram._split_half_rope_matrix(freqs)
        return h, integer_input(segments, xt), freqs, adaln_input, xt, sigma


class _Block(BlockLayer):
    def forward(self, inputs):
        from ..train.objective import transformer_options

        h, segments, freqs, adaln_input, xt, sigma = inputs
        mask = _attention_mask(or_none(segments), h.dtype)
        h = self.block(h, mask, freqs, adaln_input, transformer_options=transformer_options(sigma))
        return h, segments, freqs, adaln_input, xt, sigma


class _Head(HeadLayer):
    owned = ("final_layer",)

    def forward(self, inputs):
        h, segments, freqs, adaln_input, xt, sigma = inputs
        dm = self._dm[0]
        rows, columns = xt.shape[2:]
        tokens = self.final_layer(h, adaln_input)
        out = -dm._tokens_to_img(tokens[:, h.shape[1] - rows * columns:], rows, columns)
        # the rope matrix: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), freqs)


class Ideogram4Adapter:
    name = "ideogram4"
    partition = "uniform"  # identical layers: the same number per stage

    @staticmethod
    def matches(base_model) -> bool:  # ComfyUI 0.33+
        return type(base_model.diffusion_model) is host_class("comfy.ldm.ideogram4.model", "Ideogram4Transformer2DModel")

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "Ideogram 4", "text-to-image only", {"c_concat": "concat channels"})
        require_text(kw, "Ideogram 4")
        return prepared.xt, prepared.sigma, kw["c_crossattn"], integer_input(kw.get("attention_mask"), prepared.xt)

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        return block_list_layers(base_model, _Embed, _Block, _Head, base_model.diffusion_model.layers)
