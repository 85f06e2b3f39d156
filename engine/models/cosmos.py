"""Cosmos 1.0 diffusion text/image-to-video (comfy.ldm.cosmos.model.GeneralDIT, 7B and 14B) as pipeline
stage layers.

Mirrors BaseModel._apply_model + GeneralDIT._forward / forward_before_blocks / decoder_head of ComfyUI
0.3.75: T5 context, the frame rate (fps, which scales the temporal rope) and the image-to-video
model's concat channel (c_concat: the inverted noise mask). The text attention mask is accepted and
unused, as GeneralDIT ignores it unless use_cross_attn_mask. Refused: other conditioning, and models
ComfyUI's released configs do not have (cross-attention masks, no per-block position embedding,
a block layout other than THWBD).

The blocks are a ModuleDict ("block0", ...). _forward adds the per-block absolute position embedding
to x before every block (`x += extra_pos`, outside the block); each block layer does the same, out of
place, so a stage never writes into the tensor it received.

Tensors passed between stages (cosmos_family.py's, in the time-major THWBD layout, made contiguous
for DeepSpeed's send): x [T, H, W, B, D], emb, context [B, M, D], rope, adaln_lora (empty without
adaLN-LoRA), extra_pos [T, H, W, B, D], xt, sigma (xt also gives the output shape).
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from ..train.objective import transformer_options
from . import cosmos_family
from .common import BlockLayer, EmbedLayer, apply_model_start, number, or_none

_HANDLED = {"c_crossattn", "c_concat", "fps"}
_IGNORED = {"attention_mask"}


class _Embed(EmbedLayer):
    def __init__(self, base):
        dm = base.diffusion_model
        super().__init__(base, [dm.x_embedder, dm.pos_embedder, dm.extra_pos_embedder, dm.t_embedder, dm.affline_norm])

    def forward(self, inputs):
        from einops import rearrange

        xt, sigma, context, concat, fps = inputs
        base, dm = self._refs

        # BaseModel._apply_model (an empty concat stands for "no c_concat")
        xc, t, context, _ = apply_model_start(base, sigma, xt, context, or_none(concat))
        t = base.process_timestep(t, x=xt)

        # GeneralDIT.forward_before_blocks and _forward, up to the blocks
        x, rope, extra_pos = dm.prepare_embedded_sequence(xc, fps=number(fps), padding_mask=None)
        emb, adaln_lora = cosmos_family.time_embedding(dm, dm.affline_norm, t.flatten(), x.dtype)
        x = rearrange(x, "B T H W D -> T H W B D")
        extra_pos = rearrange(extra_pos, "B T H W D -> T H W B D").to(x.dtype)
        # context travels as [B, M, D]; each block views it as _forward's [M, B, D] (its strides matter to
        # the host's linear ops: a contiguous [M, B, D] copy rounds differently on ComfyUI 0.33)
        return (x.contiguous(), emb, context, rope, cosmos_family.empty_or(adaln_lora, x), extra_pos.contiguous(),
                xt, sigma)


class _Block(BlockLayer):
    def forward(self, inputs):
        from einops import rearrange

        x, emb, context, rope, adaln_lora, extra_pos, xt, sigma = inputs
        x = self.block(x + extra_pos, emb, rearrange(context, "B M D -> M B D"), None, rope_emb_L_1_1_D=rope,
                       adaln_lora_B_3D=or_none(adaln_lora), transformer_options=transformer_options(sigma))
        return x.contiguous(), emb, context, rope, adaln_lora, extra_pos, xt, sigma


class _Head(cosmos_family.Head):
    def network(self, x, emb, context, adaln_lora, xt):
        from einops import rearrange

        return self._dm[0].decoder_head(x_B_T_H_W_D=rearrange(x, "T H W B D -> B T H W D"), emb_B_D=emb,
                                        crossattn_emb=None, origin_shape=xt.shape,  # only B, T, H, W are read
                                        crossattn_mask=None, adaln_lora_B_3D=adaln_lora)


class CosmosAdapter:
    name = "cosmos"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.cosmos.model
        import comfy.model_base

        return (type(base_model) is comfy.model_base.CosmosVideo
                and type(base_model.diffusion_model) is comfy.ldm.cosmos.model.GeneralDIT)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        return cosmos_family.stage_inputs(prepared, _HANDLED | _IGNORED, "Cosmos 1.0",
                                          "text-to-video and image-to-video")

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        blocks = list(dm.blocks.values())
        if dm.use_cross_attn_mask or not dm.extra_per_block_abs_pos_emb or \
                any(b.x_format != "THWBD" for b in blocks):
            raise ConfigError("pipeline_stages > 1 supports the released Cosmos 1.0 configurations only (per-block "
                              "position embedding, no cross-attention mask, THWBD blocks). Set pipeline_stages to 1 "
                              "for this model.")
        return [_Embed(base_model), *[_Block(b) for b in blocks], _Head(base_model)]
