"""Cosmos-Predict2 text/image-to-image and -video (comfy.ldm.cosmos.predict2.MiniTrainDIT) as pipeline
stage layers.

Mirrors BaseModel._apply_model + CosmosPredict2.process_timestep + MiniTrainDIT._forward of ComfyUI
0.3.75: T5 context, the frame rate (fps, absent by default), the latent noise mask of image-to-video
(denoise_mask: per-frame timesteps) and the image-to-video model's concat channel (c_concat: the
inverted mask). Refused: any other conditioning (padding masks are not something ComfyUI's
conditioning sets).

ComfyUI 0.33 and later also pad the input to whole patches (cropping the output back), keep the
residual stream in float32 for a float16 model (the blocks compute in the embedding's dtype and add
into the residual's) and write the block index into transformer_options; the layers follow where
the host's blocks work that way (`_float32_residual`). Padding and cropping are kept on every host:
they change nothing where the size is already whole patches, the only size 0.3.75 runs.

Unlike _forward, the embedding does not store `affline_emb` / `crossattn_emb` on the model (ComfyUI
keeps them only for logging; they would hold the last step's graph on a stage).

Tensors passed between stages (cosmos_family.py's): x [B, T, H, W, D], emb, context, rope, adaln_lora,
extra_pos, xt, sigma. adaln_lora and extra_pos (the per-block absolute position embedding) are empty
tensors for models without them.
"""
from __future__ import annotations

import torch
from torch import nn

from ..train.objective import transformer_options
from . import cosmos_family
from .common import BlockLayer, EmbedLayer, apply_model_start, number, or_none

_HANDLED = {"c_crossattn", "c_concat", "fps", "denoise_mask"}


def _float32_residual(dm) -> bool:
    """Whether the host keeps a float16 model's residual stream in float32 between blocks (0.33 and
    later). Its blocks were rewritten for that together with their attention, which then gained
    transformer_options (patch hooks) in compute_qkv: the host's own code says which it runs."""
    import inspect

    attn = type(dm.blocks[0].self_attn) if len(dm.blocks) else None
    return attn is not None and "transformer_options" in inspect.signature(attn.compute_qkv).parameters


class _Embed(EmbedLayer):
    def __init__(self, base):
        dm = base.diffusion_model
        embedders = [dm.x_embedder, dm.pos_embedder, dm.t_embedder, dm.t_embedding_norm]
        if dm.extra_per_block_abs_pos_emb:
            embedders.append(dm.extra_pos_embedder)
        super().__init__(base, embedders)
        self.float32_residual = _float32_residual(dm)

    def forward(self, inputs):
        from comfy.model_base import convert_tensor

        xt, sigma, context, concat, fps, denoise_mask = inputs
        base, dm = self._refs

        # BaseModel._apply_model (+ CosmosPredict2.process_timestep); empty tensors stand for "absent"
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context, or_none(concat))
        denoise_mask = or_none(denoise_mask)
        denoise_mask = None if denoise_mask is None else convert_tensor(denoise_mask, dtype, xc.device)
        t = base.process_timestep(t, x=xt, denoise_mask=denoise_mask)

        # MiniTrainDIT._forward, up to the blocks
        import comfy.ldm.common_dit

        xc = comfy.ldm.common_dit.pad_to_patch_size(xc, (dm.patch_temporal, dm.patch_spatial, dm.patch_spatial))
        x, rope, extra_pos = dm.prepare_embedded_sequence(xc, fps=number(fps), padding_mask=None)
        if t.ndim == 1:
            t = t.unsqueeze(1)
        emb, adaln_lora = cosmos_family.time_embedding(dm, dm.t_embedding_norm, t, x.dtype)
        if x.dtype == torch.float16 and self.float32_residual:
            x = x.float()
        return (x, emb, context, rope.unsqueeze(1).unsqueeze(0), cosmos_family.empty_or(adaln_lora, x),
                cosmos_family.empty_or(extra_pos, x), xt, sigma)


class _Block(BlockLayer):
    def forward(self, inputs):
        x, emb, context, rope, adaln_lora, extra_pos, xt, sigma = inputs
        options = {**transformer_options(sigma), "block_index": self.index}  # what _forward hands each block
        x = self.block(x, emb, context, rope_emb_L_1_1_D=rope, adaln_lora_B_T_3D=or_none(adaln_lora),
                       extra_per_block_pos_emb=or_none(extra_pos), transformer_options=options)
        return x, emb, context, rope, adaln_lora, extra_pos, xt, sigma


class _Head(cosmos_family.Head):
    def network(self, x, emb, context, adaln_lora, xt):
        # the final layer runs in the text's dtype (the model's: a float32 residual goes back to it)
        out = self._dm[0].unpatchify(self.final_layer(x.to(context.dtype), emb, adaln_lora_B_T_3D=adaln_lora))
        return out[:, :, :xt.shape[-3], :xt.shape[-2], :xt.shape[-1]]  # the padding to whole patches dropped


class CosmosPredict2Adapter:
    name = "cosmos_predict2"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.cosmos.predict2
        import comfy.model_base

        return (type(base_model) is comfy.model_base.CosmosPredict2
                and type(base_model.diffusion_model) is comfy.ldm.cosmos.predict2.MiniTrainDIT)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        return cosmos_family.stage_inputs(prepared, _HANDLED, "Cosmos-Predict2",
                                          "text-to-image/video and image-to-video", "denoise_mask")

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        total = len(dm.blocks)
        return [_Embed(base_model), *[_Block(b, i, total) for i, b in enumerate(dm.blocks)], _Head(base_model)]
