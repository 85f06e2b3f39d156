"""FLUX.2 (comfy.ldm.flux.model.Flux with global modulation, base model model_base.Flux2) as pipeline
stage layers (flux_family.py, which Flux.1 shares).

Mirrors BaseModel._apply_model + Flux._forward/forward_orig of ComfyUI 0.3.75 on the global-modulation
path: conditioning = the Mistral text context (Flux2.extra_conds left-pads it to 512 tokens), the
guidance value for guidance-distilled files, and reference latents (ref_latents, any
ref_latents_method; Flux.2's default is "index"). The text ids carry a 4th rope axis (the token
position). Refused: attention masks, ControlNet. The embedding, the reference handling, the first
stage's inputs, the blocks, the head and the order of the layers are Flux.1's; the blocks read the
shared modulation rows the embedding computes once (flux_family.py).

Tensors passed between stages:
  double-block stages: img (target tokens, then reference tokens), txt, dmods, smods, vec, pe, xt, sigma, refs
  single-block stages: x (= cat(txt, img)), smods, vec, pe, xt, sigma, refs
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from .flux_family import stage_inputs, stage_layers


class Flux2Adapter:
    name = "flux2"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.flux.model
        import comfy.model_base

        if type(base_model) is not comfy.model_base.Flux2:
            return False
        dm = base_model.diffusion_model
        return type(dm) is comfy.ldm.flux.model.Flux and bool(dm.params.global_modulation)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        return stage_inputs(prepared, "Flux.2")

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        if dm.img_in.weight.shape[1] != dm.params.in_channels * dm.patch_size ** 2:
            raise ConfigError("pipeline_stages > 1 is not available for Flux.2 models with extra input channels. "
                              "Set pipeline_stages to 1 for this model.")
        return stage_layers(base_model)
