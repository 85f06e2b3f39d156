"""LTX-Video (comfy.ldm.lightricks.model.LTXVModel) as pipeline stage layers.

Two hosts' shapes of LTXVModel._forward. ComfyUI 0.3.75 writes it in one piece; the layers mirror
it (BaseModel._apply_model + LTXV.process_timestep + _forward). 0.33 and later split it into the
model's own steps (`_process_input`, `_prepare_timestep`, `_prepare_context`,
`_prepare_attention_mask`, `_prepare_positional_embeddings`, `_process_output`); where the host's
model has them, the layers call them in _forward's order instead. Conditioning covered:
T5 context with its attention mask (LTXV's forward requires one), the frame rate (LTXVConditioning),
the latent noise mask of image-to-video (denoise_mask: per-token timesteps) and LTXVAddGuide's
keyframe_idxs (pixel positions of the guide tokens). Refused: any other conditioning, and
`patches_replace` block replacements (the engine sets none).

The blocks run engine/patches/ltxv.py's out-of-place forward where the probe finds upstream's in
place (engine.patches.make_trainable); `layers` refuses a model that was not made trainable, whose
blocks could still run ComfyUI's in-place one, which under activation checkpointing gives silently
wrong gradients (MODEL-NOTES.md, LTXV).

Tensors passed between stages: x, context, mask, timestep, embedded, pe, xt, sigma (0.3.75), plus
prompt_timestep and grid (0.33 and later: the cross-attention AdaLN timestep, empty when the model
has none, and LTXVAddGuide's token filter as floats, empty when no guide drops tokens); 0.33's rope
is (matrix, split flag): the matrix travels, the flag is the model's own setting.
`mask` is the text attention mask as the cache holds it (integers, so DeepSpeed sends no gradient
for it); each block turns it into the additive mask exactly as _forward does once. `embedded` is
adaln_single's embedded timestep, which the head's modulation needs; xt and sigma are for ComfyUI's
calculate_denoised (xt also gives the output shape).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..config.checks import ConfigError
from ..train.objective import transformer_options
from .common import (
    BlockLayer,
    EmbedLayer,
    HeadLayer,
    additive_mask,
    apply_model_start,
    keep_in_graph,
    number,
    number_tensor,
    or_none,
    refuse_unhandled,
    require_integer_mask,
    stage_input,
)

_HANDLED = {"c_crossattn", "attention_mask", "frame_rate", "denoise_mask", "keyframe_idxs"}


def _additive(mask, dtype):
    """_forward's conversion of the integer text mask to the additive one attention takes."""
    return additive_mask(mask, dtype).reshape((mask.shape[0], 1, -1, mask.shape[-1]))


def _host_steps(dm) -> bool:
    """Whether the host's model splits _forward into its own steps (ComfyUI 0.33 and later)."""
    return all(hasattr(dm, n) for n in ("_process_input", "_prepare_timestep", "_prepare_context",
                                        "_prepare_attention_mask", "_prepare_positional_embeddings",
                                        "_process_output"))


def _embedders(dm):
    extra = [getattr(dm, "prompt_adaln_single", None), getattr(dm, "caption_projection", None)]
    return [dm.patchify_proj, dm.adaln_single, *[m for m in extra if isinstance(m, nn.Module)]]


def _start(base, inputs):
    """BaseModel._apply_model (+ LTXV.process_timestep) on the stage inputs; empty tensors stand for
    "absent". Returns (xc, t, context, mask, denoise_mask, keyframe_idxs, frame_rate)."""
    from comfy.model_base import convert_tensor

    xt, sigma, context, mask, frame_rate, denoise_mask, keyframe_idxs = inputs
    xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
    device = xc.device
    mask = convert_tensor(mask, dtype, device)
    denoise_mask, keyframe_idxs = (None if v is None else convert_tensor(v, dtype, device)
                                   for v in (or_none(denoise_mask), or_none(keyframe_idxs)))
    t = base.process_timestep(t, x=xt, denoise_mask=denoise_mask)
    frame_rate = number(frame_rate)  # a Python number in ComfyUI (CONDConstant)
    return xc, t, context, mask, denoise_mask, keyframe_idxs, frame_rate


