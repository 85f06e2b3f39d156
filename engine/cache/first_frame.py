"""Image-to-video conditioning from each clip's first frame, the way each family's ComfyUI node makes it.

Image-to-video models learn to continue a given start image. ComfyUI gives them that image in one
of a few ways, depending on the family; CacheLatents' `first_frame_style` picks which one the cache
stores (keys and values as the node puts them in the conditioning or the latent, so training feeds
the model exactly what sampling will):

- wan_concat: WanImageToVideo. The first frame followed by 0.5-grey frames, VAE-encoded, as
  `concat_latent_image`; `concat_mask` 0 on the first latent frame.
- start_frame_concat: HunyuanVideo15ImageToVideo, and HunyuanImageToVideo's "v1 (concat)". Only
  the first frame is encoded; the rest of `concat_latent_image` is zeros; `concat_mask` as above.
- clean_first_frame: the latent noise mask of Wan22ImageToVideoLatent, LTXVImgToVideo (strength 1; LTX 2.x
  with Cache Latents' audio_vae: the mask packed with the audio stream's, all ones),
  CosmosImageToVideoLatent and CosmosPredict2ImageToVideoLatent. The clip's first latent frame stays
  clean (`denoise_mask` 0 there, 1 elsewhere) and is left out of the loss. These families' video VAEs
  are causal in time, so the clip's first latent frame is the encoding of the first frame alone,
  which is what those nodes put there.
- hunyuan_video_replace: HunyuanImageToVideo's "v2 (replace)": clean_first_frame plus
  `guiding_frame_index` 0.

Nothing here imports comfy; `vae` is ComfyUI's VAE object (anything with its encode method).
"""
from __future__ import annotations

# style -> what ComfyUI node it copies (the node's tooltip and the docs use these words)
STYLES = {
    "wan_concat": "WanImageToVideo (Wan 2.1 I2V, Wan 2.2 A14B I2V)",
    "start_frame_concat": "HunyuanVideo15ImageToVideo (HunyuanVideo 1.5 I2V), HunyuanImageToVideo v1 (concat)",
    "clean_first_frame": "a latent noise mask on the first frame (Wan 2.2 5B TI2V, LTX-Video, Cosmos I2V)",
    "hunyuan_video_replace": "HunyuanImageToVideo v2 (replace) (HunyuanVideo I2V)",
}
DEFAULT_STYLE = "wan_concat"  # what first_frame_conditioning stored before the styles existed
# Every key a style may store: they belong to the item's pixels, not to its caption.
KEYS = ("concat_latent_image", "concat_mask", "denoise_mask", "guiding_frame_index")

# ComfyUI's supported-model class (its detection's answer) -> the styles its models read. A class
# listed with () takes no start image (a text-to-video model: the conditioning would be ignored or
# wrongly kept clean). Classes not listed are not checked (image models, newer families).
MODEL_STYLES = {
    "WAN21_I2V": ("wan_concat",),
    "WAN21_T2V": (),  # text-to-video; model_styles() tells the A14B I2V experts apart
    "WAN22_T2V": ("clean_first_frame",),  # Wan 2.2 TI2V 5B
    "LTXV": ("clean_first_frame",),
    "CosmosI2V": ("clean_first_frame",),
    "CosmosI2VPredict2": ("clean_first_frame",),
    "CosmosT2V": (),
    "CosmosT2IPredict2": (),
    "HunyuanVideo15": ("start_frame_concat",),
    "HunyuanVideoI2V": ("start_frame_concat",),  # v1 (concat); v2 (replace) is a plain HunyuanVideo file
    "HunyuanVideo": ("hunyuan_video_replace",),
}


def check_style(style: str, setting: str) -> str | None:
    """None when `style` is known, else the message that names `setting` and the choices."""
    if style in STYLES:
        return None
    return (f"{setting} {style!r} is not a first-frame style: use one of {', '.join(STYLES)} "
            "(the image-to-video node your sampling workflow uses; docs/datasets.md lists them).")


def model_styles(family: str, in_channels: int = 0, latent_channels: int = 0) -> tuple[str, ...] | None:
    """The styles a model of ComfyUI class `family` reads; None when this table does not know the class.
    in_channels/latent_channels (0 = unknown): a Wan 2.1-class file whose input is wider than its latents
    reads concat channels (the Wan 2.2 A14B I2V experts: no image embedder, so detected as WAN21_T2V)."""
    if family == "WAN21_T2V" and in_channels > latent_channels > 0:
        return ("wan_concat",)
    return MODEL_STYLES.get(family)


def style_mismatch(style: str, family: str, in_channels: int = 0, latent_channels: int = 0) -> str | None:
    """Why a cache made with `style` cannot train a model of ComfyUI class `family`, or None when it can
    (or the class is not one this table knows)."""
    wanted = model_styles(family, in_channels, latent_channels)
    if wanted is None or style in wanted:
        return None
    if not wanted:
        return (f"a {family} model takes no start image (a text-to-video model): turn first_frame_conditioning off "
                "on Cache Latents, or pick the model's image-to-video version.")
    return (f"a {family} model reads its start image the way {STYLES[wanted[0]]} gives it, but the cache was made "
            f"with first_frame_style {style!r}: set Cache Latents' first_frame_style to "
            f"{' or '.join(repr(s) for s in wanted)}.")


def first_frame_extras(style: str, vae, pixels, latent) -> dict:
    """The conditioning extras of one clip (pixels: [frames, H, W, 3] in 0..1; latent: its raw VAE
    latent [1, C, T, h, w]) in `style`, batched as the nodes make them. Latents stay raw: the model's
    extra_conds applies process_latent_in itself (MODEL-NOTES item 6)."""
    import torch

    frames = latent.shape[2]
    mask = torch.ones((1, 1, frames) + tuple(latent.shape[-2:]), dtype=torch.float32)
    mask[:, :, :1] = 0.0
    if style == "wan_concat":
        image = torch.full_like(pixels, 0.5)
        image[:1] = pixels[:1]
        concat = vae.encode(image)
        return {"concat_latent_image": concat, "concat_mask": mask.to(concat.dtype)}
    if style == "start_frame_concat":
        start = vae.encode(pixels[:1])
        concat = torch.zeros_like(latent)
        concat[:, :, : start.shape[2]] = start[:, :, :frames].to(concat.dtype)
        return {"concat_latent_image": concat, "concat_mask": mask.to(concat.dtype)}
    if style == "clean_first_frame":
        return {"denoise_mask": mask}
    if style == "hunyuan_video_replace":
        return {"denoise_mask": mask, "guiding_frame_index": 0}
    raise ValueError(check_style(style, "first_frame_style"))
