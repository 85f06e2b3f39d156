"""Audio + video items for models that sample a packed video + audio latent (LTX 2.3 / 2.0, `LTXAV`, and
MiniMax H3; ComfyUI 0.33+).

With CacheLatents' `audio_vae` connected, each item's latent is the pair ComfyUI's sampler gives such a
model: the video latent and the audio latent of the clip's sound, packed into one row the way
comfy.utils.pack_latents does ([1, 1, N]: each stream flattened, video first), with the two streams' shapes
under `latent_shapes` in the conditioning (BaseModel._apply_model unpacks by them). The audio latent is made
as ComfyUI's VAE Encode Audio / LTXV Audio VAE Encode make it: the waveform resampled (torchaudio) to the
VAE's `audio_sample_rate`, then `vae.encode`. tests/with_comfy/test_audio_cache.py checks the cached row
against ComfyUI's own nodes.

What each item's sound was, for the report (AudioNote.kind):
- silent: the clip has no audio track (an image item never has one): its audio is cached as silence of the
  clip's length, so the model learns it silent;
- resampled: the track's rate is not the audio VAE's;
- mono: one channel, which the audio VAE spreads over both (as it does in ComfyUI);
- mixed_down: more channels than the audio VAE takes (2): FFmpeg's stereo mix of them is used.
Nothing here imports comfy; torch and torchaudio are imported when a function runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.audio import ClipAudio, clip_audio
from ..data.frame_rates import sampling_fps

SHAPES_KEY = "latent_shapes"  # ComfyUI's conditioning key for a packed latent's stream shapes
VAE_CHANNELS = 2  # every audio VAE ComfyUI loads encodes stereo (mono is spread over both channels)
IMAGE_SECONDS_FPS = 25.0  # an image item's silence lasts one frame at this rate when target_fps is "source"
NOTE_KINDS = {
    "audio_silent": "have no audio track, so their audio is cached as silence (the model learns them silent): "
                    "give them a sound track, or leave audio_vae unconnected for a video-only cache",
    "audio_resampled": "have audio at another rate than the audio VAE's; it is resampled to the VAE's rate, as "
                       "VAE Encode Audio does",
    "audio_mono": "have mono audio; the audio VAE encodes it on both channels",
    "audio_mixed_down": "have more than 2 audio channels; FFmpeg's stereo mix of them is encoded",
}


@dataclass(frozen=True)
class AudioNote:
    kind: str  # a NOTE_KINDS key
    detail: str = ""  # e.g. "48000 Hz", "6 channels"


def vae_rate(audio_vae) -> int:
    """The rate VAE Encode Audio resamples to before encoding (ComfyUI's VAE default: 44100)."""
    return int(getattr(audio_vae, "audio_sample_rate", 44100))


def note_line(kind: str, count: int, names: list[str]) -> str:
    more = f" ... and {count - len(names)} more" if count > len(names) else ""
    return f"{count} item(s) {NOTE_KINDS[kind]}: {', '.join(names)}{more}"


def item_audio(dataset, item, frames: int) -> ClipAudio | None:
    """The clip's sound as engine/data/audio.py reads it (None: an image, or a video without audio)."""
    if not item.frames:
        return None
    start = item.clip_starts[0] if item.clip_starts else None
    return clip_audio(item.path, frames, dataset.frame_stride, sampling_fps(dataset), start)


def silence(dataset, frames: int, rate: int) -> ClipAudio:
    """Stereo silence as long as a clip of `frames` frames (an image: one frame)."""
    fps = sampling_fps(dataset) or IMAGE_SECONDS_FPS
    seconds = max(frames, 1) * max(dataset.frame_stride, 1) / fps
    return ClipAudio(np.zeros((VAE_CHANNELS, max(1, round(seconds * rate))), np.float32), rate)


def audio_latent(audio_vae, audio: ClipAudio):
    """VAE Encode Audio of one waveform: [1, C, ...] latent (batch of 1). ComfyUI's VAE.encode drops the samples
    after the last whole `downscale_ratio` (4096 for LTX's audio VAE); a waveform shorter than one is padded with
    silence to one, which VAE Encode Audio would encode as nothing."""
    import torch

    waveform = torch.from_numpy(audio.waveform).unsqueeze(0)  # [1, channels, samples], as ComfyUI's AUDIO holds it
    rate = vae_rate(audio_vae)
    if audio.sample_rate != rate:
        import torchaudio

        waveform = torchaudio.functional.resample(waveform, audio.sample_rate, rate)
    unit = getattr(audio_vae, "downscale_ratio", 1)  # ComfyUI's VAE.encode cuts the input to whole units of it
    if isinstance(unit, int) and waveform.shape[-1] < unit:  # shorter than one (an image's one frame): pad
        waveform = torch.nn.functional.pad(waveform, (0, unit - waveform.shape[-1]))
    return audio_vae.encode(waveform.movedim(1, -1))


def mixed_down(audio: ClipAudio) -> ClipAudio:
    """More than two channels -> FFmpeg's stereo downmix (what a player does with 5.1); a track whose channel
    layout FFmpeg does not know: the mean of its even channels left, of its odd ones right."""
    if not audio.layout:
        wave = audio.waveform
        return ClipAudio(np.stack([wave[0::2].mean(0), wave[1::2].mean(0)]).astype(np.float32), audio.sample_rate,
                         "stereo")
    import av

    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio.waveform), format="fltp", layout=audio.layout)
    frame.sample_rate = audio.sample_rate
    resampler = av.AudioResampler(format="fltp", layout="stereo", rate=audio.sample_rate)
    parts = [f.to_ndarray() for f in resampler.resample(frame)] + [f.to_ndarray() for f in resampler.resample(None)]
    return ClipAudio(np.concatenate(parts, axis=1).astype(np.float32), audio.sample_rate, "stereo")


