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
