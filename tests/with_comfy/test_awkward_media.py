"""More awkward media through LoadDataset -> CacheLatents (issue 3): odd still images that must just
work, captions that must not stall caching, file names matched across Unicode forms, image
formats that are reported instead of silently ignored, and video oddities (display rotation, a
picture named .mp4, animated images in a video dataset, masks of videos). Every file is made here.

Real node functions, real (tiny, random) ComfyUI VAEs and CLIP, in process; the end-to-end
server run for awkward datasets is tests/e2e/test_awkward_datasets.py's slow test.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
import unicodedata

import numpy as np
import pytest
import torch
from pack import load_pack
from PIL import Image
from dataset_files import (  # noqa: F401
    RES,
    animated,
    cache,
    encoders,
    load,
    logs,
    names,
    solid_png,
)

load_pack()
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
import PipeTrain.engine.data.scan as ds  # noqa: E402
from PipeTrain.engine.data.images import load_image  # noqa: E402
import PipeTrain.nodes.load_dataset as load_node  # noqa: E402
from PipeTrain.engine.data.captions import MAX_CAPTION_CHARS  # noqa: E402
from PipeTrain.engine.data.video import load_video, probe_video  # noqa: E402


def write_video(path, frames=6, size=(64, 32), rotation=None, codec="libx264"):
    """Frames whose LEFT half is white and right half black, optionally with a display rotation."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=8)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        if rotation is not None:
            stream.set_display_rotation(rotation)
        for _ in range(frames):
            arr = np.zeros((size[1], size[0], 3), np.uint8)
            arr[:, : size[0] // 2] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return str(path)


@pytest.fixture(scope="module")
def video_vae(encoders):  # noqa: F811 - the imported fixture, requested so ComfyUI is imported first
    from tiny_encoders import random_video_vae

    return random_video_vae()


# ---- still images that simply work ---------------------------------------------------------

def test_odd_still_images_load_upright_and_cache(tmp_path, encoders, logs):  # noqa: F811
    for o in range(2, 9):  # every EXIF orientation: 5-8 swap width and height
        exif = Image.Exif()
        exif[0x0112] = o
        Image.new("RGB", (120, 60), (200, 30, 30)).save(tmp_path / f"exif{o}.jpg", exif=exif)
    Image.new("RGB", (RES, RES), (0, 0, 255)).save(tmp_path / "progressive.jpg", progressive=True)
    Image.new("RGB", (RES, RES), (0, 0, 255)).save(tmp_path / "really_a_jpeg.png", format="JPEG")
    Image.new("RGB", (RES, RES), (0, 0, 255)).save(tmp_path / "UPPER.JpEg", format="JPEG")
    pages = [Image.new("RGB", (RES, RES), c) for c in ((0, 255, 0), (0, 0, 255))]
    pages[0].save(tmp_path / "pages.tif", save_all=True, append_images=pages[1:])
    Image.new("RGB", (12000, 200), (9, 99, 199)).save(tmp_path / "panorama.jpg", quality=60)
    Image.new("RGB", (8, 8), (9, 99, 199)).save(tmp_path / "eight.png")
    for name in ("#hash.png", "-dash.png", "sp ace.png"):
        solid_png(tmp_path / name)
    spec = load(str(tmp_path))
    assert len(names(spec)) == 16
    sizes = {os.path.basename(i.path): (i.width, i.height) for i in ds.scan_dataset(spec).items}
    assert sizes["exif2.jpg"] == (120, 60) and sizes["exif6.jpg"] == (60, 120) and sizes["exif8.jpg"] == (60, 120)
    np.testing.assert_allclose(load_image(str(tmp_path / "pages.tif"), RES)[5, 5], (0, 1, 0), atol=0.02)
    warned = logs()
    assert "pages.tif" in warned and "only the first frame is trained" in warned
    assert "panorama.jpg (12000x200" in warned and "eight.png (8x8)" in warned
    assert cache(spec, encoders).count == 16 and "could not be used" not in logs()


def test_other_image_extensions_are_reported_not_ignored(tmp_path, logs):  # noqa: F811
    solid_png(tmp_path / "ok.png")
    Image.new("RGB", (RES, RES)).save(tmp_path / "scan.tga")
    Image.new("RGB", (RES, RES)).save(tmp_path / "raw.ppm")
    assert names(load(str(tmp_path))) == ["ok.png"]
    warned = logs()
    assert "2 file(s) are in a format PipeTrain cannot read and are skipped" in warned
    assert "scan.tga (.tga images are not read by PipeTrain: convert it to PNG or JPEG)" in warned
    assert "raw.ppm (.ppm images are not read" in warned


def test_cut_off_webp_is_called_cut_off(tmp_path, logs):  # noqa: F811
    solid_png(tmp_path / "ok.png")
    Image.effect_noise((RES, RES), 60).convert("RGB").save(tmp_path / "full.webp")
    data = (tmp_path / "full.webp").read_bytes()
    (tmp_path / "half.webp").write_bytes(data[: len(data) // 2])
    os.remove(tmp_path / "full.webp")
    load(str(tmp_path))
    assert "half.webp is cut off" in logs() and "copy it again" in logs()


# ---- captions and names --------------------------------------------------------------------

def test_huge_caption_is_cut_and_reported_not_a_stall(tmp_path, encoders, logs):  # noqa: F811
    solid_png(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("word " * 200_000)  # 1 MB: took minutes and 10 GB before the cut
    solid_png(tmp_path / "nul.png")
    (tmp_path / "nul.txt").write_bytes(b"abc\x00def")
    solid_png(tmp_path / "nul_end.png")
    (tmp_path / "nul_end.txt").write_bytes(b"abc\x00")  # even length with a zero: not UTF-16 for it
    spec = load(str(tmp_path))
    captions = {os.path.basename(i.path): i.caption for i in ds.scan_dataset(spec).items}
    assert len(captions["a.png"]) == MAX_CAPTION_CHARS and captions["nul.png"] == "abcdef" and captions["nul_end.png"] == "abc"
    assert f"1 caption file(s) are longer than {MAX_CAPTION_CHARS} characters" in logs() and "a.txt" in logs()
    t0 = time.monotonic()
    assert cache(spec, encoders).count == 3
    assert time.monotonic() - t0 < 60


def test_caption_matches_across_unicode_normal_forms(tmp_path, logs):  # noqa: F811
    nfd = unicodedata.normalize("NFD", "café")  # macOS writes names decomposed
    solid_png(tmp_path / f"{nfd}.png")
    (tmp_path / (unicodedata.normalize("NFC", "café") + ".txt")).write_text("a cafe", encoding="utf-8")
    (tmp_path / "cat_01.txt").write_text("a typo: the image is cat01.png")
    solid_png(tmp_path / "cat01.png")
    (tmp_path / "broken.png").write_bytes(b"")
    (tmp_path / "broken.txt").write_text("the caption of a skipped image is not 'unused'")
    spec = load(str(tmp_path))
    captions = {os.path.basename(i.path): i.caption for i in ds.scan_dataset(spec).items}
    assert captions == {f"{nfd}.png": "a cafe", "cat01.png": None}
    warned = logs()
    (unused,) = [line for line in warned.splitlines() if "match no image and are unused" in line]
    assert "LoadDataset: 1 caption file(s) (.txt)" in unused and unused.endswith("cat_01.txt")
    assert "accents stored differently" in warned  # the NFD image found its NFC caption; said so


# ---- videos --------------------------------------------------------------------------------

def test_rotated_video_trains_upright(tmp_path):
    path = write_video(tmp_path / "portrait.mp4", rotation=90)  # stored 64x32, displayed 32x64
    info = probe_video(path)
    assert (info.width, info.height, info.frames) == (32, 64, 6)
    clip = load_video(path, (32, 64), frames=1)
    assert clip.shape == (1, 64, 32, 3)
    # rotated 90 degrees counter-clockwise: the white left half is now the bottom half
    assert clip[0, -4:].mean() > 0.9 and clip[0, :4].mean() < 0.1
    flipped = load_video(write_video(tmp_path / "upside.mp4", rotation=180), (64, 32), frames=1)
    assert flipped[0, :, -4:].mean() > 0.9 and flipped[0, :, :4].mean() < 0.1


def test_video_oddities_are_skipped_by_name(tmp_path, monkeypatch, logs):  # noqa: F811
    (tmp_path / "only").mkdir()
    write_video(tmp_path / "only" / "good.mp4")
    write_video(tmp_path / "good.mp4")
    Image.new("RGB", (RES, RES)).save(tmp_path / "picture.mp4", format="PNG")
    (tmp_path / "folder.mkv").mkdir()
    write_video(tmp_path / "one_frame.mp4", frames=1)
    animated(tmp_path / "moving.gif", "GIF")
    animated(tmp_path / "moving.webp", "WEBP", lossless=True)
    solid_png(tmp_path / "still.png")  # a still image in a video dataset trains as a 1-frame clip
    (spec,) = load_node.PipeTrainLoadDataset().load(
        folders=str(tmp_path), resolution=RES, repeats=1, video_frames=5)
    assert names(spec) == ["still.png", "good.mp4"]  # images first, then videos
    warned = logs()
    assert "picture.mp4 is really a still PNG picture, not a video: rename it with its image extension" in warned
    assert "folder.mkv is a folder, not a video file" in warned and "a video extension" in warned
    assert "one_frame.mp4 (1 frames)" in warned
    assert "2 animated image(s) are skipped because video_frames is set" in warned
    assert "moving.gif" in warned and "moving.webp" in warned
    monkeypatch.setitem(sys.modules, "av", None)  # PyAV missing: every video is skipped with the fix, no crash
    with pytest.raises(ds.DatasetError, match="good.mp4 cannot be read: video support needs PyAV"):
        ds.validate(dataclasses.replace(spec, folders=(ds.FolderSpec(str(tmp_path / "only")),)))
    monkeypatch.undo()
    for name in ("good.mp4", "still.png", "picture.mp4", "one_frame.mp4"):
        os.remove(tmp_path / name)
    with pytest.raises(ds.DatasetError, match="no file of the dataset can be trained on.*animated image"):
        load_node.PipeTrainLoadDataset().load(
            folders=str(tmp_path), resolution=RES, repeats=1, video_frames=5)


def test_video_masks_end_to_end(tmp_path, video_vae, encoders, logs):  # noqa: F811
    from PipeTrain.engine.train.objective import loss_mask
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents

    data, masks = tmp_path / "data", tmp_path / "masks"
    data.mkdir()
    masks.mkdir()
    write_video(data / "masked.mp4", size=(64, 64))
    write_video(data / "video_mask.mp4", size=(64, 64))
    write_video(data / "plain.mp4", size=(64, 64))
    top = np.zeros((64, 64), np.uint8)
    top[:32] = 255
    Image.fromarray(top).save(masks / "masked.png")  # one still mask for every frame of its video
    write_video(masks / "video_mask.mp4", size=(64, 64))  # a per-frame video mask: refused by name
    (spec,) = load_node.PipeTrainLoadDataset().load(folders=str(data), resolution=RES, repeats=1, video_frames=5,
                                          mask_folder=str(masks))
    assert names(spec) == ["masked.mp4", "plain.mp4"]
    warned = logs()
    assert "1 mask(s) are video files" in warned and "video_mask.mp4 (for " in warned
    (out,) = PipeTrainCacheLatents().cache(dataset=spec, vae=video_vae, clip=encoders[1], regenerate=False)
    cached = {it["source"]: it for it in CachedDataset(out.cache_dir)}
    latent, mask = cached["masked.mp4"]["latent"], cached["masked.mp4"]["loss_mask"]
    assert latent.shape == (16, 2, 8, 8) and mask.shape == (1, 1, 8, 8)  # broadcast over the 2 latent frames
    assert mask[0, 0, :4].min() == 1 and mask[0, 0, 4:].max() == 0
    assert cached["plain.mp4"].get("loss_mask") is None
    weights = loss_mask([{"loss_mask": mask}, {}], torch.zeros(2, 16, 2, 8, 8))
    assert weights.shape == (2, 1, 1, 8, 8) and weights[1].min() == 1


def test_video_as_control_image_is_refused_by_name(tmp_path, logs):  # noqa: F811
    data, control = tmp_path / "data", tmp_path / "control"
    data.mkdir()
    control.mkdir()
    write_video(data / "a.mp4")
    write_video(data / "b.mp4")
    solid_png(control / "a.png", size=(64, 32))
    write_video(control / "b.mp4")  # an edit pair's control must be a still image
    (spec,) = load_node.PipeTrainLoadDataset().load(folders=str(data), resolution=RES, repeats=1, video_frames=5,
                                                    control_folder=str(control))
    assert names(spec) == ["a.mp4"]
    assert "b.mp4 is a video (for " in logs() and "a control image must be a still image" in logs()
