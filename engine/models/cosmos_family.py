"""What the two Cosmos adapters share: cosmos.py (Cosmos 1.0, comfy.ldm.cosmos.model.GeneralDIT) and
cosmos_predict2.py (comfy.ldm.cosmos.predict2.MiniTrainDIT). Both take the same conditioning (T5
context, the image-to-video concat channel, the frame rate), embed the timestep the same way and pass
the same tensors between stages: x, emb, context, rope, adaln_lora, extra_pos, xt, sigma, where an
empty tensor stands for an absent adaln_lora or extra_pos, and xt and sigma are for ComfyUI's
calculate_denoised.
"""
from __future__ import annotations

import torch

from .common import HeadLayer, keep_in_graph, number_tensor, or_none, refuse_unhandled, stage_input


def stage_inputs(prepared, handled, family: str, supports: str, *more: str) -> tuple[torch.Tensor, ...]:
    """The first stage's inputs: xt, sigma, context, concat channels, fps (a number), then the
    conditioning named in `more` (stage_input's stand-in where absent)."""
    kw = prepared.kwargs
    refuse_unhandled(kw, handled, family, supports)
    xt = prepared.xt
    return (xt, prepared.sigma, kw["c_crossattn"], stage_input(kw.get("c_concat"), xt),
            number_tensor(kw.get("fps"), "fps (frame_rate)", xt.device), *(stage_input(kw.get(k), xt) for k in more))


def time_embedding(dm, norm, t, dtype):
    """The models' timestep embedding: t_embedder's two parts, then the model's norm; (emb, adaln_lora),
    adaln_lora None for a model without adaLN-LoRA."""
    emb, adaln_lora = dm.t_embedder[1](dm.t_embedder[0](t).to(dtype))
    return norm(emb), adaln_lora


def empty_or(value, x) -> torch.Tensor:
    """value, or an empty tensor like x (the stand-in between stages) where it is None."""
    return x.new_zeros(0) if value is None else value


class Head(HeadLayer):
    """Base of both heads: the subclass's `network` turns the last block's x into the model's output,
    then ComfyUI's calculate_denoised."""

    def network(self, x, emb, context, adaln_lora, xt):
        raise NotImplementedError

    def forward(self, inputs):
        x, emb, context, rope, adaln_lora, extra_pos, xt, sigma = inputs
        out = self.network(x, emb, context, or_none(adaln_lora), xt)
        # context, rope, extra_pos: unused here, kept in the graph for DeepSpeed (common.keep_in_graph)
        return keep_in_graph(self.model_sampling.calculate_denoised(sigma, out.float(), xt), context, rope, extra_pos)
