"""A video clip's sound: `clip_audio` reads the part of a video file's audio track that plays while the clip
picked from it plays (engine/data/video.py picks the frames), through PyAV, as ComfyUI's own video loading
does: the last audio stream FFmpeg can decode, every sample as 32-bit float, at the file's own rate and
channel count (the audio VAE's encode resamples, as ComfyUI's VAE Encode Audio does).

The clip's span: from its first picked frame's presentation time, for as long as its frames last at the
rate they are picked at (target_fps, or the video's own rate, times frame_stride). Audio missing inside
that span (a track that starts late or stops early) is silence.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .frame_picks import mean_interval, pick_frames
from .video import VideoReadError, _av, _fail, frame_times


@dataclass(frozen=True)
class ClipAudio:
    """[channels, samples] float32 waveform of one clip at `sample_rate` Hz; `channels` the file's, in FFmpeg's
    channel `layout` ("stereo", "5.1(side)", ...; "" when not known)."""
    waveform: np.ndarray
    sample_rate: int
    layout: str = ""

    @property
    def channels(self) -> int:
        return int(self.waveform.shape[0])


def clip_span(times: list[float], frames: int, stride: int, target_fps: float,
              start: float | None) -> tuple[float, float] | None:
    """(start, seconds) of the clip pick_frames makes from these frame times, or None when it is too short."""
    picks = pick_frames(times, frames, target_fps, stride, start)
    if not picks:
        return None
    interval = stride / target_fps if target_fps else stride * (mean_interval(times) or 1 / 25)
    return times[picks[0]], frames * interval


def _decodable_audio(container):
    """The last audio stream with a decoder (what ComfyUI's video loading takes), or None."""
    streams = [s for s in container.streams.audio if s.codec_context is not None]
    return streams[-1] if streams else None


def clip_audio(path: str, frames: int, stride: int = 1, target_fps: float = 0.0,
               start: float | None = None) -> ClipAudio | None:
    """The audio under the clip load_video(path, ..., frames, stride, target_fps, start) gives, or None when
    the file has no audio track. Raises VideoReadError for a file that cannot be decoded."""
    av = _av(path)
    try:
        with av.open(path) as container:
            span = clip_span(frame_times(container), frames, stride, target_fps, start)
        if span is None:
            raise VideoReadError(f"{path} is too short for one clip of {frames} frames: lower 'video_frames', or "
                                 "remove it")
        with av.open(path) as container:
            stream = _decodable_audio(container)
            if stream is None:
                return None
            rate = int(stream.codec_context.sample_rate or stream.rate or 0)
            layout = getattr(stream.codec_context.layout, "name", "") or ""
            resampler = av.AudioResampler(format="fltp")  # float planar: [channels, samples] per frame
            chunks, first = [], None
            for frame in container.decode(stream):
                if first is None and frame.pts is not None and frame.time_base is not None:
                    first = float(frame.pts * frame.time_base)
                chunks += [f.to_ndarray() for f in resampler.resample(frame)]
            chunks += [f.to_ndarray() for f in resampler.resample(None)]
    except VideoReadError:
        raise
    except Exception as e:  # PyAV's own error types
        raise _fail(path, e) from None
    if not chunks or not rate:
        return None
    track = np.concatenate(chunks, axis=1).astype(np.float32)
    return ClipAudio(_window(track, rate, span[0] - (first or 0.0), span[1]), rate, layout)


def _window(track: np.ndarray, rate: int, offset: float, seconds: float) -> np.ndarray:
    """`seconds` of track from `offset` seconds into it; silence where the track has no samples."""
    begin, length = round(offset * rate), max(1, round(seconds * rate))
    out = np.zeros((track.shape[0], length), np.float32)
    lo, hi = max(begin, 0), min(begin + length, track.shape[1])
    if hi > lo:
        out[:, lo - begin:hi - begin] = track[:, lo:hi]
    return out
