"""Small generated media files for tests: real videos written with PyAV, with content a test can check."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def write_video(path: Path, frames: int, size=(64, 48), codec="ffv1", fps=24) -> Path:
    """A video of `frames` frames of `size` (width, height): frame i is flat grey 10*i in its left half
    and white in its right half, so frame order and sampling are checkable. ffv1 is lossless."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv444p" if codec == "ffv1" else "yuv420p"
        for i in range(frames):
            arr = np.full((size[1], size[0], 3), 10 * i, np.uint8)
            arr[:, size[0] // 2:] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


INDEX_STEP = 6  # write_timed_video: frame i is flat grey INDEX_STEP * i (up to 42 frames)


def write_timed_video(path: Path, times_ms, size=(64, 48)) -> Path:
    """A lossless (FFV1 in Matroska, whose time base is 1 ms) video with one frame at each of `times_ms`:
    frame i is flat grey INDEX_STEP * i, so `frame_indices` tells which source frames a clip holds.
    Irregular times make a variable-frame-rate video."""
    from fractions import Fraction

    import av

    gaps = sorted(b - a for a, b in zip(times_ms, times_ms[1:])) or [40]
    with av.open(str(path), "w", format="matroska") as out:
        stream = out.add_stream("ffv1", rate=round(1000 / gaps[len(gaps) // 2]))
        stream.width, stream.height = size
        stream.pix_fmt = "yuv444p"
        stream.time_base = stream.codec_context.time_base = Fraction(1, 1000)
        for i, t in enumerate(times_ms):
            frame = av.VideoFrame.from_ndarray(np.full((size[1], size[0], 3), INDEX_STEP * i, np.uint8),
                                               format="rgb24")
            frame.pts, frame.time_base = int(t), Fraction(1, 1000)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def frame_indices(pixels) -> list[int]:
    """Which frames of a write_timed_video clip `pixels` ([frames, H, W, 3] in 0..1) holds."""
    return [round(float(np.asarray(f).mean()) * 255 / INDEX_STEP) for f in pixels]
