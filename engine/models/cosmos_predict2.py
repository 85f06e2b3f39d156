"""Cosmos-Predict2 text/image-to-image and -video (comfy.ldm.cosmos.predict2.MiniTrainDIT) as pipeline
stage layers.

Mirrors BaseModel._apply_model + CosmosPredict2.process_timestep + MiniTrainDIT._forward of ComfyUI
0.3.75: T5 context, the frame rate (fps, absent by default), the latent noise mask of image-to-video
(denoise_mask: per-frame timesteps) and the image-to-video model's concat channel (c_concat: the
inverted mask). Refused: any other conditioning (padding masks are not something ComfyUI's
conditioning sets).

Unlike _forward, the embedding does not store `affline_emb` / `crossattn_emb` on the model (ComfyUI
keeps them only for logging; they would hold the last step's graph on a stage).

Tensors passed between stages: x [B, T, H, W, D], emb, context, rope, adaln_lora, extra_pos, xt,
sigma. adaln_lora and extra_pos (the per-block absolute position embedding) are empty tensors for
models without them; xt and sigma are for ComfyUI's calculate_denoised.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import ConfigError
from ..objective import transformer_options

_HANDLED = {"c_crossattn", "c_concat", "fps", "denoise_mask"}


def number_tensor(value, name: str, device) -> torch.Tensor:
    """A Python number (a CONDConstant such as a frame rate) as a stage input: [value] in float64, which
    holds any Python float exactly; None as an empty tensor."""
    if value is None:
        return torch.zeros(0, dtype=torch.float64, device=device)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"the {name} conditioning must be a number, not {type(value).__name__}: set "
                          "pipeline_stages to 1, or cache the dataset with a plain number for it.")
    return torch.tensor([float(value)], dtype=torch.float64, device=device)


def number(t: torch.Tensor):
    """number_tensor's value back as the Python number ComfyUI passes (or None)."""
    return None if t.numel() == 0 else t.reshape(-1)[0].item()


def _or_none(t):
    return None if t.numel() == 0 else t


class _Embed(nn.Module):
    def __init__(self, base):
        super().__init__()
        dm = base.diffusion_model
        # Own only the embedders (so DeepSpeed places and counts just them on this stage); the rest
        # of the model is reached through plain references kept out of the module tree.
        embedders = [dm.x_embedder, dm.pos_embedder, dm.t_embedder, dm.t_embedding_norm]
        if dm.extra_per_block_abs_pos_emb:
            embedders.append(dm.extra_pos_embedder)
        self.embedders = nn.ModuleList(embedders)
        self.model_sampling = base.model_sampling
        self._refs = (base, dm)

    def forward(self, inputs):
        import comfy.model_management
        from comfy.model_base import convert_tensor

        xt, sigma, context, concat, fps, denoise_mask = inputs
        (base, dm), ms = self._refs, self.model_sampling

        # BaseModel._apply_model (+ CosmosPredict2.process_timestep)
        xc = ms.calculate_input(sigma, xt)
        if concat.numel():  # an empty tensor stands for "no c_concat"
            xc = torch.cat([xc, comfy.model_management.cast_to_device(concat, xc.device, xc.dtype)], dim=1)
        dtype = base.manual_cast_dtype or base.get_dtype()
        xc = xc.to(dtype)
        device = xc.device
        t = ms.timestep(sigma).float()
        context = comfy.model_management.cast_to_device(context, device, dtype)
        denoise_mask = None if denoise_mask.numel() == 0 else convert_tensor(denoise_mask, dtype, device)
        t = base.process_timestep(t, x=xt, denoise_mask=denoise_mask)

        # MiniTrainDIT._forward, up to the blocks
        x, rope, extra_pos = dm.prepare_embedded_sequence(xc, fps=number(fps), padding_mask=None)
        if t.ndim == 1:
            t = t.unsqueeze(1)
        emb, adaln_lora = dm.t_embedder[1](dm.t_embedder[0](t).to(x.dtype))
        emb = dm.t_embedding_norm(emb)
        empty = x.new_zeros(0)
        return (x, emb, context, rope.unsqueeze(1).unsqueeze(0), empty if adaln_lora is None else adaln_lora,
                empty if extra_pos is None else extra_pos, xt, sigma)


class _Block(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, inputs):
        x, emb, context, rope, adaln_lora, extra_pos, xt, sigma = inputs
        x = self.block(x, emb, context, rope_emb_L_1_1_D=rope, adaln_lora_B_T_3D=_or_none(adaln_lora),
                       extra_per_block_pos_emb=_or_none(extra_pos), transformer_options=transformer_options(sigma))
        return x, emb, context, rope, adaln_lora, extra_pos, xt, sigma


class _Head(nn.Module):
    def __init__(self, base):
        super().__init__()
        self.final_layer = base.diffusion_model.final_layer
        self.model_sampling = base.model_sampling
        self._dm = (base.diffusion_model,)  # for its unpatchify; not a submodule

    def forward(self, inputs):
        x, emb, context, rope, adaln_lora, extra_pos, xt, sigma = inputs
        out = self._dm[0].unpatchify(self.final_layer(x, emb, adaln_lora_B_T_3D=_or_none(adaln_lora)))
        denoised = self.model_sampling.calculate_denoised(sigma, out.float(), xt)
        # DeepSpeed sends a gradient back for every float tensor a stage receives; keep the ones the
        # head does not use in the graph (exactly zero contribution) so a head-only stage works.
        unused = context.sum().float() + rope.sum().float() + extra_pos.sum().float()
        return denoised + 0.0 * unused


class CosmosPredict2Adapter:
    name = "cosmos_predict2"
    partition = "uniform"  # blocks of equal work: the same number of layers per stage

    @staticmethod
    def matches(base_model) -> bool:
        import comfy.ldm.cosmos.predict2
        import comfy.model_base

        return (type(base_model) is comfy.model_base.CosmosPredict2
                and type(base_model.diffusion_model) is comfy.ldm.cosmos.predict2.MiniTrainDIT)

    @staticmethod
    def first_stage_inputs(prepared) -> tuple[torch.Tensor, ...]:
        kw = prepared.kwargs
        extra = sorted(set(kw) - _HANDLED)
        if extra:
            raise ConfigError(f"pipeline_stages > 1 for Cosmos-Predict2 supports text-to-image/video and "
                              f"image-to-video; this run also needs {', '.join(extra)}. Set pipeline_stages to 1 "
                              "for this model.")
        xt = prepared.xt
        empty = xt.new_zeros((xt.shape[0], 0))  # a stage's inputs are a fixed tuple of tensors (no None)
        concat, denoise_mask = kw.get("c_concat"), kw.get("denoise_mask")
        return (xt, prepared.sigma, kw["c_crossattn"], empty if concat is None else concat,
                number_tensor(kw.get("fps"), "fps (frame_rate)", xt.device),
                empty if denoise_mask is None else denoise_mask)

    @staticmethod
    def layers(base_model) -> list[nn.Module]:
        dm = base_model.diffusion_model
        return [_Embed(base_model), *[_Block(b) for b in dm.blocks], _Head(base_model)]
