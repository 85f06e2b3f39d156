"""Lumina Image 2.0 and Z-Image (both comfy.ldm.lumina.model.NextDiT under model_base.Lumina2) as
pipeline stage layers.

Mirrors BaseModel._apply_model + NextDiT._forward/patchify_and_embed/unpatchify of ComfyUI 0.3.75:
the model runs on 1 - t and returns the negated prediction; Z-Image additionally pads the text and
image tokens to a multiple of pad_tokens_multiple with its learned pad tokens. Conditioning = the text
context (num_tokens, which NextDiT takes and ignores, is accepted). Refused: a padded text mask
(attention_mask, stored only when the prompt has padding): ComfyUI hands it to attention as integers,
which GPU attention rejects (and Z-Image's padding mis-sizes), so set pipeline_stages to 1 or cache
the text unpadded.

The refiners are layers of their own (each costs as much as a main block): the context refiners
carry the text tokens, the noise refiners the image tokens, and the last refiner (or the embedding
when there are none) joins them, text first, as patchify_and_embed does.

Tensors passed between stages:
  refiner stages: cap (text tokens), x (image tokens), freqs_cis, adaln, xt, sigma
  main-layer stages: x (= cat(cap, x)), freqs_cis, adaln, xt, sigma
The head needs xt and sigma for ComfyUI's calculate_denoised; the text length is the joint length
minus the (padded) image token count, which follows from xt's shape, so no integer crosses a stage.
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

_HANDLED = {"c_crossattn", "num_tokens"}


def _image_tokens(dm, h: int, w: int) -> tuple[int, int, int, int]:
    """(tokens, padded tokens, padded height, padded width) of an h x w latent: pad_to_patch_size,
    then Z-Image's padding to pad_tokens_multiple."""
    p = dm.patch_size
    hp, wp = patches(h, p) * p, patches(w, p) * p
    tokens = (hp // p) * (wp // p)
    padded = tokens if dm.pad_tokens_multiple is None else tokens + (-tokens) % dm.pad_tokens_multiple
    return tokens, padded, hp, wp


class _Embed(EmbedLayer):
    def __init__(self, base, join: bool):
        dm = base.diffusion_model
        super().__init__(base, [dm.t_embedder, dm.cap_embedder, dm.x_embedder], join)  # join: no refiner layers
        if dm.pad_tokens_multiple is not None:
            self.x_pad_token, self.cap_pad_token = dm.x_pad_token, dm.cap_pad_token

    def forward(self, inputs):
        import comfy.ldm.common_dit

        xt, sigma, context = inputs
        base, dm = self._refs

        # BaseModel._apply_model
        xc, t, context, _ = apply_model_start(base, sigma, xt, context)
        device = xc.device
        timesteps = base.process_timestep(t, x=xt)

        # NextDiT._forward, up to patchify_and_embed
        x = comfy.ldm.common_dit.pad_to_patch_size(xc, (dm.patch_size, dm.patch_size))
        adaln = dm.t_embedder((1.0 - timesteps) * dm.time_scale, dtype=x.dtype)
        cap = dm.cap_embedder(context)

        # NextDiT.patchify_and_embed, up to the refiners
        bsz, p = x.shape[0], dm.patch_size
        if dm.pad_tokens_multiple is not None:
            pad_extra = (-cap.shape[1]) % dm.pad_tokens_multiple
            cap = torch.cat((cap, self.cap_pad_token.to(device=cap.device, dtype=cap.dtype, copy=True)
                             .unsqueeze(0).repeat(cap.shape[0], pad_extra, 1)), dim=1)
        cap_pos_ids = torch.zeros(bsz, cap.shape[1], 3, dtype=torch.float32, device=device)
        cap_pos_ids[:, :, 0] = torch.arange(cap.shape[1], dtype=torch.float32, device=device) + 1.0

        B, C, H, W = x.shape
        x = dm.x_embedder(x.view(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1).flatten(3).flatten(1, 2))
        rope = transformer_options(sigma).get("rope_options", None) or {}  # the engine sets none
        h_scale, w_scale = rope.get("scale_y", 1.0), rope.get("scale_x", 1.0)
        h_start, w_start = rope.get("shift_y", 0.0), rope.get("shift_x", 0.0)
        h_tokens, w_tokens = H // p, W // p
        x_pos_ids = torch.zeros((bsz, x.shape[1], 3), dtype=torch.float32, device=device)
        x_pos_ids[:, :, 0] = cap.shape[1] + 1
        x_pos_ids[:, :, 1] = (torch.arange(h_tokens, dtype=torch.float32, device=device) * h_scale
                              + h_start).view(-1, 1).repeat(1, w_tokens).flatten()
        x_pos_ids[:, :, 2] = (torch.arange(w_tokens, dtype=torch.float32, device=device) * w_scale
                              + w_start).view(1, -1).repeat(h_tokens, 1).flatten()
        if dm.pad_tokens_multiple is not None:
            pad_extra = (-x.shape[1]) % dm.pad_tokens_multiple
            x = torch.cat((x, self.x_pad_token.to(device=x.device, dtype=x.dtype, copy=True)
                           .unsqueeze(0).repeat(x.shape[0], pad_extra, 1)), dim=1)
            x_pos_ids = torch.nn.functional.pad(x_pos_ids, (0, 0, 0, pad_extra))
        # _forward moves freqs_cis to x's device after patchify_and_embed; the refiners use it before.
        freqs_cis = dm.rope_embedder(torch.cat((cap_pos_ids, x_pos_ids), dim=1)).movedim(1, 2)
        if self.join:
            return torch.cat((cap, x), dim=1), freqs_cis.to(x.device), adaln, xt, sigma
        return cap, x, freqs_cis, adaln, xt, sigma


class _ContextRefiner(BlockLayer):
    def forward(self, inputs):
        cap, x, freqs_cis, adaln, xt, sigma = inputs
        # The text mask is None here: first_stage_inputs refuses a padded one.
        cap = self.block(cap, None, freqs_cis[:, :cap.shape[1]], transformer_options=transformer_options(sigma))
        if self.join:
            return torch.cat((cap, x), dim=1), freqs_cis.to(x.device), adaln, xt, sigma
        return cap, x, freqs_cis, adaln, xt, sigma


class _NoiseRefiner(BlockLayer):
    def forward(self, inputs):
        cap, x, freqs_cis, adaln, xt, sigma = inputs
        x = self.block(x, None, freqs_cis[:, cap.shape[1]:], adaln, transformer_options=transformer_options(sigma))
        if self.join:  # patchify_and_embed's padded_full_embed: text first
            return torch.cat((cap, x), dim=1), freqs_cis.to(x.device), adaln, xt, sigma
        return cap, x, freqs_cis, adaln, xt, sigma


class _Layer(BlockLayer):
    def forward(self, inputs):
        x, freqs_cis, adaln, xt, sigma = inputs
        # ComfyUI 0.33+ writes the block keys before each main layer (0.3.75's layers never read them)
        x = self.block(x, None, freqs_cis, adaln, transformer_options=self.options(sigma, "double"))
        return x, freqs_cis, adaln, xt, sigma


class _Head(HeadLayer):
    def forward(self, inputs):
        x, freqs_cis, adaln, xt, sigma = inputs
        dm = self._dm[0]
        h, w = xt.shape[-2:]
        _, padded, hp, wp = _image_tokens(dm, h, w)
        cap_len = x.shape[1] - padded
        x = dm.final_layer(x, adaln)
        out = dm.unpatchify(x, [(hp, wp)] * x.shape[0], [cap_len] * x.shape[0], return_tensor=True)[:, :, :h, :w]
        # freqs_cis: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, (-out).float(), xt), freqs_cis)


class LuminaAdapter:
    name = "lumina2"  # Lumina Image 2.0 and Z-Image
    partition = "uniform"  # refiner and main blocks cost the same: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.lumina.model
        import comfy.model_base

        return (type(base_model) is comfy.model_base.Lumina2
                and type(base_model.diffusion_model) is comfy.ldm.lumina.model.NextDiT)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        if "attention_mask" in kw:
            raise ConfigError("pipeline_stages > 1 for Lumina 2 / Z-Image needs text without padding; this dataset's "
                              "cache holds a padded text mask (attention_mask), which ComfyUI 0.3.75 passes to "
                              "attention as integers (an error on GPU). Re-cache the text unpadded (one prompt per "
                              "item), or set pipeline_stages to 1 for this model.")
        refuse_unhandled(kw, _HANDLED, "Lumina 2 / Z-Image", "text-to-image only")
        return prepared.xt, prepared.sigma, kw["c_crossattn"]

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        # Parts ComfyUI 0.33+ added to NextDiT for other releases (pooled CLIP text, SigLIP image tokens):
        # their embeddings are not mirrored here.
        extra = [n for n in ("clip_text_pooled_proj", "siglip_embedder") if getattr(dm, n, None) is not None]
        if extra:
            from ..patches.host import comfy_version

            raise ConfigError(f"pipeline_stages > 1 for Lumina 2 / Z-Image does not reproduce this model's "
                              f"{', '.join(extra)} (ComfyUI {comfy_version()}). Set pipeline_stages to 1 for this "
                              "model.")
        contexts, noises = list(dm.context_refiner), list(dm.noise_refiner)
        return [_Embed(base_model, join=not contexts and not noises),
                *[_ContextRefiner(b, join=not noises and i == len(contexts) - 1) for i, b in enumerate(contexts)],
                *[_NoiseRefiner(b, join=i == len(noises) - 1) for i, b in enumerate(noises)],
                *[_Layer(b, i, len(dm.layers)) for i, b in enumerate(dm.layers)],
                _Head(base_model)]
