"""Helpers the awkward-dataset tests share (tests/e2e/test_awkward_datasets.py, test_awkward_inputs.py,
tests/with_comfy/test_awkward_media.py, tests/training/test_cache_multirank.py): tiny real ComfyUI
encoders, the node calls LoadDataset -> CacheLatents, and writers of odd image, PNG and video files."""
from __future__ import annotations

import io
import logging
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pack import load_pack

load_pack()
import PipeTrain.engine.data.scan as ds  # noqa: E402
import PipeTrain.nodes.cache_latents as cache_node  # noqa: E402
import PipeTrain.nodes.load_dataset as load_node  # noqa: E402
from PipeTrain.engine.launch.comfy_bootstrap import import_comfy  # noqa: E402

RES = 64


# ---- helpers -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def encoders(comfy_root, tmp_path_factory):
    # One intra-op thread: on this busy 2-core machine a 64 px VAE encode took 0.3-1 s with two
    # threads and 0.02 s with one (the CLIP encode 2.8 s vs 0.15 s), see tests/conftest.py.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    import_comfy(comfy_root)
    from tools.tiny_assets import load_tiny_encoders, write_tiny_clip, write_tiny_vae

    d = tmp_path_factory.mktemp("models")
    write_tiny_vae(str(d / "vae.safetensors"), seed=0)
    write_tiny_clip(str(d / "clip.safetensors"), seed=0)
    yield load_tiny_encoders(str(d / "vae.safetensors"), str(d / "clip.safetensors"))
    torch.set_num_threads(threads)


@pytest.fixture
def logs(caplog):
    """All PipeTrain warnings logged so far, as one string."""
    caplog.set_level(logging.WARNING, logger="PipeTrain")
    return lambda: "\n".join(r.getMessage() for r in caplog.records if r.name == "PipeTrain")


def load(folders: str, resolution: int = RES, repeats: int = 1):
    (spec,) = load_node.PipeTrainLoadDataset().load(folders=folders, resolution=resolution, repeats=repeats)
    return spec


def cache(spec, encoders):
    (out,) = cache_node.PipeTrainCacheLatents().cache(dataset=spec, vae=encoders[0], clip=encoders[1],
                                                      regenerate=False)
    return out


def names(spec) -> list[str]:
    return [os.path.basename(i.path) for i in ds.scan_dataset(spec).items]


def png_bytes(width: int, height: int, bit_depth: int, colour_type: int, raw: bytes | None = None,
              idat: bytes | None = None) -> bytes:
    """A PNG written by hand: 16-bit RGB(A), dimensions Pillow refuses, or damaged pixel data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    body = idat if idat is not None else zlib.compress(raw or b"", 1)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def solid_png(path, colour=(200, 30, 30), size=(RES, RES)):
    Image.new("RGB", size, colour).save(path)
    return str(path)


def encoded(image: Image.Image, **save) -> bytes:
    buf = io.BytesIO()
    image.save(buf, **save)
    return buf.getvalue()


def write_video(path: Path) -> str:
    """A real 4-frame video via PyAV when installed; else a file with the container's magic bytes."""
    try:
        import av
    except ImportError:
        magic = {".webm": b"\x1a\x45\xdf\xa3" + bytes(28)}.get(path.suffix, b"\x00\x00\x00\x18ftypisom" + bytes(20))
        path.write_bytes(magic)
        return "magic bytes"
    codec = {".webm": "libvpx"}.get(path.suffix, "mpeg4")
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=8)
        stream.width = stream.height = 32
        stream.pix_fmt = "yuv420p"
        for i in range(4):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 60 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return "pyav"


def animated(path, fmt: str, **extra):
    frames = [Image.new("RGB", (RES, RES), c) for c in ((255, 0, 0), (0, 0, 255))]
    frames[0].save(path, format=fmt, save_all=True, append_images=frames[1:], duration=100, loop=0, **extra)


# ---- image modes ---------------------------------------------------------------------------