class _Embed(EmbedLayer):
    def __init__(self, base):
        super().__init__(base, _embedders(base.diffusion_model))

    def forward(self, inputs):
        from comfy.ldm.lightricks.model import (
            latent_to_pixel_coords,
            precompute_freqs_cis,
        )
        xt, sigma, context, mask, frame_rate, denoise_mask, keyframe_idxs = inputs
        base, dm = self._refs
        xc, t, context, mask, denoise_mask, keyframe_idxs, frame_rate = _start(base, inputs)

        # LTXVModel._forward, up to the blocks
        x, latent_coords = dm.patchifier.patchify(xc)
        pixel_coords = latent_to_pixel_coords(latent_coords=latent_coords, scale_factors=dm.vae_scale_factors,
                                              causal_fix=dm.causal_temporal_positioning)
        if keyframe_idxs is not None:
            pixel_coords[:, :, -keyframe_idxs.shape[2]:] = keyframe_idxs
        fractional_coords = pixel_coords.to(torch.float32)
        fractional_coords[:, 0] = fractional_coords[:, 0] * (1.0 / frame_rate)
        x = dm.patchify_proj(x)
        t = t * 1000.0
        pe = precompute_freqs_cis(fractional_coords, dim=dm.inner_dim, out_dtype=x.dtype)
        batch = x.shape[0]
        timestep, embedded = dm.adaln_single(t.flatten(), {"resolution": None, "aspect_ratio": None},
                                             batch_size=batch, hidden_dtype=x.dtype)
        timestep = timestep.view(batch, -1, timestep.shape[-1])
        embedded = embedded.view(batch, -1, embedded.shape[-1])
        context = dm.caption_projection(context).view(batch, -1, x.shape[-1])
        return x, context, mask, timestep, embedded, pe, xt, sigma


class _StepsEmbed(EmbedLayer):
    """The embedding through the host model's own steps (0.33 and later), in _forward's order."""

    def __init__(self, base):
        super().__init__(base, _embedders(base.diffusion_model))

    def forward(self, inputs):
        xt, sigma, context, mask, frame_rate, denoise_mask, keyframe_idxs = inputs
        base, dm = self._refs
        xc, t, context, mask, denoise_mask, keyframe_idxs, frame_rate = _start(base, inputs)

        batch = xc.shape[0]
        merged = dict(transformer_options(sigma))
        x, pixel_coords, extra = dm._process_input(xc, keyframe_idxs, denoise_mask, **merged)
        merged.update(extra)
        timestep, embedded, prompt_timestep = dm._prepare_timestep(t, batch, xc.dtype, **merged)
        context, _ = dm._prepare_context(context, batch, x, None)
        pe, _split = dm._prepare_positional_embeddings(pixel_coords, frame_rate, xc.dtype)
        grid = extra.get("grid_mask")
        grid = xt.new_zeros((batch, 0)) if grid is None else grid.to(torch.float32)[None].expand(batch, -1)
        return (x, context, mask, timestep, embedded, pe, stage_input(prompt_timestep, xt), grid.contiguous(),
                xt, sigma)


class _Block(BlockLayer):
    """One transformer block; self._dm[0] is the host model where it has its own steps (0.33 and later),
    else None."""

    def steps_forward(self, inputs):
        from comfy.ldm.lightricks.model import LTXRopeType

        x, context, mask, timestep, embedded, pe, prompt_timestep, grid, xt, sigma = inputs
        dm = self._dm[0]
        split = dm.split_positional_embedding == LTXRopeType.SPLIT  # the rope's flag, as the model sets it
        # self_attention_mask: only LTXVAddGuide's attention entries make one, and first_stage_inputs refuses them
        x = self.block(x, context=context, attention_mask=dm._prepare_attention_mask(mask, x.dtype),
                       timestep=timestep, pe=(pe, split), transformer_options=transformer_options(sigma),
                       self_attention_mask=None, prompt_timestep=or_none(prompt_timestep))
        return x, context, mask, timestep, embedded, pe, prompt_timestep, grid, xt, sigma

    def forward(self, inputs):
        if self._dm[0] is not None:
            return self.steps_forward(inputs)
        x, context, mask, timestep, embedded, pe, xt, sigma = inputs
        x = self.block(x, context=context, attention_mask=_additive(mask, x.dtype), timestep=timestep, pe=pe,
                       transformer_options=transformer_options(sigma))
        return x, context, mask, timestep, embedded, pe, xt, sigma


