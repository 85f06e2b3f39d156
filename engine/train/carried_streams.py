"""Packed latents whose sampler carries a stream at another scale: MiniMax H3's audio (ComfyUI 0.33+).

ComfyUI's sampler integrates one flow variable for the whole packed row. MiniMax H3's audio stream runs on
its own shifted schedule, so the sampler carries it multiplied by `audio_scale` (shift / audio shift:
ModelSamplingAV), and the model takes it back to the stream's own scale around its network
(MiniMaxH3Model.forward). The objective gives the model the same carried row the sampler does (it sets
model.latent_shapes, engine/train/objective.py), so the network sees the audio noised on its own schedule.

The loss is the flow-matching error of each stream on its own schedule, every element weighted alike (as
diffusion-pipe trains H3): the carried audio's denoised error is `audio_scale` times the stream's own, and
its own velocity error divides that by the stream's sigma, sigma_a = sigma / (s - (s - 1) * sigma) for the
video's sigma and s = audio_scale (the two shifted schedules of one time). So the audio part of the loss's
`scale` (the video's -sigma) becomes -s * sigma_a. tests/with_comfy/test_minimax_audio.py checks both
against the network's own inputs and outputs.
"""
from __future__ import annotations

import math

import torch


def carried_scale(model, sigma: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The loss's per-element `scale` ([B, ...] like the packed x0) with a carried stream's part turned into its
    own-schedule velocity's; `scale` itself for any other model or latent."""
    shapes = getattr(model, "latent_shapes", None)
    audio_scale = getattr(model, "audio_scale", None)
    if not shapes or len(shapes) < 2 or not callable(audio_scale):
        return scale
    s = float(audio_scale())
    if s == 1.0:
        return scale
    video = math.prod(int(n) for n in shapes[0][1:])
    sig = sigma.to(scale.dtype).view(-1, *(1,) * (scale.ndim - 1))
    out = scale.clone()
    out[..., video:] = scale[..., video:] * (s / (s - (s - 1.0) * sig))
    return out
