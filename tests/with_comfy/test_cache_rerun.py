"""What a re-run costs: LoadDataset's scan is shared with CacheLatents and kept while no file changes,
a re-run with nothing changed leaves the cache untouched, and the PNG probe never decodes pixels
to look for EXIF. Real ComfyUI VAE/CLIP objects (tiny files), real files.
"""
from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

from pack import load_pack

load_pack()
import PipeTrain.engine.data.scan as dataset_module  # noqa: E402
import PipeTrain.engine.data.scan_memo as scan_memo  # noqa: E402
from PipeTrain.engine.cache.format import MANIFEST  # noqa: E402
from PipeTrain.engine.data.images import probe_image  # noqa: E402
from PipeTrain.engine.data.png_chunks import png_has_exif  # noqa: E402


@pytest.fixture(scope="module")
def encoders(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    from tools.tiny_assets import load_tiny_encoders, write_tiny_clip, write_tiny_vae

    d = tmp_path_factory.mktemp("models")
    write_tiny_vae(str(d / "vae.safetensors"), seed=0)
    write_tiny_clip(str(d / "clip.safetensors"), seed=0)
    return load_tiny_encoders(str(d / "vae.safetensors"), str(d / "clip.safetensors"))


@pytest.fixture
def probes(monkeypatch):
    """Counts the scan's image probes (engine/data/scan.py calls probe_image once per image and scan)."""
    calls = []

    def counting(path):
        calls.append(path)
        return probe_image(path)
    monkeypatch.setattr(dataset_module, "probe_image", counting)
    scan_memo._memo.clear()
    yield calls
    scan_memo._memo.clear()


def test_one_scan_per_unchanged_dataset_and_an_untouched_cache(encoders, tmp_path, probes):
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset
    from tools.tiny_assets import write_tiny_dataset

    folder = tmp_path / "set"
    paths = write_tiny_dataset(str(folder), n=3, size=64, seed=2)

    def run():
        (spec,) = PipeTrainLoadDataset().load(folders=str(folder), resolution=64, repeats=1)
        (cache,) = PipeTrainCacheLatents().cache(dataset=spec, vae=encoders[0], clip=encoders[1], regenerate=False)
        return cache

    first = run()
    assert len(probes) == 3, "CacheLatents scanned the dataset again after LoadDataset"
    manifest = os.path.join(first.cache_dir, MANIFEST)
    stamp = os.stat(manifest).st_mtime_ns
    # LoadDataset always scans; CacheLatents reuses it (the cache folder written since is no dataset change)
    assert run() == first and len(probes) == 6
    assert os.stat(manifest).st_mtime_ns == stamp, "a re-run that changed nothing rewrote the manifest"

    (spec,) = PipeTrainLoadDataset().load(folders=str(folder), resolution=64, repeats=1)
    assert len(probes) == 9
    st = os.stat(paths[1])  # edited after LoadDataset ran (new mtime): CacheLatents scans again
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (second,) = PipeTrainCacheLatents().cache(dataset=spec, vae=encoders[0], clip=encoders[1], regenerate=False)
    assert len(probes) == 12 and second.fingerprint != first.fingerprint and second.count == 3
    (spec,) = PipeTrainLoadDataset().load(folders=str(folder), resolution=64, repeats=1)
    os.chmod(paths[2], 0o600)  # made (un)readable: no new size or mtime, but a new ctime
    PipeTrainCacheLatents().cache(dataset=spec, vae=encoders[0], clip=encoders[1], regenerate=False)
    assert len(probes) == 18


def _png_with_late_exif(path, orientation: int) -> None:
    """A PNG whose eXIf chunk follows the image data (allowed by the PNG spec; Pillow finds such a chunk
    only by decoding the image)."""
    buf = io.BytesIO()
    Image.fromarray(np.zeros((40, 80, 3), np.uint8)).save(buf, format="PNG")
    data = buf.getvalue()
    exif = Image.Exif()
    exif[0x0112] = orientation
    body = exif.tobytes()
    body = body[6:] if body.startswith(b"Exif\x00\x00") else body
    chunk = struct.pack(">I", len(body)) + b"eXIf" + body + struct.pack(">I", zlib.crc32(b"eXIf" + body))
    end = data.rindex(b"IEND") - 4
    path.write_bytes(data[:end] + chunk + data[end:])


def test_png_probe_reads_exif_without_decoding_pixels(tmp_path, monkeypatch):
    plain = tmp_path / "plain.png"
    Image.fromarray(np.zeros((40, 80, 3), np.uint8)).save(plain)
    late = tmp_path / "late.png"
    _png_with_late_exif(late, orientation=6)  # 90 degrees: shown 40 wide, 80 high
    assert not png_has_exif(str(plain)) and png_has_exif(str(late))
    info = probe_image(str(late))
    assert (info.width, info.height) == (40, 80)

    decoded = []
    real_load = ImageFile.ImageFile.load

    def load(self, *args, **kwargs):  # every Pillow plugin decodes through here
        decoded.append(self.filename)
        return real_load(self, *args, **kwargs)
    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    info = probe_image(str(plain))
    assert (info.width, info.height, info.format) == (80, 40, "PNG")
    assert decoded == [], "the probe decoded the PNG's pixels to look for EXIF"
    probe_image(str(late))
    assert decoded == [str(late)]  # an eXIf chunk after the pixels: Pillow decodes to read it, as before
