"""target_fps "auto": the frame rate of the video model whose VAE CacheLatents is given; and the clip
lengths that VAE can encode (`check_clip_lengths`: 4k+1 for Wan/HunyuanVideo, 8k+1 for LTXV).

LoadDataset does not know the model; CacheLatents (and the engine's cache mode) does, through the
graph's VAE, which ComfyUI builds per family (comfy/sd.py). The VAE's class says the family, and
the family its training rate. Only VAEs that name one family are listed; for any other VAE (light
TAEs, which ComfyUI shares between Wan 2.1 and HunyuanVideo and tells apart only by the file's
dtype; Cosmos 1.0's tokenizer; CogVideoX; a VAE this table does not know yet) "auto" keeps the
source frames and says so, with the fix: set target_fps.

Nothing here imports comfy: classes are recognised by their module and name.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..data.frame_buckets import frame_rule_problem
from ..data.frame_rates import AUTO, fps_text
from ..data.messages import DatasetError
from ..data.scan import DatasetSpec

# (family, frames per second it was trained at, "module.Class" of ComfyUI's first_stage_model, and for
# ComfyUI's generic autoencoders the class of their encoder). First match wins.
VAE_FAMILIES: tuple[tuple[str, float, str, str], ...] = (
    ("Wan 2.1 / Wan 2.2 14B", 16.0, "comfy.ldm.wan.vae.WanVAE", ""),  # also Cosmos-Predict2's VAE: 16 fps too
    ("Wan 2.2 5B", 24.0, "comfy.ldm.wan.vae2_2.WanVAE", ""),
    ("LTX-Video", 25.0, "comfy.ldm.lightricks.vae.causal_video_autoencoder.VideoVAE", ""),  # LTXVConditioning's 25
    ("Mochi", 30.0, "comfy.ldm.genmo.vae.model.VideoVAE", ""),
    ("HunyuanVideo 1.5", 24.0, "comfy.ldm.models.autoencoder.AutoencodingEngine",
     "comfy.ldm.hunyuan_video.vae_refiner.Encoder"),
    ("HunyuanVideo", 24.0, "comfy.ldm.models.autoencoder.AutoencoderKL",  # ComfyUI's SD VAE class, in 3D
     "comfy.ldm.modules.diffusionmodules.model.Encoder"),
)


def _class_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}" if obj is not None else ""


def vae_family(vae: Any) -> tuple[str, float] | None:
    """(family, fps) of a ComfyUI VAE, or None when its class names no one video family."""
    model = getattr(vae, "first_stage_model", None)
    if getattr(vae, "latent_dim", 2) != 3 or getattr(vae, "not_video", False):  # an image VAE (or HunyuanImage's)
        return None
    name, encoder = _class_name(model), _class_name(getattr(model, "encoder", None))
    for family, fps, model_class, encoder_class in VAE_FAMILIES:
        if name == model_class and (not encoder_class or encoder == encoder_class):
            return family, fps
    return None


def vae_label(vae: Any) -> str:
    model = getattr(vae, "first_stage_model", None)
    return type(model).__name__ if model is not None else type(vae).__name__


def resolve_target_fps(dataset: DatasetSpec, vae: Any, info: Callable[[str], None],
                       warn: Callable[[str], None]) -> DatasetSpec:
    """The dataset with target_fps "auto" replaced by the VAE family's rate (or 0, source frames, with a
    warning, when the VAE names no family). Other values, and datasets without videos, are returned as
    they are."""
    if dataset.target_fps != AUTO:
        return dataset
    if not dataset.clip_lengths:
        return dataclasses.replace(dataset, target_fps=0.0)
    found = vae_family(vae)
    if found is None:
        warn(f"target_fps is auto, but the VAE ({vae_label(vae)}) does not say which video model's frame rate to "
             "use, so clips take the videos' own frames (as target_fps 'source'): set LoadDataset's target_fps to "
             "your model's rate (16 for Wan 2.1/2.2 14B, 24 for HunyuanVideo and Wan 2.2 5B, 25 for LTX-Video).")
        return dataclasses.replace(dataset, target_fps=0.0)
    family, fps = found
    info(f"target_fps auto: clips are sampled at {fps_text(fps)}, the rate of {family} (from the VAE).")
    return dataclasses.replace(dataset, target_fps=fps)


def frames_per_latent(vae: Any) -> int | None:
    """How many frames the VAE turns into one latent frame (ComfyUI's temporal_compression_decode: 4 for Wan and
    HunyuanVideo, 8 for LTXV); None for an image VAE or one that does not say."""
    try:
        value = vae.temporal_compression_decode()
    except Exception:  # noqa: BLE001 - older ComfyUI or a stand-in object: no rule to check
        return None
    return value if isinstance(value, int) and value > 1 else None


def check_clip_lengths(dataset: DatasetSpec, vae: Any) -> None:
    """DatasetError, naming the nearest counts that work, when a frame bucket (or video_frames) is not 1 + k times
    the VAE's temporal compression: checked before anything is encoded."""
    problem = frame_rule_problem(dataset.clip_lengths, frames_per_latent(vae), vae_label(vae))
    if problem:
        raise DatasetError(problem)
