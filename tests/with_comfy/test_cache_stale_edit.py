"""Issue 22 items 12 and 15 with real ComfyUI VAE/CLIP objects (tiny files): an edit that keeps a
file's size and mtime (cp -p, rsync -t) re-encodes that item, and CacheLatents shows its report
on the node (the ui text and the rows /history keeps).
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch
from PIL import Image

from pack import load_pack

load_pack()
import PipeTrain.engine.data.scan_memo as scan_memo  # noqa: E402
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents  # noqa: E402
from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset  # noqa: E402
from dataset_files import encoders  # noqa: E402,F401 - the fixture (tiny real VAE and CLIP)

pytestmark = pytest.mark.core


def _queue(folder, encoders, **cache_options):
    """What one queue does: LoadDataset's IS_CHANGED, LoadDataset, CacheLatents (as ComfyUI calls them)."""
    signature = PipeTrainLoadDataset.IS_CHANGED(str(folder), 64, 1)
    spec = PipeTrainLoadDataset().load_and_report(folders=str(folder), resolution=64, repeats=1)["result"][0]
    out = PipeTrainCacheLatents().cache_and_report(dataset=spec, vae=encoders[0], clip=encoders[1], regenerate=False,
                                                   **cache_options)
    return signature, out["result"][0], out["ui"]


def _bmp(path, colour):
    Image.new("RGB", (64, 64), colour).save(path, format="BMP")  # same byte size for any pixels


def test_same_size_edit_with_restored_mtime_is_encoded_again(encoders, tmp_path):
    scan_memo._memo.clear()
    folder = tmp_path / "set"
    folder.mkdir()
    for i, colour in enumerate(((200, 30, 30), (30, 200, 30), (30, 30, 200))):
        _bmp(folder / f"{i}.bmp", colour)
        (folder / f"{i}.txt").write_text(f"picture {i}")
    first_sig, first, ui = _queue(folder, encoders)
    assert ui["text"][0].startswith("0 item(s) reused, 0 copied from the previous cache, 3 encoded")
    old_latent = CachedDataset(first.cache_dir)[1]["latent"].clone()

    edited = folder / "1.bmp"
    st = os.stat(edited)
    _bmp(tmp_path / "other.bmp", (250, 250, 250))
    shutil.copyfile(tmp_path / "other.bmp", edited)  # other pixels, same size, same inode
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))  # what cp -p / rsync -t do
    assert (os.stat(edited).st_size, os.stat(edited).st_mtime_ns) == (st.st_size, st.st_mtime_ns)

    second_sig, second, ui = _queue(folder, encoders)
    assert second_sig != first_sig, "IS_CHANGED missed the edit: ComfyUI would not even run the nodes"
    assert second.fingerprint != first.fingerprint, "the stale cache was reused"
    assert ui["text"][0].startswith("0 item(s) reused, 2 copied from the previous cache, 1 encoded"), ui["text"]
    assert not torch.equal(CachedDataset(second.cache_dir)[1]["latent"], old_latent)

    third_sig, third, ui = _queue(folder, encoders)  # nothing changed: same cache, nothing encoded
    assert (third_sig, third) == (second_sig, second) and " 0 encoded" in ui["text"][0]
    # trust_cache: the newest complete cache with these settings, files unchecked (documented)
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _, trusted, ui = _queue(folder, encoders, trust_cache=True)
    assert trusted == third and ui["text"][0].startswith("trust_cache is on")


def test_cache_latents_shows_the_report_on_the_node(encoders, tmp_path):
    scan_memo._memo.clear()
    folder = tmp_path / "set"
    folder.mkdir()
    _bmp(folder / "a.bmp", (1, 2, 3))
    _bmp(folder / "b.bmp", (4, 5, 6))
    (folder / "b.txt").write_text("b")
    (folder / "notes.txt").write_text("matches no image")
    _, cache, ui = _queue(folder, encoders)
    assert cache.count == 2 and ui["text"][0].startswith("0 item(s) reused, 0 copied from the previous cache, 2 encoded")
    assert any("1 image(s) have no caption file" in line for line in ui["text"][1:])
    rows = {row["reason"]: row for row in ui["pipetrain_report"]}
    assert rows["missing"] == {"reason": "missing", "count": 1, "first": [str(folder / "a.bmp")]}
    assert rows["caption_unused"]["first"] == [str(folder / "notes.txt")]
