"""One training sample's conditioning for a benchmark shape (model_shapes.py), in the latent cache's form:
random tensors of the shapes the family's text encoders and conditioning nodes give."""
from __future__ import annotations

from typing import Any

from model_shapes import Shape


def sample_cond(shape: Shape, device: str = "cpu", seed: int = 0, size: int = 1024, frames: int = 1,
                height: int = 0) -> dict[str, Any]:
    """One sample's conditioning in the cache's form: {"cross_attn": [T, D], "extras": {...}}, tensors
    without the batch dim, every key the family's extra_conds reads for plain text-to-image/video training.

    Reference latents (edit models) are raw latents of the sample's own size (size x height x frames),
    under the cache's flat keys "reference_latents.0", ... (engine/train/conditioning.py lists them again).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    extras: dict[str, Any] = dict(shape.extras)
    if shape.pooled_dim:
        extras["pooled_output"] = torch.randn(shape.pooled_dim, generator=gen).to(device)
    cross = torch.randn((shape.text_tokens, shape.text_dim), generator=gen).to(device)
    for key, dims in shape.cond_tensors.items():
        extras[key] = torch.randn(dims, generator=gen).to(device)
    for key, kind in shape.token_tensors.items():
        n = shape.text_tokens
        extras[key] = (torch.ones(n, dtype=torch.long) if kind == "ones" else torch.ones(n) if kind == "weights"
                       else torch.randint(1, int(kind.split(":")[1]), (n,), generator=gen, dtype=torch.int32)).to(device)
    if shape.audio_stream:  # the packed row's streams, as the sampler passes them (batch dim 1)
        extras["latent_shapes"] = [torch.Size((1, *s)) for s in shape.latent_streams(size, frames, height)]
    if shape.attention_mask:  # an unpadded caption: every token attended
        extras["attention_mask"] = torch.ones(shape.text_tokens, dtype=torch.long, device=device)
    for i in range(shape.reference_latents):
        extras[f"reference_latents.{i}"] = torch.randn(shape.latent(size, frames, height), generator=gen).to(device)
    if shape.first_frame:  # the keys engine/cache/first_frame.py stores, with a random start-frame latent
        latent = shape.latent(size, frames, height)
        mask = torch.ones((1, *latent[1:]))
        mask[:, :1] = 0.0  # the first latent frame is the given one
        if shape.first_frame == "clean_first_frame":
            extras["denoise_mask"] = mask.to(device)
        else:
            concat = torch.randn(latent, generator=gen)
            if shape.first_frame == "start_frame_concat":
                concat[:, 1:] = 0.0
            extras["concat_latent_image"], extras["concat_mask"] = concat.to(device), mask.to(device)
    if shape.clip_vision:
        name, tokens, width = shape.clip_vision
        extras[f"clip_vision_output.{name}"] = torch.randn((tokens, width), generator=gen).to(device)
    cond = {"cross_attn": cross, "extras": extras}
    if shape.token_tensors:  # the text encoders give these without a batch dim; the cache lists them so
        cond["unbatched"] = tuple(shape.token_tensors)
    return cond
