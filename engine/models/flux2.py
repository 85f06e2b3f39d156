"""FLUX.2 (comfy.ldm.flux.model.Flux with global modulation, base model model_base.Flux2) as pipeline
stage layers.

Mirrors BaseModel._apply_model + Flux._forward/forward_orig of ComfyUI 0.3.75 on the global-modulation
path: conditioning = the Mistral text context (Flux2.extra_conds left-pads it to 512 tokens), the
guidance value for guidance-distilled files, and reference latents (ref_latents, any
ref_latents_method; Flux.2's default is "index"). The text ids carry a 4th rope axis (the token
position). Refused: attention masks, ControlNet. The reference handling, the first stage's inputs
and the head are Flux.1's (engine/models/flux.py).

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

from ..config import ConfigError
from ..objective import transformer_options
from .flux import _add_references, _join, _ref_method, stage_inputs
from .flux import _Head as _FluxHead


def _options(sigma, block_type: str, index: int, total: int) -> dict:
    # The engine's transformer_options plus the keys forward_orig writes before each block; a fresh
    # dict per call (models write into it).
    return {**transformer_options(sigma), "block_type": block_type, "block_index": index, "total_blocks": total}


def _pack(*mods) -> torch.Tensor:
    """ModulationOuts -> one [B, 3 * len(mods), D] tensor (the same values, rows shift, scale, gate)."""
    return torch.cat([t for m in mods for t in (m.shift, m.scale, m.gate)], dim=1)


def _unpack(packed: torch.Tensor, i: int):
    from comfy.ldm.flux.layers import ModulationOut

    return ModulationOut(*(packed[:, 3 * i + k:3 * i + k + 1] for k in range(3)))


class _Embed(nn.Module):
    def __init__(self, base, join: bool):
        super().__init__()
        dm = base.diffusion_model
        # Own only the embedders and the shared modulation layers; the rest of the model is reached
        # through plain references kept out of the module tree.
        embedders = [dm.img_in, dm.time_in, dm.txt_in, dm.double_stream_modulation_img,
                     dm.double_stream_modulation_txt, dm.single_stream_modulation]
        if dm.params.guidance_embed:
            embedders.append(dm.guidance_in)
        if dm.vector_in is not None:
            embedders.append(dm.vector_in)
        self.embedders = nn.ModuleList(embedders)
        self.model_sampling = base.model_sampling
        self._refs = (base, dm)
        self.join = join  # only when the model has no double blocks

    def forward(self, inputs):
        from comfy.ldm.flux.layers import timestep_embedding
        from comfy.model_base import convert_tensor

        xt, sigma, context, y, guidance, method, *refs = inputs
        (base, dm), ms = self._refs, self.model_sampling
        y = None if y.numel() == 0 else y
        guidance = None if guidance.numel() == 0 else guidance

        # BaseModel._apply_model
        dtype = base.manual_cast_dtype or base.get_dtype()
        xc = ms.calculate_input(sigma, xt).to(dtype)
        device = xc.device
        t = base.process_timestep(ms.timestep(sigma).float(), x=xt)
        context = convert_tensor(context, dtype, device)
        y = None if y is None else convert_tensor(y, dtype, device)
        guidance = None if guidance is None else convert_tensor(guidance, dtype, device)

        # Flux._forward
        img, img_ids = dm.process_img(xc, transformer_options={})
        img, img_ids, ref_tokens = _add_references(dm, img, img_ids, xc, [convert_tensor(r, dtype, device) for r in refs],
                                                   _ref_method(dm, int(method.reshape(-1)[0])))
        txt_ids = torch.zeros((xc.shape[0], context.shape[1], len(dm.params.axes_dim)), device=device,
                              dtype=torch.float32)
        if len(dm.params.axes_dim) == 4:  # Flux 2: the text position on the 4th axis
            txt_ids[:, :, 3] = torch.linspace(0, context.shape[1] - 1, steps=context.shape[1], device=device,
                                              dtype=torch.float32)

        # Flux.forward_orig, up to the blocks (and the single blocks' modulation)
        img = dm.img_in(img)
        vec = dm.time_in(timestep_embedding(t, 256).to(img.dtype))
        if dm.params.guidance_embed and guidance is not None:
            vec = vec + dm.guidance_in(timestep_embedding(guidance, 256).to(img.dtype))
        if dm.vector_in is not None:
            if y is None:
                y = torch.zeros((img.shape[0], dm.params.vec_in_dim), device=img.device, dtype=img.dtype)
            vec = vec + dm.vector_in(y[:, :dm.params.vec_in_dim])
        txt = dm.txt_in(context)
        dmods = _pack(*dm.double_stream_modulation_img(vec), *dm.double_stream_modulation_txt(vec))
        smods = _pack(dm.single_stream_modulation(vec)[0])
        pe = dm.pe_embedder(torch.cat((txt_ids, img_ids), dim=1))
        marker = torch.zeros((xt.shape[0], 1 + ref_tokens), device=device, dtype=torch.float32)
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
                              transformer_options=_options(sigma, "double", self.index, self.total))
        if self.join:  # the last double block hands the single blocks one joint sequence
            return _join(img, txt), smods, vec, pe, xt, sigma, refs
        return img, txt, dmods, smods, vec, pe, xt, sigma, refs


class _Single(nn.Module):
    def __init__(self, block, index: int, total: int):
        super().__init__()
        self.block = block
        self.index, self.total = index, total

    def forward(self, inputs):
        x, smods, vec, pe, xt, sigma, refs = inputs
        x = self.block(x, vec=_unpack(smods, 0), pe=pe, attn_mask=None,
                       transformer_options=_options(sigma, "single", self.index, self.total))
        return x, smods, vec, pe, xt, sigma, refs


class _Head(_FluxHead):
    """Flux.1's head (final layer on the unmodulated vec, unpatchify, denoise)."""

    def forward(self, inputs):
        x, smods, vec, pe, xt, sigma, refs = inputs
        # smods is unused here: keep it in the graph (exactly zero contribution) for DeepSpeed.
        return super().forward((x, vec, pe, xt, sigma, refs)) + 0.0 * smods.sum().float()


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
        doubles, singles = len(dm.double_blocks), len(dm.single_blocks)
        return [_Embed(base_model, join=doubles == 0),
                *[_Double(b, i, doubles, join=i == doubles - 1) for i, b in enumerate(dm.double_blocks)],
                *[_Single(b, i, singles) for i, b in enumerate(dm.single_blocks)],
                _Head(base_model)]
