"""Stable Diffusion 3 / 3.5 (comfy.ldm.modules.diffusionmodules.mmdit.OpenAISignatureMMDITWrapper) as
pipeline stage layers.

Mirrors BaseModel._apply_model + MMDiT.forward/forward_core_with_concat of ComfyUI 0.3.75:
conditioning = the joint CLIP/T5 context and the pooled CLIP vector (y, from `pooled_output`; absent
when the cache holds None, as in ComfyUI). Also reproduced: register tokens and the blocks' own
`use_checkpoint`. Refused: concat channels, ControlNet (its residuals are added to x after each
block), models built without a final layer, and the context processor (no SD3 release has one; its
blocks add to the cached context in place).

Tensors passed between stages: x (image tokens), context, c_mod (time + pooled embedding), xt and
sigma (the head needs them for ComfyUI's calculate_denoised). The last joint block is `pre_only`
on the context side (it returns no context), so from there on only x, c_mod, xt, sigma travel.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from ..train.objective import transformer_options
from .common import (
    BlockLayer,
    EmbedLayer,
    HeadLayer,
    apply_model_start,
    or_none,
    refuse_unhandled,
    require_text,
    stage_input,
)

# The kwargs of model.extra_conds this adapter reproduces; anything else means a variant it does not.
_HANDLED = {"c_crossattn", "y"}


class _Embed(EmbedLayer):
    def __init__(self, base):
        dm = base.diffusion_model
        embedders = [dm.x_embedder, dm.t_embedder, dm.context_embedder]
        super().__init__(base, embedders + ([dm.y_embedder] if dm.y_embedder is not None else []))
        # The position table is a buffer (moved with the module that owns it), so own it here and
        # crop it from here; the register tokens are a parameter of the model.
        self.register_buffer("pos_embed", dm.pos_embed)
        self.register = dm.register if dm.register_length > 0 else None

    def forward(self, inputs):
        import comfy.ops
        from comfy.model_base import convert_tensor
        from einops import repeat

        xt, sigma, context, y = inputs
        base, dm = self._refs
        y = or_none(y)  # an empty tensor stands for "no pooled vector"

        # BaseModel._apply_model
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        t = base.process_timestep(t, x=xt)
        y = None if y is None else convert_tensor(y, dtype, xc.device)

        # MMDiT.forward, up to the blocks (layers() refuses a context processor)
        hw = xc.shape[-2:]
        x = dm.x_embedder(xc)
        x = x + comfy.ops.cast_to_input(self._cropped_pos_embed(dm, hw, x.device), x)
        c = dm.t_embedder(t, dtype=x.dtype)
        if y is not None and dm.y_embedder is not None:
            c = c + dm.y_embedder(y)
        context = dm.context_embedder(context)
        # forward_core_with_concat: the register tokens go in front of the context
        if self.register is not None:
            context = torch.cat((repeat(self.register, "1 ... -> b ...", b=x.shape[0]), context), 1)
        # x_embedder's tokens are a transposed view; DeepSpeed sends stage outputs as they are, and
        # a non-contiguous tensor cannot be sent (same values, so the blocks compute the same).
        return x.contiguous(), context, c, xt, sigma

    def _cropped_pos_embed(self, dm, hw, device):
        """MMDiT.cropped_pos_embed, reading the table this layer owns."""
        from comfy.ldm.modules.diffusionmodules import mmdit
        from einops import rearrange

        p = dm.x_embedder.patch_size[0]
        h, w = (hw[0] + 1) // p, (hw[1] + 1) // p
        if self.pos_embed is None:
            return mmdit.get_2d_sincos_pos_embed_torch(dm.hidden_size, w, h, device=device)
        size = dm.pos_embed_max_size
        if h > size or w > size:
            raise ConfigError(f"a latent of {hw[0]} x {hw[1]} is larger than this SD3 model's position table "
                              f"({size * p} x {size * p} latent pixels); ComfyUI cannot run it either. Lower the "
                              "dataset resolution.")
        top, left = (size - h) // 2, (size - w) // 2
        table = rearrange(self.pos_embed, "1 (h w) c -> 1 h w c", h=size, w=size)[:, top:top + h, left:left + w, :]
        return rearrange(table, "1 h w c -> 1 (h w) c")


class _Joint(BlockLayer):  # self._dm[0]: the diffusion model, for use_checkpoint
    def __init__(self, block, dm):
        super().__init__(block, dm=dm)
        self.pre_only = block.context_block.pre_only

    def forward(self, inputs):
        x, context, c, xt, sigma = inputs
        context, x = self.block(context, x, c=c, use_checkpoint=self._dm[0].use_checkpoint,
                                transformer_options=transformer_options(sigma))
        if self.pre_only:  # the last block returns no context: the head does not need it
            return x, c, xt, sigma
        return x, context, c, xt, sigma


class _Head(HeadLayer):
    def forward(self, inputs):
        x, c, xt, sigma = inputs
        hw = xt.shape[-2:]
        out = self._dm[0].unpatchify(self.final_layer(x, c), hw=hw)[:, :, :hw[-2], :hw[-1]]
        return self.model_sampling.calculate_denoised(sigma, out.float(), xt)


class SD3Adapter:
    name = "sd3"
    partition = "uniform"  # joint blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.model_base
        from comfy.ldm.modules.diffusionmodules import mmdit

        return (type(base_model) is comfy.model_base.SD3
                and type(base_model.diffusion_model) is mmdit.OpenAISignatureMMDITWrapper)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "SD3", "text-to-image only",
                         {"c_concat": "concat channels", "crossattn_controlnet": "a ControlNet text input"})
        require_text(kw, "SD3")
        # A missing pooled vector travels as common.stage_input's stand-in; the model then treats it as None.
        return prepared.xt, prepared.sigma, kw["c_crossattn"], stage_input(kw.get("y"), prepared.xt)

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        if not hasattr(dm, "final_layer") or not hasattr(dm, "joint_blocks") or not len(dm.joint_blocks):
            raise ConfigError("this SD3 model has no joint blocks or no final layer: pipeline_stages > 1 needs "
                              "the full model. Set pipeline_stages to 1.")
        if dm.context_processor is not None:
            raise ConfigError("pipeline_stages > 1 is not available for SD3 models with a context processor (its "
                              "blocks update the text context in place). Set pipeline_stages to 1 for this model.")
        return [_Embed(base_model), *[_Joint(b, dm) for b in dm.joint_blocks], _Head(base_model)]
