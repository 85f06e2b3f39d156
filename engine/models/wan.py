"""Wan 2.1 / 2.2 text-to-video and image-to-video (comfy.ldm.wan.model.WanModel) as pipeline stage layers.

Mirrors BaseModel._apply_model + WanModel._forward/forward_orig of ComfyUI 0.3.75: text context,
and for i2v models the concat channels (c_concat: mask + image latents, which _apply_model puts in
front of the patch embedding) and the CLIP vision tokens (clip_fea -> img_emb, Wan 2.1 i2v); Wan 2.2
TI2V's denoise_mask (a clean start frame: WAN22.process_timestep turns it into one timestep per
frame, and the embedding's per-frame e/e0 follow forward_orig).
VACE, camera, reference latents and other variants are refused until they are added here.
Tensors passed between stages: x, e, e0, [context_img,] context, freqs (the block inputs) plus xt
and sigma, which the head needs for ComfyUI's calculate_denoised. context_img (models with img_emb)
travels apart from the text context so each block knows its length (ComfyUI's context_img_len)
without an integer crossing a stage; the block joins them as forward_orig does.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from .common import (
    BlockLayer,
    EmbedLayer,
    HeadLayer,
    apply_model_start,
    keep_in_graph,
    or_none,
    patches,
    refuse_unhandled,
    stage_input,
)

_HANDLED = {"c_crossattn", "c_concat", "clip_fea", "denoise_mask"}


class _Embed(EmbedLayer):
    def __init__(self, base):
        dm = base.diffusion_model
        embedders = [dm.patch_embedding, dm.time_embedding, dm.time_projection, dm.text_embedding]
        clip = dm.img_emb is not None
        super().__init__(base, embedders + ([dm.img_emb] if clip else []))
        self.clip = clip

    def forward(self, inputs):
        import comfy.ldm.common_dit
        from comfy.ldm.wan.model import sinusoidal_embedding_1d
        from comfy.model_base import convert_tensor

        xt, sigma, context, concat, clip_fea, mask = inputs
        base, dm = self._refs
        # BaseModel._apply_model (+ WAN22.process_timestep); empty tensors stand for "absent"
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context, or_none(concat))
        t = base.process_timestep(t, x=xt, denoise_mask=or_none(mask))

        # WanModel._forward and forward_orig, up to the blocks
        frames, h, w = xc.shape[2:]
        x = comfy.ldm.common_dit.pad_to_patch_size(xc, dm.patch_size)
        freqs = dm.rope_encode(frames, h, w, device=x.device, dtype=x.dtype)
        x = dm.patch_embedding(x.float()).to(x.dtype).flatten(2).transpose(1, 2)
        e = dm.time_embedding(sinusoidal_embedding_1d(dm.freq_dim, t.flatten()).to(dtype=x[0].dtype))
        e = e.reshape(t.shape[0], -1, e.shape[-1])
        e0 = dm.time_projection(e).unflatten(2, (6, dm.dim))
        context = dm.text_embedding(context)
        if self.clip != bool(clip_fea.numel()):
            raise ConfigError(
                "this Wan image-to-video model takes CLIP vision tokens, but the cached dataset has no "
                "clip_vision_output: re-cache it with one (WanImageToVideo's clip_vision_output input) or set "
                "pipeline_stages to 1." if self.clip else
                "the cached dataset has CLIP vision tokens (clip_vision_output) but this Wan model has no image "
                "embedder to take them: re-cache without them or set pipeline_stages to 1.")
        if self.clip:
            return x, e, e0, dm.img_emb(convert_tensor(clip_fea, dtype, x.device)), context, freqs, xt, sigma
        return x, e, e0, context, freqs, xt, sigma


def _grid(dm, xt) -> tuple[int, int, int]:
    """The patch grid (frames, height, width) of the padded latent: forward_orig's grid_sizes."""
    return tuple(patches(n, p) for n, p in zip(xt.shape[2:], dm.patch_size))


class _Block(BlockLayer):
    def grid_options(self, sigma, xt) -> dict:
        """What forward_orig of ComfyUI 0.33+ hands each block (0.3.75 hands none; its blocks then read
        only patches, which neither sets)."""
        return {**self.options(sigma, "double"), "grid_sizes": _grid(self._dm[0], xt)}

    def forward(self, inputs):
        if len(inputs) == 8:  # with CLIP vision tokens
            x, e, e0, context_img, context, freqs, xt, sigma = inputs
            x = self.block(x, e=e0, freqs=freqs, context=torch.cat([context_img, context], dim=1),
                           context_img_len=context_img.shape[1], transformer_options=self.grid_options(sigma, xt))
            return x, e, e0, context_img, context, freqs, xt, sigma
        x, e, e0, context, freqs, xt, sigma = inputs
        x = self.block(x, e=e0, freqs=freqs, context=context, context_img_len=None,
                       transformer_options=self.grid_options(sigma, xt))
        return x, e, e0, context, freqs, xt, sigma


class _Head(HeadLayer):
    owned = ("head",)

    def forward(self, inputs):
        x, e, e0, *contexts, freqs, xt, sigma = inputs
        dm = self._dm[0]
        frames, h, w = xt.shape[2:]
        grid = list(_grid(dm, xt))
        out = dm.unpatchify(self.head(x, e), grid)[:, :, :frames, :h, :w]
        # e0, the contexts and freqs: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), e0, *contexts, freqs)


class WanAdapter:
    name = "wan"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        from comfy.ldm.wan.model import WanModel

        return type(base_model.diffusion_model) is WanModel

    def first_stage_inputs(self, prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED, "Wan", "text-to-video and image-to-video")
        xt = prepared.xt
        return (xt, prepared.sigma, kw["c_crossattn"],
                *(stage_input(kw.get(k), xt) for k in ("c_concat", "clip_fea", "denoise_mask")))

    def layers(self, base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        for part in ("vace_blocks", "ref_conv", "control_adapter"):
            if getattr(dm, part, None) is not None:
                raise ConfigError(f"pipeline_stages > 1 is not available for this Wan variant ({part}): set "
                                  "pipeline_stages to 1 for this model.")
        total = len(dm.blocks)
        return [_Embed(base_model), *[_Block(b, i, total, dm=dm) for i, b in enumerate(dm.blocks)],
                _Head(base_model)]