class _Head(HeadLayer):
    owned = ("norm_out", "proj_out", "scale_shift_table")  # the table: the model's own parameter

    def forward(self, inputs):
        x, context, _mask, timestep, embedded, pe, xt, sigma = inputs  # the mask is integer: no gradient
        dm = self._dm[0]
        values = self.scale_shift_table[None, None].to(device=x.device, dtype=x.dtype) + embedded[:, :, None]
        shift, scale = values[:, :, 0], values[:, :, 1]
        x = self.norm_out(x)
        x = torch.addcmul(x, x, scale).add_(shift)
        x = self.proj_out(x)
        shape = xt.shape  # _forward's orig_shape: LTXV has no concat channels
        out = dm.patchifier.unpatchify(latents=x, output_height=shape[3], output_width=shape[4],
                                       output_num_frames=shape[2],
                                       out_channels=shape[1] // math.prod(dm.patchifier.patch_size))
        # context, timestep, pe: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), context, timestep, pe)


class _StepsHead(HeadLayer):
    owned = ("norm_out", "proj_out", "scale_shift_table")

    def forward(self, inputs):
        x, context, _mask, timestep, embedded, pe, prompt_timestep, grid, xt, sigma = inputs
        dm = self._dm[0]
        shape = list(xt.shape)  # _forward's orig_shape: LTXV has no concat channels
        extra = {"orig_shape": shape}
        keyframes = None
        if grid.numel():  # guide tokens were filtered: _process_output scatters back into the whole grid
            channels = shape[1] * math.prod(dm.patchifier.patch_size)
            extra.update(grid_mask=grid[0] > 0.5, orig_patchified_shape=[shape[0], grid.shape[1], channels])
            keyframes = grid.new_zeros((1, 1, 1))  # _process_output only asks whether there are keyframes
        out = dm._process_output(x, embedded, keyframes, **extra)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), context, timestep, pe,
                             prompt_timestep, grid)


class LTXVAdapter:
    name = "ltxv"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.lightricks.model
        import comfy.model_base

        return (type(base_model) is comfy.model_base.LTXV
                and type(base_model.diffusion_model) is comfy.ldm.lightricks.model.LTXVModel)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "LTX-Video", "text-to-video, image-to-video and keyframe guides")
        mask = kw.get("attention_mask")
        if mask is None:
            raise ConfigError("LTX-Video needs the text attention mask its text encoder makes, and this cached "
                              "dataset has none: re-cache it with the LTX-Video (T5) text encoder.")
        require_integer_mask(mask, "LTX-Video")
        xt = prepared.xt
        rate = number_tensor(kw.get("frame_rate", 25), "frame_rate (LTXVConditioning)", xt.device, optional=False)
        return (xt, prepared.sigma, kw["c_crossattn"], mask, rate, stage_input(kw.get("denoise_mask"), xt),
                stage_input(kw.get("keyframe_idxs"), xt))

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        from ..patches.trainable import is_trainable, stale_blocks

        dm = base_model.diffusion_model
        if not is_trainable(dm) or stale_blocks(dm):
            raise ConfigError("LTX-Video's blocks must be made trainable first (engine.patches.make_trainable, "
                              "before activation checkpointing wraps them): ComfyUI's in-place forward gives wrong "
                              "gradients under checkpointing.")
        if _host_steps(dm):
            return [_StepsEmbed(base_model), *[_Block(b, dm=dm) for b in dm.transformer_blocks], _StepsHead(base_model)]
        return [_Embed(base_model), *[_Block(b) for b in dm.transformer_blocks], _Head(base_model)]
