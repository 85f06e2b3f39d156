"""FLUX.2 (comfy.ldm.flux.model.Flux with global modulation, base model model_base.Flux2) as pipeline
stage layers.

Mirrors BaseModel._apply_model + Flux._forward/forward_orig of ComfyUI 0.3.75 on the global-modulation
path: conditioning = the Mistral text context (Flux2.extra_conds left-pads it to 512 tokens), the
guidance value for guidance-distilled files, and reference latents (ref_latents, any
ref_latents_method; Flux.2's default is "index"). The text ids carry a 4th rope axis (the token
position). Refused: attention masks, ControlNet. The embedding up to the blocks (the same ComfyUI
functions), the reference handling, the first stage's inputs, the head and the order of the layers
are Flux.1's (engine/models/flux.py).

Unlike Flux.1, the blocks get no `vec`: three shared modulation layers turn vec once into the
shift/scale/gate rows every double block (img + txt) and every single block reads. The embedding
computes them (ComfyUI computes the single-block rows after the double blocks, from the same vec:
the same values) and they travel packed as tensors: `dmods` [B, 12, D] (img mod1, mod2, txt mod1,
mod2; shift, scale, gate each) and `smods` [B, 3, D]. The final layer reads the unmodulated vec.

Tensors passed between stages:
  double-block stages: img (target tokens, then reference tokens), txt, dmods, smods, vec, pe, xt, sigma, refs
  single-block stages: x (= cat(txt, img)), smods, vec, pe, xt, sigma, refs
`refs` is flux.py's [B, 1 + reference tokens] marker (its width locates the target tokens).
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from .common import block_options, keep_in_graph
from .flux import _Embed as _FluxEmbed
from .flux import _Head as _FluxHead
from .flux import _join, single_options, stage_inputs, stage_layers


def _pack(*mods) -> torch.Tensor:
    """ModulationOuts -> one [B, 3 * len(mods), D] tensor (the same values, rows shift, scale, gate)."""
    return torch.cat([t for m in mods for t in (m.shift, m.scale, m.gate)], dim=1)


def _unpack(packed: torch.Tensor, i: int):
    from comfy.ldm.flux.layers import ModulationOut

    return ModulationOut(*(packed[:, 3 * i + k:3 * i + k + 1] for k in range(3)))


class _Embed(_FluxEmbed):
    """Flux.1's embedding (the same Flux._forward / forward_orig), plus the shared modulation rows."""

    def __init__(self, base, join: bool):
        dm = base.diffusion_model
        super().__init__(base, join, modulation=(dm.double_stream_modulation_img, dm.double_stream_modulation_txt,
                                                 dm.single_stream_modulation))

    def forward(self, inputs):
        img, txt, vec, pe, xt, sigma, marker = self.embed(inputs)
        dm = self._refs[1]
        # forward_orig's modulation of the blocks (the single blocks' rows: see the module docstring)
        dmods = _pack(*dm.double_stream_modulation_img(vec), *dm.double_stream_modulation_txt(vec))
        smods = _pack(dm.single_stream_modulation(vec)[0])
        if self.join:
            return _join(img, txt), smods, vec, pe, xt, sigma, marker
        return img, txt, dmods, smods, vec, pe, xt, sigma, marker


class _Double(nn.Module):
    def __init__(self, block, index: int, total: int, join: bool):
        super().__init__()
        self.block = block
        self.index, self.total, self.join = index, total, join

    def forward(self, inputs):
        img, txt, dmods, smods, vec, pe, xt, sigma, refs = inputs
        mods = ((_unpack(dmods, 0), _unpack(dmods, 1)), (_unpack(dmods, 2), _unpack(dmods, 3)))
        img, txt = self.block(img=img, txt=txt, vec=mods, pe=pe, attn_mask=None,
                              transformer_options=block_options(sigma, "double", self.index, self.total))
        if self.join:  # the last double block hands the single blocks one joint sequence
            return _join(img, txt), smods, vec, pe, xt, sigma, refs
        return img, txt, dmods, smods, vec, pe, xt, sigma, refs


class _Single(nn.Module):
    def __init__(self, block, index: int, total: int, patch: int):
        super().__init__()
        self.block = block
        self.index, self.total, self.patch = index, total, patch

    def forward(self, inputs):
        x, smods, vec, pe, xt, sigma, refs = inputs
        x = self.block(x, vec=_unpack(smods, 0), pe=pe, attn_mask=None,
                       transformer_options=single_options(sigma, self.index, self.total, x, xt, refs, self.patch))
        return x, smods, vec, pe, xt, sigma, refs


class _Head(_FluxHead):
    """Flux.1's head (final layer on the unmodulated vec, unpatchify, denoise)."""

    def forward(self, inputs):
        x, smods, vec, pe, xt, sigma, refs = inputs
        # smods is unused here: kept in the graph for DeepSpeed (common.keep_in_graph).
        return keep_in_graph(super().forward((x, vec, pe, xt, sigma, refs)), smods)


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
        return stage_layers(base_model, _Embed, _Double, _Single, _Head)
