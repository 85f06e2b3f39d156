"""AuraFlow (comfy.ldm.aura.mmdit.MMDiT) as pipeline stage layers.

Mirrors BaseModel._apply_model + MMDiT._forward of ComfyUI 0.3.75. Conditioning is the text context
only (AuraFlow's extra_conds has nothing else). Refused: any other input (concat channels, ...),
models without single layers (ComfyUI's last double layer is then a different, context-less block
that its own forward cannot run either).

Tensors passed between stages:
  double-layer stages: c (8 register tokens, then the text), x (image tokens), global_cond, xt, sigma
  single-layer stages: cx (= cat(c, x)), global_cond, xt, sigma
The head needs xt and sigma for ComfyUI's calculate_denoised; the image tokens are the last
h * w of cx (their count follows from xt's shape), so no integer crosses a stage.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config.checks import ConfigError
from ..train.objective import transformer_options
from .common import (
    BlockLayer,
    EmbedLayer,
    HeadLayer,
    apply_model_start,
    refuse_unhandled,
    require_text,
    two_stream_layers,
)

_HANDLED = {"c_crossattn"}


def _tokens(dm, xt) -> tuple[int, int]:
    """The patch grid of a latent, as _forward computes it (padded up to the patch size)."""
    return (xt.shape[-2] + 1) // dm.patch_size, (xt.shape[-1] + 1) // dm.patch_size


class _Embed(EmbedLayer):
    def __init__(self, base, join: bool):
        dm = base.diffusion_model
        super().__init__(base, [dm.init_x_linear, dm.cond_seq_linear, dm.t_embedder], join)  # join: no double layers
        self.positional_encoding = dm.positional_encoding  # parameters of the model itself
        self.register_tokens = dm.register_tokens

    def forward(self, inputs):
        import comfy.ops

        xt, sigma, context = inputs
        base, dm = self._refs

        # BaseModel._apply_model
        xc, t, context, _ = apply_model_start(base, sigma, xt, context)
        t = base.process_timestep(t, x=xt)

        # MMDiT._forward, up to the blocks
        x = self._pos_embeds(dm, dm.init_x_linear(dm.patchify(xc)), *_tokens(dm, xc))
        c = dm.cond_seq_linear(context)
        c = torch.cat([comfy.ops.cast_to_input(self.register_tokens, c).repeat(c.size(0), 1, 1), c], dim=1)
        global_cond = dm.t_embedder(t, x.dtype)
        if self.join:
            return torch.cat([c, x], dim=1), global_cond, xt, sigma
        return c, x, global_cond, xt, sigma

    def _pos_embeds(self, dm, x, h, w):
        """MMDiT.apply_pos_embeds (h, w already in patches), reading the table this layer owns."""
        import comfy.ops

        max_dim, cur_dim = max(h, w), dm.h_max
        table = comfy.ops.cast_to_input(self.positional_encoding.reshape(1, cur_dim, cur_dim, -1), x)
        if max_dim > cur_dim:
            table = F.interpolate(table.movedim(-1, 1), (max_dim, max_dim), mode="bilinear").movedim(1, -1)
            cur_dim = max_dim
        top, left = (cur_dim - h) // 2, (cur_dim - w) // 2
        return x + table[:, top:top + h, left:left + w].reshape(1, -1, self.positional_encoding.shape[-1])


class _Double(BlockLayer):
    def forward(self, inputs):
        c, x, global_cond, xt, sigma = inputs
        c, x = self.block(c, x, global_cond, transformer_options=transformer_options(sigma))
        if self.join:  # the last double layer hands the single layers one joint sequence
            return torch.cat([c, x], dim=1), global_cond, xt, sigma
        return c, x, global_cond, xt, sigma


class _Single(BlockLayer):
    def forward(self, inputs):
        cx, global_cond, xt, sigma = inputs
        return self.block(cx, global_cond, transformer_options=transformer_options(sigma)), global_cond, xt, sigma


class _Head(HeadLayer):
    owned = ("modF", "final_linear")

    def forward(self, inputs):
        from comfy.ldm.aura.mmdit import modulate

        cx, global_cond, xt, sigma = inputs
        dm = self._dm[0]
        h, w = _tokens(dm, xt)
        x = cx[:, cx.shape[1] - h * w:]  # _forward drops the register and text tokens in front
        fshift, fscale = self.modF(global_cond).chunk(2, dim=1)
        out = self.final_linear(modulate(x, fshift, fscale))
        out = dm.unpatchify(out, h, w)[:, :, :xt.shape[-2], :xt.shape[-1]]
        return self.model_sampling.calculate_denoised(sigma, out.float(), xt)


class AuraFlowAdapter:
    name = "auraflow"
    partition = "uniform"  # layers of about equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.aura.mmdit
        import comfy.model_base

        return (type(base_model) is comfy.model_base.AuraFlow
                and type(base_model.diffusion_model) is comfy.ldm.aura.mmdit.MMDiT)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "AuraFlow", "text-to-image only",
                         {"c_concat": "concat channels", "y": "a pooled vector"})
        require_text(kw, "AuraFlow")
        return prepared.xt, prepared.sigma, kw["c_crossattn"]

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        if not len(dm.single_layers):
            raise ConfigError("this AuraFlow model has no single layers, which ComfyUI cannot run either (its last "
                              "double layer has no text output). Use a standard AuraFlow file.")
        return two_stream_layers(base_model, _Embed, _Double, _Single, _Head, dm.double_layers, dm.single_layers)
