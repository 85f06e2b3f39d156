"""Chroma (comfy.ldm.chroma.model.Chroma: Flux-style blocks without per-block modulation) as pipeline
stage layers.

Mirrors BaseModel._apply_model + Chroma._forward/forward_orig of ComfyUI 0.3.75. Conditioning = T5
context and the guidance value (Chroma's extra_conds default 0). Chroma's forward ignores a pooled
vector (y) and reference latents, so they are accepted and unused here too. Refused: attention
masks, ControlNet, Chroma Radiance (its own classes, which do not match).

Unlike Flux, the blocks get no `vec`: the distilled guidance approximator turns (timestep, guidance,
row index) into `mods` [B, 344, hidden] once, and every block (and the final layer) reads its own
rows of it (Chroma.get_modulations). The embedding computes `mods` and it travels with the tokens.

Tensors passed between stages:
  double-block stages: img, txt, mods, pe, xt, sigma
  single-block stages: x (= cat(txt, img)), mods, pe, xt, sigma
The head needs xt and sigma for ComfyUI's calculate_denoised; the image tokens are the last
h_len * w_len of x, so no integer crosses a stage.
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
    patch_grid,
    patch_tokens,
    refuse_unhandled,
    require_final_layer,
    with_img_slice,
)
from .flux_family import unpatchify

# The kwargs of model.extra_conds this adapter reproduces; y and the reference latents are ones
# Chroma's own forward takes and ignores.
_HANDLED = {"c_crossattn", "guidance"}
_IGNORED = {"y", "ref_latents", "ref_latents_method"}
_MOD_ROWS = 344  # forward_orig's hard-coded mod_index_length


class _Embed(EmbedLayer):
    def __init__(self, base, join: bool):
        dm = base.diffusion_model
        super().__init__(base, [dm.img_in, dm.txt_in, dm.distilled_guidance_layer], join)  # join: no double blocks

    def forward(self, inputs):
        from comfy.ldm.flux.layers import timestep_embedding
        from comfy.model_base import convert_tensor
        from einops import rearrange, repeat

        xt, sigma, context, guidance = inputs
        base, dm = self._refs

        # BaseModel._apply_model
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        device = xc.device
        t = base.process_timestep(t, x=xt)
        guidance = convert_tensor(guidance, dtype, device)

        # Chroma._forward
        p = dm.patch_size
        bs, _, h, w = xc.shape
        x = _pad(xc, p)
        img = rearrange(x, "b c (h ph) (w pw) -> b (h w) (c ph pw)", ph=p, pw=p)
        h_len, w_len = patch_grid(h, w, p)
        img_ids = torch.zeros((h_len, w_len, 3), device=device, dtype=x.dtype)
        img_ids[:, :, 1] = img_ids[:, :, 1] + torch.linspace(0, h_len - 1, steps=h_len, device=device,
                                                             dtype=x.dtype).unsqueeze(1)
        img_ids[:, :, 2] = img_ids[:, :, 2] + torch.linspace(0, w_len - 1, steps=w_len, device=device,
                                                             dtype=x.dtype).unsqueeze(0)
        img_ids = repeat(img_ids, "h w c -> b (h w) c", b=bs)
        txt_ids = torch.zeros((bs, context.shape[1], 3), device=device, dtype=x.dtype)

        # Chroma.forward_orig, up to the blocks
        img = dm.img_in(img)
        distill_timestep = timestep_embedding(t.detach().clone(), 16).to(img.device, img.dtype)
        distil_guidance = timestep_embedding(guidance.detach().clone(), 16).to(img.device, img.dtype)
        index = timestep_embedding(torch.arange(_MOD_ROWS, device=img.device), 32).to(img.device, img.dtype)
        index = index.unsqueeze(0).repeat(img.shape[0], 1, 1).to(img.device, img.dtype)
        time_guidance = torch.cat([distill_timestep, distil_guidance], dim=1).unsqueeze(1).repeat(1, _MOD_ROWS, 1)
        time_guidance = time_guidance.to(img.dtype).to(img.device, img.dtype)
        mods = dm.distilled_guidance_layer(torch.cat([time_guidance, index], dim=-1).to(img.device, img.dtype))
        txt = dm.txt_in(context)
        pe = dm.pe_embedder(torch.cat((txt_ids, img_ids), dim=1))
        if self.join:
            return torch.cat((txt, img), 1), mods, pe, xt, sigma
        return img, txt, mods, pe, xt, sigma


def _pad(x, p: int):
    import comfy.ldm.common_dit

    return comfy.ldm.common_dit.pad_to_patch_size(x, (p, p))


class _Double(BlockLayer):  # self._dm[0]: the diffusion model, for get_modulations
    def forward(self, inputs):
        img, txt, mods, pe, xt, sigma = inputs
        dm = self._dm[0]
        vec = (dm.get_modulations(mods, "double_img", idx=self.index), dm.get_modulations(mods, "double_txt", idx=self.index))
        img, txt = self.block(img=img, txt=txt, vec=vec, pe=pe, attn_mask=None,
                              transformer_options=self.options(sigma, "double"))
        if self.join:  # the last double block hands the single blocks one joint sequence
            return torch.cat((txt, img), 1), mods, pe, xt, sigma
        return img, txt, mods, pe, xt, sigma


class _Single(BlockLayer):
    def forward(self, inputs):
        x, mods, pe, xt, sigma = inputs
        vec = self._dm[0].get_modulations(mods, "single", idx=self.index)
        options = with_img_slice(self.options(sigma, "single"), x,
                                 patch_tokens(*xt.shape[-2:], self._dm[0].patch_size))
        x = self.block(x, vec=vec, pe=pe, attn_mask=None, transformer_options=options)
        return x, mods, pe, xt, sigma


class _Head(HeadLayer):
    def forward(self, inputs):
        x, mods, pe, xt, sigma = inputs
        dm = self._dm[0]
        img = x[:, x.shape[1] - patch_tokens(*xt.shape[-2:], dm.patch_size):]  # forward_orig drops the text in front
        out = unpatchify(self.final_layer(img, vec=dm.get_modulations(mods, "final")), xt, dm.patch_size)
        # pe: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), pe)


class ChromaAdapter:
    name = "chroma"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.chroma.model
        import comfy.model_base

        # Exact classes: Chroma Radiance subclasses both and decodes pixels with its own head.
        return (type(base_model) is comfy.model_base.Chroma
                and type(base_model.diffusion_model) is comfy.ldm.chroma.model.Chroma)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        refuse_unhandled(kw, _HANDLED | _IGNORED, "Chroma", "text-to-image only",
                         {"attention_mask": "an attention mask", "c_concat": "concat channels"})
        if kw.get("guidance") is None:
            raise ConfigError("Chroma needs a guidance value in the conditioning (ComfyUI's default is 0; a "
                              "conditioning with guidance None cannot run Chroma). Re-cache the dataset without "
                              "FluxDisableGuidance, or set a guidance value.")
        return prepared.xt, prepared.sigma, kw["c_crossattn"], kw["guidance"]

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        rows = 3 * len(dm.single_blocks) + 12 * len(dm.double_blocks) + 2
        if rows > _MOD_ROWS:
            raise ConfigError(f"this Chroma model has more blocks than its {_MOD_ROWS} modulation rows cover; "
                              "ComfyUI cannot run it either. Use a standard Chroma file.")
        require_final_layer(dm, "Chroma")
        # forward_orig skips the blocks listed in skip_mmdit / skip_dit (empty unless a node sets them).
        doubles = [i for i in range(len(dm.double_blocks)) if i not in dm.skip_mmdit]
        singles = [i for i in range(len(dm.single_blocks)) if i not in dm.skip_dit]
        n_double, n_single = len(dm.double_blocks), len(dm.single_blocks)
        return [_Embed(base_model, join=not doubles),
                *[_Double(dm.double_blocks[i], i, n_double, join=i == doubles[-1], dm=dm) for i in doubles],
                *[_Single(dm.single_blocks[i], i, n_single, dm=dm) for i in singles],
                _Head(base_model)]
