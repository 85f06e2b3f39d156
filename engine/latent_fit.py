"""Which cached latents a model trains on: one rule for the node's check before launch (nodes/preflight.py,
on the file's header) and for the ranks (engine/train/model_setup.py and eval_set.py, on the loaded model).

A cache holds latents as the VAE made them; the model takes what its ComfyUI latent format's process_in
makes of them. Most formats keep the channels, so the cache needs the model's latent_channels. Some pack
them: HunyuanImage 2.1's refiner folds 2 frames of 32 channels into 64, so its cache holds 32 channels
and a 64-channel one does not fit. process_in decides, and process_out must give the cached shape back
(the packing is the format's own, not a per-channel scale that happens to broadcast).
Torch is imported when a function runs (the server imports this module too).
"""
from __future__ import annotations


def accepted_channels(latent_format, shape) -> tuple[int, ...]:
    """The channel counts a cache may hold for a model with this ComfyUI latent format (an instance), for
    latents of `shape` (channels first, no batch; only the rest of it matters): usually (latent_channels,)."""
    if is_packed_row(latent_format, shape):  # the streams' own shapes are checked by packed_latent_missing
        return (1,)
    channels = int(latent_format.latent_channels)
    candidates = [channels] + [channels // k for k in (2, 4) if channels % k == 0]  # packed frames or pixels
    rest = tuple(int(n) for n in shape[1:])
    return tuple(c for c in candidates if _round_trips(latent_format, (c, *rest)))


def is_packed_row(latent_format, shape) -> bool:
    """A cached [1, N] row for a video model: streams packed into one row (Cache Latents' audio_vae), which
    no video VAE's own latent is."""
    return len(shape) == 2 and int(shape[0]) == 1 and int(getattr(latent_format, "latent_dimensions", 2)) >= 3


_LAYOUTS = {1: "(channels, length)", 2: "(channels, height, width)", 3: "(channels, frames, height, width)"}


def wanted_latents(latent_format, shape) -> str:
    """What the model takes, for a message: '16-channel latents', '32-channel latents (packed into 64)'; with
    the layout when no channel count fits this shape (an image cache for a video model, say)."""
    channels = int(latent_format.latent_channels)
    accepted = accepted_channels(latent_format, shape)
    layout = ""
    if not accepted:
        dims = int(getattr(latent_format, "latent_dimensions", 2))
        accepted = accepted_channels(latent_format, (channels, *(1,) * dims)) or (channels,)
        layout = f" shaped {_LAYOUTS.get(dims, f'(channels + {dims} dimensions)')}"
    packed = "" if accepted == (channels,) else f" (packed into {channels})"
    return f"{' or '.join(str(c) for c in accepted)}-channel latents{packed}{layout}"


def _round_trips(latent_format, shape: tuple[int, ...]) -> bool:
    import torch

    latent = torch.zeros(1, *shape)
    try:
        with torch.no_grad():
            inside = latent_format.process_in(latent)
            back = latent_format.process_out(inside)
    except Exception:  # noqa: BLE001 - a shape the format cannot take does not fit
        return False
    return (inside.dim() == latent.dim() and int(inside.shape[1]) == int(latent_format.latent_channels)
            and tuple(back.shape) == tuple(latent.shape))


# Models whose sampler latent ComfyUI packs from several streams into one row (comfy.utils.pack_latents, with
# `latent_shapes` in the conditioning to unpack it): class name -> the streams. Cache Latents writes that row
# when its audio_vae is connected (engine/cache/audio_latents.py).
PACKED_STREAMS = {"MiniMaxH3": "video + audio", "LTXAV": "video + audio"}
_HOW = {"LTXAV": "Load LTXV Audio VAE", "MiniMaxH3": "the MiniMax H3 audio VAE (Load VAE)"}


def packed_latent_missing(model_class: str, extras: dict) -> str | None:
    """Why a cached item cannot train a model that takes a packed multi-stream latent (None: it can)."""
    streams = PACKED_STREAMS.get(model_class)
    shapes = extras.get("latent_shapes")
    if streams is None:
        if shapes is None:
            return None
        return (f"the cache holds packed video + audio rows (Cache Latents' audio_vae was connected), which "
                f"{model_class} does not take (LTX 2.x and MiniMax H3 do): cache the dataset again without audio_vae.")
    if shapes is None:
        return (f"{model_class} trains on ComfyUI's packed {streams} latent (one row with `latent_shapes` in its "
                f"conditioning), but the cache holds one VAE's latent per item: connect {_HOW[model_class]} to "
                "Cache Latents' audio_vae and cache again (docs/supported-models.md).")
    return None
