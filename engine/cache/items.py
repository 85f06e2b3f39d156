"""Encoding one cache item: its pixels, its conditioning extras, its loss mask.

Shared by the CacheLatents node and the engine's cache mode (engine/cache/writer.py runs the
loop over the items). `vae` and `clip` are ComfyUI's VAE and CLIP objects (or anything with their
encode / tokenize / encode_from_tokens_scheduled methods); nothing here imports comfy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..data.frame_rates import sampling_fps
from ..data.images import ImageReadError, load_image
from ..data.pairs import load_mask
from ..data.scan import DatasetItem, DatasetSpec
from ..data.video import load_video
from .first_frame import KEYS as FIRST_FRAME_KEYS
from .first_frame import first_frame_extras

# Keys of the CLIP output dict that are not data: "hooks" carries ComfyUI's hook objects for
# scheduled conditioning at sampling time, which has no meaning for a cached training caption.
NOT_DATA_KEYS = ("hooks",)
REFERENCE_KEY = "reference_latents"  # ComfyUI's ReferenceLatent conditioning key (edit models)
CLIP_VISION_KEY = "clip_vision_output"  # CLIPVisionEncode's output, as image-to-video nodes pass it on
# The fields of comfy.clip_vision.Output that models' extra_conds read: Wan 2.1 i2v (and the Wan 2.1
# i2v-style Fun/Camera models) take penultimate_hidden_states, HunyuanVideo 1.5 (SigLIP) last_hidden_state.
CLIP_VISION_FIELDS = ("penultimate_hidden_states", "last_hidden_state")


def per_item(key: str) -> bool:
    """Extras that belong to one item's pixels, not to its caption (dropped when a caption's cond is reused)."""
    return (key in FIRST_FRAME_KEYS or key in (REFERENCE_KEY, CLIP_VISION_KEY)
            or key.startswith((REFERENCE_KEY + ".", CLIP_VISION_KEY + ".")))


def clip_vision_extras(clip_vision, pixels, crop: bool = True) -> dict:
    """The CLIP-vision encoding of an item's first frame (an image item: the image), as ComfyUI's
    CLIPVisionEncode node makes it (crop=True is its "center", False its "none") for WanImageToVideo /
    HunyuanVideo15ImageToVideo. Stored as flat keys clip_vision_output.<field> (batch of 1), which
    engine/train/conditioning.py turns back into the object extra_conds reads."""
    out = clip_vision.encode_image(pixels[:1], crop=crop)
    return {f"{CLIP_VISION_KEY}.{name}": out[name] for name in CLIP_VISION_FIELDS}


# LoadDataset's control images, stored the way the edit model's ComfyUI node passes them (CacheLatents'
# control_style): ReferenceLatent for Flux Kontext, Qwen-Image-Edit, Flux 2 and OmniGen2;
# InstructPixToPixConditioning (the control image's latent as concat_latent_image) for HiDream E1 and
# the InstructPix2Pix UNets.
CONTROL_STYLES = ("reference_latents", "concat_latent_image")


def control_extras(style: str, vae, control_pixels) -> dict:
    """The control image's raw VAE latent (VAEEncode's output; the model's extra_conds applies
    process_latent_in itself): as the flat key reference_latents.0, which engine/train/conditioning.py turns
    back into the list extra_conds takes, or as concat_latent_image."""
    latent = vae.encode(control_pixels)
    return {f"{REFERENCE_KEY}.0": latent} if style == "reference_latents" else {"concat_latent_image": latent}


def control_style_conflict(control_style: str, first_frame_conditioning: bool, control_folder: str) -> str | None:
    """Why these caching options cannot go together, or None: two sources for concat_latent_image."""
    if control_style == "concat_latent_image" and first_frame_conditioning and control_folder:
        return ("control_style 'concat_latent_image' and first_frame_conditioning would both store "
                "concat_latent_image: turn first_frame_conditioning off, or set control_style to 'reference_latents'.")
    return None


@dataclass(frozen=True)
class ItemOptions:
    """What each cached item stores besides its latent and caption: CacheLatents' options."""
    first_frame: str = ""  # image-to-video style (engine/cache/first_frame.py) for video clips; "" = none
    clip_vision: Any = None  # a ComfyUI CLIP_VISION: each item's first frame encoded with it
    clip_vision_crop: bool = True  # CLIPVisionEncode's crop "center" (True) or "none"
    control_style: str = CONTROL_STYLES[0]
    audio_vae: Any = None  # a ComfyUI audio VAE: each item's latent packed with its sound's (audio_latents.py)

    def extras(self, vae, item: DatasetItem, pixels, latent, control_pixels) -> dict:
        """The item's per-item conditioning extras (not its caption's)."""
        out = {}
        if self.first_frame and item.frames:
            out.update(first_frame_extras(self.first_frame, vae, pixels, latent))
        if self.clip_vision is not None:
            out.update(clip_vision_extras(self.clip_vision, pixels, self.clip_vision_crop))
        if control_pixels is not None:
            out.update(control_extras(self.control_style, vae, control_pixels))
        return out


def loss_mask_tensor(item, size, latent):
    """The item's mask image as loss weights at the latent's size: [1, 1, (1,) h, w] (batch of 1).
    Raises ImageReadError (the cache leaves the item out and lists it) for a mask that cannot be
    read, or that is black over the whole trained crop."""
    import torch

    weights = load_mask(item.mask.path, (item.width, item.height), size, tuple(latent.shape[-2:]))
    if not weights.any():  # the sample would add nothing but cost (objective.py: black cells have no gradient)
        raise ImageReadError(f"{item.mask.path} is black everywhere in the part of {item.path} that trains at "
                             f"{size[0]}x{size[1]} (loss weight 0), so the image would train nothing and is left out: "
                             "paint what should train white, or delete the mask to train it unmasked")
    return torch.from_numpy(weights).reshape((1,) * (latent.ndim - 2) + weights.shape)


def safe_text(value: str) -> str:
    """A string safetensors can store: file names that are not valid UTF-8 (Linux allows any bytes)
    arrive from os.listdir with surrogate escapes, which UTF-8 cannot encode."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def load_pixels(dataset: DatasetSpec, item: DatasetItem, size):
    """(pixels, control pixels or None) of one entry, as ComfyUI IMAGE tensors [frames or 1, H, W, 3].

    A video is [frames, H, W, 3], which ComfyUI's video VAEs encode as one clip; the control image
    is cropped and resized to the same bucket as its target image. Raises what the readers raise.
    """
    import torch

    if item.frames:  # its frame bucket and clip start (an item from before frame buckets: video_frames from the start)
        start = item.clip_starts[0] if item.clip_starts else None
        pixels = torch.from_numpy(load_video(item.path, size, item.clip_frames or dataset.video_frames,
                                             dataset.frame_stride, sampling_fps(dataset), start))
    else:
        pixels = torch.from_numpy(load_image(item.path, size)).unsqueeze(0)
    control = torch.from_numpy(load_image(item.control.path, size)).unsqueeze(0) if item.control else None
    return pixels, control


def caption_cond(clip, caption: str):
    """(cond tensor, extras) of one caption as the CLIP gives them, without the sampling-time keys."""
    cond, extras = clip.encode_from_tokens_scheduled(clip.tokenize(caption))[0]
    return cond, {k: v for k, v in extras.items() if k not in NOT_DATA_KEYS}
