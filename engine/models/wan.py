"""Wan 2.1 / 2.2 text-to-video (comfy.ldm.wan.model.WanModel) as pipeline stage layers.

Mirrors BaseModel._apply_model + WanModel._forward/forward_orig of ComfyUI 0.3.75 for the t2v path
(conditioning = text only); i2v, VACE and reference latents are refused until they are added here.
Tensors passed between stages: x, e, e0, context, freqs (the block inputs) plus xt and sigma,
which the head needs for ComfyUI's calculate_denoised.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import ConfigError


class _Embed(nn.Module):
    def __init__(self, base):
        super().__init__()
        dm = base.diffusion_model
        # Own only the embedders (so DeepSpeed places and counts just them on this stage); the rest
        # of the model is reached through plain references kept out of the module tree.
        self.embedders = nn.ModuleList([dm.patch_embedding, dm.time_embedding, dm.time_projection,
                                        dm.text_embedding])
        self.model_sampling = base.model_sampling
        self._refs = (base, dm)

    def forward(self, inputs):
        import comfy.ldm.common_dit
        from comfy.ldm.wan.model import sinusoidal_embedding_1d

        xt, sigma, context = inputs
        (base, dm), ms = self._refs, self.model_sampling
        dtype = base.manual_cast_dtype or base.get_dtype()
        xc = ms.calculate_input(sigma, xt).to(dtype)
        t = base.process_timestep(ms.timestep(sigma).float(), x=xt)
        context = context.to(dtype)
        frames, h, w = xc.shape[2:]
        x = comfy.ldm.common_dit.pad_to_patch_size(xc, dm.patch_size)
        freqs = dm.rope_encode(frames, h, w, device=x.device, dtype=x.dtype)
        x = dm.patch_embedding(x.float()).to(x.dtype).flatten(2).transpose(1, 2)
        e = dm.time_embedding(sinusoidal_embedding_1d(dm.freq_dim, t.flatten()).to(dtype=x[0].dtype))
        e = e.reshape(t.shape[0], -1, e.shape[-1])
        e0 = dm.time_projection(e).unflatten(2, (6, dm.dim))
        context = dm.text_embedding(context)
        return x, e, e0, context, freqs, xt, sigma


class _Block(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, inputs):
        x, e, e0, context, freqs, xt, sigma = inputs
        x = self.block(x, e=e0, freqs=freqs, context=context, context_img_len=None, transformer_options={})
        return x, e, e0, context, freqs, xt, sigma


class _Head(nn.Module):
    def __init__(self, base):
        super().__init__()
        self.head = base.diffusion_model.head
        self.model_sampling = base.model_sampling
        self._dm = (base.diffusion_model,)  # for its unpatchify and sizes; not a submodule

    def forward(self, inputs):
        x, e, e0, context, freqs, xt, sigma = inputs
        dm = self._dm[0]
        frames, h, w = xt.shape[2:]
        grid = [(frames + dm.patch_size[0] - 1) // dm.patch_size[0], (h + dm.patch_size[1] - 1) // dm.patch_size[1],
                (w + dm.patch_size[2] - 1) // dm.patch_size[2]]
        out = dm.unpatchify(self.head(x, e), grid)[:, :, :frames, :h, :w]
        denoised = self.model_sampling.calculate_denoised(sigma, out.float(), xt)
        # DeepSpeed sends a gradient back for every float tensor a stage receives; keep the ones the
        # head does not use in the graph (exactly zero contribution) so a head-only stage works.
        unused = e0.sum() + context.sum() + freqs.sum()
        return denoised + 0.0 * unused.float()


class WanAdapter:
    name = "wan"

    @staticmethod
    def matches(base_model) -> bool:
        from comfy.ldm.wan.model import WanModel

        return type(base_model.diffusion_model) is WanModel

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        extra = sorted(set(prepared.kwargs) - {"c_crossattn"})
        if extra:
            raise ConfigError(f"pipeline_stages > 1 for Wan supports text-to-video only; this model also needs "
                              f"{', '.join(extra)}. Set pipeline_stages to 1 for this model.")
        return prepared.xt, prepared.sigma, prepared.kwargs["c_crossattn"]

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        return [_Embed(base_model), *[_Block(b) for b in dm.blocks], _Head(base_model)]
