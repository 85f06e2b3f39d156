"""Flux.1 text-to-image (comfy.ldm.flux.model.Flux: dev, schnell and other plain Flux.1 files) as
pipeline stage layers (flux_family.py, which FLUX.2 shares).

Mirrors BaseModel._apply_model + Flux._forward/forward_orig of ComfyUI 0.3.75 for the t2i path, and
what 0.33 added where the host's model has it (flux_family.py). Its reference method
"index_timestep_zero" (a second, zero timestep for the reference tokens) is refused. Covered:
conditioning = T5 context, pooled CLIP vector (y) and, for guidance-distilled files, the guidance
value, and Kontext reference latents (ref_latents, any ref_latents_method). Refused until they are
added here: Fill/inpaint concat channels, attention masks, ControlNet, and the other families built
on the Flux blocks (Chroma, Flux.2, HunyuanVideo), which have their own base-model classes and do
not match.

Tensors passed between stages:
  double-block stages: img (target tokens, then reference tokens), txt, vec, pe, xt, sigma, refs
  single-block stages: x (= cat(txt, img)), vec, pe, xt, sigma, refs
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from .flux_family import stage_inputs, stage_layers


class FluxAdapter:
    name = "flux"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.flux.model
        import comfy.model_base

        # Exact classes: Chroma and Flux.2 subclass model_base.Flux but feed the blocks differently.
        if type(base_model) is not comfy.model_base.Flux:
            return False
        dm = base_model.diffusion_model
        return type(dm) is comfy.ldm.flux.model.Flux and not dm.params.global_modulation

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        return stage_inputs(prepared, "Flux")

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        if dm.img_in.weight.shape[1] != dm.params.in_channels * dm.patch_size ** 2 or \
                dm.params.in_channels > dm.params.out_channels:
            raise ConfigError("pipeline_stages > 1 is not available for Flux Fill / inpaint / control-LoRA models "
                              "(extra input channels). Set pipeline_stages to 1 for this model.")
        return stage_layers(base_model)