def packed(video, audio) -> tuple:
    """(latent [1, 1, N], latent_shapes): the streams flattened and joined, video first (pack_latents' layout)."""
    import torch

    row = torch.cat([video.reshape(video.shape[0], 1, -1), audio.reshape(audio.shape[0], 1, -1).to(video.dtype)], -1)
    return row, [list(video.shape), list(audio.shape)]


def av_latent(audio_vae, dataset, item, pixels, video, mask=None) -> tuple:
    """(packed latent, {"latent_shapes": ..., with a first-frame `mask`: "denoise_mask": packed}, [AudioNote]) of
    one item whose video latent is `video`."""
    rate, notes = vae_rate(audio_vae), []
    audio = item_audio(dataset, item, int(pixels.shape[0]))
    if audio is None:
        audio, notes = silence(dataset, int(pixels.shape[0]), rate), [AudioNote("audio_silent")]
    else:
        if audio.channels > VAE_CHANNELS:
            notes.append(AudioNote("audio_mixed_down", f"{audio.channels} channels"))
            audio = mixed_down(audio)
        elif audio.channels < VAE_CHANNELS:
            notes.append(AudioNote("audio_mono"))
        if audio.sample_rate != rate:
            notes.append(AudioNote("audio_resampled", f"{audio.sample_rate} Hz"))
    sound = audio_latent(audio_vae, audio)
    row, shapes = packed(video, sound)
    extras = {SHAPES_KEY: shapes} if mask is None else {SHAPES_KEY: shapes, "denoise_mask": packed_mask(mask, video, sound)}
    return row, extras, notes


def packed_mask(mask, video, audio):
    """A first-frame `denoise_mask` on the video latent as ComfyUI's sampler packs the noise mask of such a pair
    (LTXV Img To Video, then LTXV Concat AV Latent: the audio stream's mask all ones; each stream's mask
    expanded to its latent, then packed like the latent): [1, 1, N]."""
    import torch

    ones = torch.ones((audio.shape[0], 1, audio.shape[1:].numel()), dtype=mask.dtype)
    return torch.cat([mask.expand(video.shape).reshape(video.shape[0], 1, -1), ones], -1)


PACKED_STYLES = ("clean_first_frame",)  # first-frame styles a packed row takes (its noise mask is packed too)


def audio_conflict(first_frame: str, mask_folder: str) -> str | None:
    """Why audio_vae cannot be used with these caching options (first_frame: the style, "" = off), or None.
    Loss masks and concat-style start images are laid out on the video latent alone."""
    if first_frame and first_frame not in PACKED_STYLES:
        return (f"audio_vae takes first_frame_style {' or '.join(repr(s) for s in PACKED_STYLES)} (LTX 2.x's "
                f"image-to-video, LTXV Img To Video), not {first_frame!r}: set first_frame_style to "
                f"{PACKED_STYLES[0]!r}, turn first_frame_conditioning off, or leave audio_vae unconnected.")
    if mask_folder:
        return (f"audio_vae cannot be used with LoadDataset's mask_folder ({mask_folder}): loss masks are laid out "
                "on the video latent, and the packed video + audio latent has none. Remove mask_folder, or leave "
                "audio_vae unconnected.")
    return None
