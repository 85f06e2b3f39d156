"""ComfyUI's image UNet (comfy.ldm.modules.diffusionmodules.openaimodel.UNetModel: SDXL and its
distilled variants SSD-1B / Vega / KOALA, SDXL refiner, SD 1.x, SD 2.x) as pipeline stage layers.

Mirrors BaseModel._apply_model + UNetModel._forward of ComfyUI 0.3.75: text context (c_crossattn)
and, for models with a label embedder (SDXL: pooled CLIP-G vector + size/crop embedding), the adm
vector y. Refused until they are added here: concat channels (inpaint, instruct-pix2pix, x4
upscaler), the video UNets (SVD: temporal blocks) and codebook heads.

Layers: embedding (time + label embedding), one layer per input block, the middle block, one
layer per output block, and the head (out + calculate_denoised). Tensors passed between stages:

    emb, context, xt, sigma, *stack

`stack` holds the skip tensors the input blocks pushed (ComfyUI's `hs`), bottom first, then the
current activation h. In the input phase h *is* the newest skip (UNetModel appends h to hs and
goes on with the same tensor), so it is not sent twice: the stack is just hs. The middle layer
pushes its output h on top of hs; each output layer takes h and the newest skip (the two top
entries) and leaves its output on top, so a skip crosses the stages until the output block that
pops it and no further. The last output layer drops emb and context: the head gets h, xt, sigma.
The embedding's xc (the scaled input) is consumed by input block 0 and not carried on.

transformer_options: each block call gets a fresh dict with what UNetModel._forward would have
written by then ("original_shape", "transformer_index" counted over the SpatialTransformers of the
earlier blocks, "block") on top of the engine's per-call options (engine/train/objective.py); patches
and ControlNet are sampling-time additions that a training run never sets, so like the plain
path the layers apply none.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from ..train.objective import transformer_options
from .common import BlockLayer, apply_model_start, or_none, refuse_unhandled, stage_input

_HANDLED = {"c_crossattn", "y"}


def _transformers(module) -> int:
    from comfy.ldm.modules.attention import SpatialTransformer

    # SpatialVideoTransformer subclasses it; forward_timestep_embed counts both
    return 0 if module is None else sum(isinstance(m, SpatialTransformer) for m in module.children())


class _Embed(nn.Module):
    def __init__(self, base):
        super().__init__()
        dm = base.diffusion_model
        # Own only the embedders (so DeepSpeed places and counts just them on this stage); the rest
        # of the model is reached through plain references kept out of the module tree.
        self.time_embed = dm.time_embed
        self.label_emb = dm.label_emb if dm.num_classes is not None else None
        self.model_sampling = base.model_sampling
        self._refs = (base, dm)

    def forward(self, inputs):
        from comfy.ldm.modules.diffusionmodules.util import timestep_embedding
        from comfy.model_base import convert_tensor

        xt, sigma, context, y = inputs
        base, dm = self._refs
        y = or_none(y)  # an empty tensor stands for "no y" (fixed tuple, no None)
        if (y is None) != (self.label_emb is None):
            raise ConfigError("this UNet " + ("needs the adm vector y (SDXL: pooled_output) but the cached "
                                              "conditioning has none" if y is None else
                                              "has no label embedder but the conditioning gives it a y vector")
                              + ": re-cache the dataset with this model's text encoder or set pipeline_stages to 1.")
        # BaseModel._apply_model
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        extra = {} if y is None else {"y": convert_tensor(y, dtype, xc.device)}
        t = base.process_timestep(t, x=xt, **extra)
        # UNetModel._forward, up to the input blocks
        emb = self.time_embed(timestep_embedding(t, dm.model_channels, repeat_only=False).to(xc.dtype))
        if self.label_emb is not None:
            emb = emb + self.label_emb(extra["y"])
        return emb, context, xt, sigma, xc


class _Block(BlockLayer):
    """Base of the input, middle and output block layers: `kind` names the block list (UNetModel's
    "block" key), transformer_index counts the SpatialTransformers before this block."""

    kind = ""

    def __init__(self, block, index: int, transformer_index: int, dm, last: bool = False):
        super().__init__(block, index, dm=dm)
        self.transformer_index, self.last = transformer_index, last

    def run(self, h, emb, context, xt, sigma, output_shape=None):
        """forward_timestep_embed on this block with what UNetModel._forward has written by then."""
        from comfy.ldm.modules.diffusionmodules.openaimodel import (
            forward_timestep_embed,
        )

        dm = self._dm[0]
        # "original_shape" is the UNet's input's: the latent with the model's input channels
        options = {**transformer_options(sigma), "original_shape": [xt.shape[0], dm.in_channels, *xt.shape[2:]],
                   "transformer_index": self.transformer_index, "block": (self.kind, self.index)}
        return forward_timestep_embed(self.block, h, emb, context, options, output_shape,
                                      num_video_frames=dm.default_num_video_frames)


class _Input(_Block):
    kind = "input"

    def forward(self, inputs):
        emb, context, xt, sigma, *stack = inputs
        h = self.run(stack[-1], emb, context, xt, sigma)
        hs = stack[:-1] if self.index == 0 else stack  # block 0 consumes xc, which is no skip
        return emb, context, xt, sigma, *hs, h


class _Middle(_Block):
    kind = "middle"  # self.block: None in UNets built without one

    def forward(self, inputs):
        emb, context, xt, sigma, *hs = inputs
        if self.block is None:
            h = hs[-1].view_as(hs[-1])  # h stays the newest skip; a view, so the stack holds two entries
        else:
            h = self.run(hs[-1], emb, context, xt, sigma)
        return emb, context, xt, sigma, *hs, h


class _Output(_Block):
    kind = "output"

    def forward(self, inputs):
        emb, context, xt, sigma, *stack = inputs
        *hs, skip, h = stack
        h = torch.cat([h, skip], dim=1)
        output_shape = hs[-1].shape if hs else None  # the next skip's size, for odd-sized upsampling
        h = self.run(h, emb, context, xt, sigma, output_shape)
        if self.last:
            # emb and context go no further. DeepSpeed wants a gradient for every float tensor a stage
            # receives, so keep them in the graph (exact zero) for a block that does not read them.
            unused = emb.sum(dtype=torch.float32) + context.sum(dtype=torch.float32)  # fp32: no fp16 overflow
            return h + (0.0 * unused).to(h.dtype), xt, sigma
        return emb, context, xt, sigma, *hs, h


class _Head(nn.Module):
    def __init__(self, base):
        super().__init__()
        self.out = base.diffusion_model.out
        self.model_sampling = base.model_sampling
        self._base = (base,)

    def forward(self, inputs):
        h, xt, sigma = inputs
        base = self._base[0]
        out = self.out(h.type(base.manual_cast_dtype or base.get_dtype()))  # h.type(x.dtype), then out
        return self.model_sampling.calculate_denoised(sigma, out.float(), xt)


class UNetAdapter:
    name = "unet"
    # A UNet's blocks differ widely in size and work, and many hold no attention (no LoRA with the
    # attention targets): equal layer counts can leave a stage without LoRA weights. Cut by parameters.
    partition = "parameters"

    @staticmethod
    def matches(base_model) -> bool:
        from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel

        dm = getattr(base_model, "diffusion_model", None)
        return type(dm) is UNetModel

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "SD / SDXL UNets", "text-to-image only",
                         {"c_concat": "concat channels (inpaint / instruct-pix2pix / upscale models)"})
        return prepared.xt, prepared.sigma, kw["c_crossattn"], stage_input(kw.get("y"), prepared.xt)

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        from comfy.ldm.modules.attention import SpatialVideoTransformer
        from comfy.ldm.modules.diffusionmodules.openaimodel import VideoResBlock

        video = any(isinstance(m, (VideoResBlock, SpatialVideoTransformer)) for m in dm.modules())
        refused = ("video UNets (SVD: temporal blocks)" if video else
                   "codebook heads" if dm.predict_codebook_ids else
                   "extra input channels (inpaint / instruct-pix2pix / upscale models)"
                   if dm.in_channels != base_model.latent_format.latent_channels else None)
        if refused:
            raise ConfigError(f"pipeline_stages > 1 is not available for UNets with {refused}. Set pipeline_stages "
                              "to 1 for this model.")
        layers, seen = [_Embed(base_model)], 0
        for i, block in enumerate(dm.input_blocks):
            layers.append(_Input(block, i, seen, dm))
            seen += _transformers(block)
        layers.append(_Middle(dm.middle_block, 0, seen, dm))
        seen += _transformers(dm.middle_block)
        count = len(dm.output_blocks)
        for i, block in enumerate(dm.output_blocks):
            layers.append(_Output(block, i, seen, dm, last=i == count - 1))
            seen += _transformers(block)
        return [*layers, _Head(base_model)]
