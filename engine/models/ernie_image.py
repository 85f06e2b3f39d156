"""Ernie-Image (comfy.ldm.ernie.model.ErnieImageModel, ComfyUI 0.33+) as pipeline stage layers.

Mirrors ErnieImageModel.forward of ComfyUI 0.33.0: the patch-embedded image and the projected text form
one token sequence (image first), one 3-axis rope table covers both, and a single adaLN modulation (six
vectors made once from the timestep) is read by every layer; the head normalises with the timestep
embedding and projects the image tokens back to the latent. Text to image only: the class has no other
input. Tensors passed between stages: the token sequence, the rope table, the six modulation vectors and
the timestep embedding c (the head's norm reads it), plus xt and sigma for calculate_denoised.
"""
from __future__ import annotations

import torch
from torch import nn

from .common import (BlockLayer, EmbedLayer, HeadLayer, apply_model_start, block_list_layers, host_class, keep_in_graph,
                     refuse_unhandled, require_text)

_HANDLED = {"c_crossattn"}
_MODULATION = 6  # shift, scale and gate of the attention and of the MLP


def _positions(dm, rows: int, columns: int, text: int, batch: int, device, options: dict) -> torch.Tensor:
    """The (axis 0, row, column) position of every token, image tokens first, as the forward sets them:
    text tokens count along axis 0 from 0, the image sits at axis 0 = text length on its own grid;
    transformer_options' rope_options shift and scale the grid as in upstream."""
    rope = options.get("rope_options") or {}
    rows_len = (rows - 1.0) * rope.get("scale_y", 1.0) + 1.0
    columns_len = (columns - 1.0) * rope.get("scale_x", 1.0) + 1.0
    index = float(text) + rope.get("shift_t", 0.0)
    row0, column0 = rope.get("shift_y", 0.0), rope.get("shift_x", 0.0)
    image = torch.zeros((rows, columns, 3), device=device, dtype=torch.float32)
    image[:, :, 0] = index
    image[:, :, 1] = torch.linspace(row0, rows_len - 1 + row0, steps=rows, device=device,
                                    dtype=torch.float32).unsqueeze(1)
    image[:, :, 2] = torch.linspace(column0, columns_len - 1 + column0, steps=columns, device=device,
                                    dtype=torch.float32).unsqueeze(0)
    words = torch.zeros((batch, text, 3), device=device, dtype=torch.float32)
    words[:, :, 0] = torch.linspace(0, text - 1, steps=text, device=device, dtype=torch.float32)
    return torch.cat([image.view(1, rows * columns, 3).expand(batch, -1, -1), words], dim=1)


class _Embed(EmbedLayer):
    def __init__(self, base):
        dm = base.diffusion_model
        parts = [dm.x_embedder, dm.time_embedding, dm.adaLN_modulation]
        super().__init__(base, parts + ([dm.text_proj] if dm.text_proj is not None else []))

    def forward(self, inputs):
        from ..train.objective import transformer_options

        xt, sigma, context = inputs
        base, dm = self._refs
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        t = base.process_timestep(t, x=xt)
        batch, _, height, width = xc.shape
        tokens = dm.x_embedder(xc)
        text = dm.text_proj(context) if dm.text_proj is not None and context.numel() > 0 else context
        x = torch.cat([tokens, text], dim=1)
        p = dm.patch_size
        ids = _positions(dm, height // p, width // p, text.shape[1], batch, xc.device, transformer_options(sigma))
        rope = dm.pos_embed(ids)
        c = dm.time_embedding(dm.time_proj(t).to(xc.dtype))
        modulation = [m.unsqueeze(1).contiguous() for m in dm.adaLN_modulation(c).chunk(_MODULATION, dim=-1)]
        return x, rope, *modulation, c, xt, sigma


class _Block(BlockLayer):
    def forward(self, inputs):
        x, rope, *modulation, c, xt, sigma = inputs
        return self.block(x, rope, modulation), rope, *modulation, c, xt, sigma


class _Head(HeadLayer):
    owned = ("final_norm", "final_linear")

    def forward(self, inputs):
        x, rope, *modulation, c, xt, sigma = inputs
        dm = self._dm[0]
        batch, _, height, width = xt.shape
        p = dm.patch_size
        rows, columns = height // p, width // p
        x = self.final_norm(x, c).type_as(x)
        cells = self.final_linear(x)[:, :rows * columns, :]
        out = (cells.view(batch, rows, columns, p, p, dm.out_channels).permute(0, 5, 1, 3, 2, 4).contiguous()
               .view(batch, dm.out_channels, height, width))
        # the rope table and the modulation: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), rope, *modulation)


class ErnieImageAdapter:
    name = "ernie_image"
    partition = "uniform"  # identical layers: the same number per stage

    @staticmethod
    def matches(base_model) -> bool:  # ComfyUI 0.33+
        return type(base_model.diffusion_model) is host_class("comfy.ldm.ernie.model", "ErnieImageModel")

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "Ernie-Image", "text-to-image only", {"c_concat": "concat channels"})
        require_text(kw, "Ernie-Image")
        return prepared.xt, prepared.sigma, kw["c_crossattn"]

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        return block_list_layers(base_model, _Embed, _Block, _Head, base_model.diffusion_model.layers)
