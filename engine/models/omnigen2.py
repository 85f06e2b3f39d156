"""OmniGen2 (comfy.ldm.omnigen.omnigen2.OmniGen2Transformer2DModel) as pipeline stage layers.

Mirrors BaseModel._apply_model + OmniGen2Transformer2DModel.forward/flat_and_pad_to_seq/
img_patch_embed_and_refine of ComfyUI 0.3.75: the model runs on 1 - t and returns the negated
prediction. Conditioning = the text context with num_tokens (extra_conds makes it from the text
mask, so the cache must hold one) and reference latents (ReferenceLatent: any number and sizes, up
to the model's 5 image-index rows). Refused: a padded text mask (attention_mask; num_tokens shorter
than the context), which ComfyUI's forward cannot run either, and a conditioning without num_tokens.

Every refiner block is a layer of its own (each costs as much as a main block): the context
refiners carry the text tokens, the noise refiners the target's, the reference refiners the
references'. The last reference refiner (or the embedding when there are no refiners) joins them as
[text, references, target]; without reference latents the reference refiners pass through.

Tensors passed between stages:
  refiner stages: txt, img, rotary_emb, temb, xt, sigma (+ ref: the reference tokens, when any)
  main-layer stages: x (= cat(txt, ref, img)), rotary_emb, temb, xt, sigma
Each refiner's rotary slice follows from the token counts of txt, ref and img; the head takes the
last (target) tokens, whose count follows from xt's shape, so no integer crosses a stage.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config.checks import ConfigError
from ..train.objective import transformer_options
from .common import (
    BlockLayer,
    EmbedLayer,
    HeadLayer,
    apply_model_start,
    keep_in_graph,
    patches,
    refuse_unhandled,
)

_HANDLED = {"c_crossattn", "num_tokens", "ref_latents"}


def _join(txt, img, ref):
    """img_patch_embed_and_refine's [references, target], then forward's [text, images]."""
    combined = img if ref is None else torch.cat([ref, img], dim=1)
    return torch.cat([txt, combined], dim=1)


class _Embed(EmbedLayer):
    def __init__(self, base, join: bool):
        dm = base.diffusion_model
        # join: only when the model has no refiner layers
        super().__init__(base, [dm.time_caption_embed, dm.x_embedder, dm.ref_image_patch_embedder], join)
        self.image_index_embedding = dm.image_index_embedding

    def forward(self, inputs):
        import comfy.ldm.common_dit
        import comfy.model_management
        from comfy.model_base import convert_tensor

        xt, sigma, context, *refs = inputs
        base, dm = self._refs

        # BaseModel._apply_model
        xc, t, context, dtype = apply_model_start(base, sigma, xt, context)
        device = xc.device
        timesteps = base.process_timestep(t, x=xt)
        refs = [convert_tensor(r, dtype, device) for r in refs] or None

        # OmniGen2Transformer2DModel.forward, up to the refiners
        hidden = comfy.ldm.common_dit.pad_to_patch_size(xc, (dm.patch_size, dm.patch_size))
        temb, txt = dm.time_caption_embed(1.0 - timesteps, context, hidden[0].dtype)
        img, ref, _, _, ref_lens, img_lens, ref_sizes, img_sizes = dm.flat_and_pad_to_seq(hidden, refs)
        # num_tokens is the text length (first_stage_inputs checks it)
        *_, rotary_emb, _, _ = dm.rope_embedder(img.shape[0], txt.shape[1], [txt.shape[1]] * txt.shape[0],
                                                ref_lens, img_lens, ref_sizes, img_sizes, device)

        # img_patch_embed_and_refine, up to the refiners
        img = dm.x_embedder(img)
        if ref is not None:
            ref = dm.ref_image_patch_embedder(ref)
            index = comfy.model_management.cast_to(self.image_index_embedding, dtype=img.dtype, device=img.device)
            for i in range(img.shape[0]):
                shift = 0
                for j, ref_len in enumerate(ref_lens[i]):
                    ref[i, shift:shift + ref_len, :] = ref[i, shift:shift + ref_len, :] + index[j]
                    shift += ref_len
        if self.join:
            return _join(txt, img, ref), rotary_emb, temb, xt, sigma
        return (txt, img, rotary_emb, temb, xt, sigma) + (() if ref is None else (ref,))


class _Refiner(BlockLayer):
    """One block of context_refiner ("text"), noise_refiner ("target") or ref_image_refiner ("references")."""

    def __init__(self, block, stream: str, join: bool):
        super().__init__(block, join=join)
        self.stream = stream

    def forward(self, inputs):
        txt, img, rotary_emb, temb, xt, sigma, *rest = inputs
        ref = rest[0] if rest else None
        t, r = txt.shape[1], 0 if ref is None else ref.shape[1]
        options = transformer_options(sigma)
        # The rotary slices equal the per-segment tables OmniGen2RotaryPosEmbed builds (all items
        # of a batch have the same lengths, so nothing is zero-padded there).
        if self.stream == "text":  # no text mask: first_stage_inputs refuses a padded one
            txt = self.block(txt, None, rotary_emb[:, :t], transformer_options=options)
        elif self.stream == "target":
            img = self.block(img, None, rotary_emb[:, t + r:], temb, transformer_options=options)
        elif ref is not None:
            ref = self.block(ref, None, rotary_emb[:, t:t + r], temb, transformer_options=options)
        if self.join:
            return _join(txt, img, ref), rotary_emb, temb, xt, sigma
        return (txt, img, rotary_emb, temb, xt, sigma) + (() if ref is None else (ref,))


class _Layer(BlockLayer):
    def forward(self, inputs):
        x, rotary_emb, temb, xt, sigma = inputs
        x = self.block(x, None, rotary_emb, temb, transformer_options=transformer_options(sigma))
        return x, rotary_emb, temb, xt, sigma


class _Head(HeadLayer):
    owned = ("norm_out",)

    def forward(self, inputs):
        from einops import rearrange

        x, rotary_emb, temb, xt, sigma = inputs
        p = self._dm[0].patch_size
        h, w = xt.shape[-2:]
        hp, wp = patches(h, p) * p, patches(w, p) * p  # pad_to_patch_size
        x = self.norm_out(x, temb)
        out = rearrange(x[:, -(hp // p) * (wp // p):], "b (h w) (p1 p2 c) -> b c (h p1) (w p2)",
                        h=hp // p, w=wp // p, p1=p, p2=p)[:, :, :h, :w]
        # rotary_emb: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, (-out).float(), xt), rotary_emb)


class OmniGen2Adapter:
    name = "omnigen2"
    partition = "uniform"  # refiner and main blocks cost the same: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.omnigen.omnigen2
        import comfy.model_base

        return (type(base_model) is comfy.model_base.Omnigen2
                and type(base_model.diffusion_model) is comfy.ldm.omnigen.omnigen2.OmniGen2Transformer2DModel)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        context = kw["c_crossattn"]
        if "attention_mask" in kw or kw.get("num_tokens", context.shape[1]) != context.shape[1]:
            raise ConfigError("OmniGen2 needs text without padding: this dataset's cache holds a padded text mask "
                              "(attention_mask), which ComfyUI 0.3.75's OmniGen2 cannot run. Re-cache the text "
                              "unpadded (one prompt per item).")
        if "num_tokens" not in kw:
            raise ConfigError("OmniGen2 needs the text encoder's attention_mask in the cached conditioning (ComfyUI "
                              "makes num_tokens from it). Re-cache the dataset with OmniGen2's own text encoder "
                              "(Qwen2.5-VL), which stores it.")
        refuse_unhandled(kw, _HANDLED, "OmniGen2", "text and reference latents only")
        return (prepared.xt, prepared.sigma, context, *(kw.get("ref_latents") or ()))

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        refiners = ([(b, "text") for b in dm.context_refiner] + [(b, "target") for b in dm.noise_refiner]
                    + [(b, "references") for b in dm.ref_image_refiner])
        return [_Embed(base_model, join=not refiners),
                *[_Refiner(b, stream, join=i == len(refiners) - 1) for i, (b, stream) in enumerate(refiners)],
                *[_Layer(b) for b in dm.layers],
                _Head(base_model)]
