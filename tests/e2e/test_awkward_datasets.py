"""Awkward datasets through LoadDataset -> CacheLatents: every odd file is either used (and said so
when it is altered: upscaled, cropped, first frame) or skipped with a message naming it and the
fix; a dataset with nothing usable is one clear error. Never a crash.

In-process tests call the pack's node functions with real (tiny, random) ComfyUI VAE and CLIP
objects; one slow test drives a real ComfyUI server. Tests run as root here, so a chmod 000 file
stays readable: the permission case is checked for real when not root and simulated otherwise.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pack import load_pack

load_pack()
import PipeTrain.engine.cache.format as fmt  # noqa: E402
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
import PipeTrain.engine.data.scan as ds  # noqa: E402
from PipeTrain.engine.data.images import IMAGE_EXTENSIONS, load_image  # noqa: E402
import PipeTrain.engine.data.images as image_io  # noqa: E402
import PipeTrain.nodes.cache_latents as cache_node  # noqa: E402
import PipeTrain.nodes.load_dataset as load_node  # noqa: E402

from dataset_files import (  # noqa: E402,F401 - encoders, logs: fixtures
    RES,
    animated,
    cache,
    encoded,
    encoders,
    load,
    logs,
    names,
    png_bytes,
    solid_png,
    write_video,
)


def _mode_files(folder: Path) -> dict[str, tuple]:
    """name -> expected RGB at the center (None: only shape and range are checked)."""
    s = (RES, RES)
    Image.new("1", s, 1).save(folder / "bilevel.png")
    Image.new("L", s, 128).save(folder / "gray.png")
    Image.new("LA", s, (0, 0)).save(folder / "gray_alpha.png")  # transparent -> white
    p = Image.new("P", s, 0)
    p.putpalette([0, 0, 0, 255, 0, 0])
    p.save(folder / "palette_transparent.png", transparency=0)  # index 0 transparent -> white
    Image.new("RGBA", s, (0, 0, 255, 255)).save(folder / "rgba.png")
    Image.new("CMYK", s, (0, 255, 255, 0)).save(folder / "cmyk.jpg")
    Image.fromarray(np.full((RES, RES), 32768, np.uint16)).save(folder / "gray16.png")
    i32 = np.full((RES, RES), 1_000_000, np.int32)
    i32[0, 0] = 2_000_000  # over 16 bits: scaled by its maximum
    Image.fromarray(i32).save(folder / "int32.tif")
    Image.fromarray(np.full((RES, RES), 0.25, np.float32)).save(folder / "float01.tif")
    f255 = np.full((RES, RES), 51.0, np.float32)
    f255[0, 0] = 255.0
    Image.fromarray(f255).save(folder / "float255.tif")
    red16, green16 = b"\xff\xff" + bytes(4), bytes(2) + b"\xff\xff" + bytes(2) + b"\xff\xff"  # Pillow reads 8 bits
    (folder / "rgb16.png").write_bytes(png_bytes(RES, RES, 16, 2, (b"\x00" + red16 * RES) * RES))
    (folder / "rgba16.png").write_bytes(png_bytes(RES, RES, 16, 6, (b"\x00" + green16 * RES) * RES))
    Image.new("RGB", s, (0, 200, 0)).convert("YCbCr").save(folder / "ycbcr.tif")
    Image.new("RGB", s, (0, 200, 0)).convert("LAB").save(folder / "lab.tif")
    animated(folder / "anim.gif", "GIF")
    animated(folder / "anim.webp", "WEBP", lossless=True)
    animated(folder / "anim_apng.png", "PNG")
    rot = Image.new("RGB", (100, 40), (255, 255, 255))
    exif = Image.Exif()
    exif[0x0112] = 6  # displayed rotated: 40 wide, 100 tall
    rot.save(folder / "exif_rotated.jpg", exif=exif)
    expected = {"bilevel.png": (1, 1, 1), "gray.png": (0.5, 0.5, 0.5), "gray_alpha.png": (1, 1, 1),
                "palette_transparent.png": (1, 1, 1), "rgba.png": (0, 0, 1), "cmyk.jpg": (1, 0, 0),
                "gray16.png": (0.5, 0.5, 0.5), "int32.tif": (0.5, 0.5, 0.5), "float01.tif": (0.25, 0.25, 0.25),
                "float255.tif": (0.2, 0.2, 0.2), "rgb16.png": (1, 0, 0), "rgba16.png": (0, 1, 0),
                "ycbcr.tif": (0, 0.78, 0), "lab.tif": None, "anim.gif": (1, 0, 0), "anim.webp": (1, 0, 0),
                "anim_apng.png": (1, 0, 0), "exif_rotated.jpg": (1, 1, 1)}
    if ".avif" in IMAGE_EXTENSIONS:
        Image.new("RGB", s, (0, 0, 255)).save(folder / "photo.avif", quality=95)
        expected["photo.avif"] = (0, 0, 1)
    return expected


def test_every_image_mode_loads_and_caches(tmp_path, encoders, logs):
    expected = _mode_files(tmp_path)
    spec = load(str(tmp_path))
    assert sorted(names(spec)) == sorted(expected)
    for name, rgb in expected.items():
        arr = load_image(str(tmp_path / name), RES)
        assert arr.shape == (RES, RES, 3) and arr.dtype == np.float32 and 0 <= arr.min() and arr.max() <= 1, name
        if rgb is not None:
            np.testing.assert_allclose(arr[RES // 2, RES // 2], rgb, atol=0.06, err_msg=name)
    warned = logs()
    assert "3 animated image(s): only the first frame is trained" in warned
    assert all(n in warned for n in ("anim.gif", "anim.webp", "anim_apng.png"))
    assert "exif_rotated.jpg (40x100)" in warned  # sizes are reported as displayed (EXIF applied)
    out = cache(spec, encoders)
    assert out.count == len(expected) and "could not be used" not in logs()


def test_small_extreme_and_one_pixel_images_are_upscaled_and_reported(tmp_path, logs):
    solid_png(tmp_path / "small.png", size=(20, 30))
    solid_png(tmp_path / "wide.png", size=(4000, 16))
    solid_png(tmp_path / "tall.png", size=(16, 4000))
    solid_png(tmp_path / "dot.png", size=(1, 1))
    solid_png(tmp_path / "ok.png", size=(RES, RES))
    load(str(tmp_path))
    warned = logs()
    assert "4 file(s) are smaller than the resolution (64)" in warned and "upscaled" in warned
    assert "small.png (20x30)" in warned and "dot.png (1x1)" in warned
    assert "more than 3 times wider than tall" in warned and "wide.png (4000x16, 0.4% of the picture kept)" in warned
    # the center square is cut before resizing: a 100000x1 strip at 1024 px is one 1x1 crop, not 51 G pixels
    Image.new("RGB", (100_000, 1), (9, 99, 199)).save(tmp_path / "strip.png")
    t0 = time.monotonic()
    arr = load_image(str(tmp_path / "strip.png"), 1024)
    assert arr.shape == (1024, 1024, 3) and time.monotonic() - t0 < 5
    np.testing.assert_allclose(arr[0, 0], np.array([9, 99, 199]) / 255, atol=0.01)


def test_decompression_bombs_are_reported_with_size_and_fix(tmp_path, logs):
    solid_png(tmp_path / "ok.png")
    (tmp_path / "bomb.png").write_bytes(png_bytes(20000, 20000, 1, 0))  # header only: 400 megapixels
    row = b"\x00" + bytes(10000 // 8)
    (tmp_path / "big.png").write_bytes(png_bytes(10000, 10000, 1, 0, row * 10000))  # 100 MP: over the warning limit
    spec = load(str(tmp_path))
    assert names(spec) == ["big.png", "ok.png"]
    warned = logs()
    assert "bomb.png is 400 megapixels, over Pillow's decompression-bomb safety limit of 179 megapixels: " \
           "downscale it" in warned
    assert "over Pillow's decompression-bomb warning limit" in warned and "big.png (10000x10000)" in warned
    for name in ("ok.png", "big.png"):
        os.remove(tmp_path / name)
    with pytest.raises(ds.DatasetError, match="bomb.png is 400 megapixels"):
        load(str(tmp_path))


def test_formats_pillow_cannot_read(tmp_path, logs):
    (tmp_path / "drawing.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    (tmp_path / "iphone.heic").write_bytes(b"\x00\x00\x00\x18ftypheic" + bytes(40))
    with pytest.raises(ds.DatasetError) as err:
        load(str(tmp_path))
    assert "has no images PipeTrain can read" in str(err.value)
    assert "drawing.svg (SVG is a vector format: export it as PNG" in str(err.value)
    assert "iphone.heic (HEIC (iPhone photos) needs a plugin" in str(err.value)
    solid_png(tmp_path / "ok.png")
    (tmp_path / "disguised.png").write_bytes(b"\x00\x00\x00\x18ftypheic" + bytes(40))
    (tmp_path / "page.jpg").write_text("<!DOCTYPE html><html>403 Forbidden</html>")
    assert names(load(str(tmp_path))) == ["ok.png"]
    warned = logs()
    assert "2 file(s) are in a format PipeTrain cannot read and are skipped" in warned
    assert "disguised.png is really a HEIC/HEIF photo, not a .png image" in warned
    assert "page.jpg is really a web page (HTML), probably a failed download" in warned


# ---- broken files --------------------------------------------------------------------------

def test_broken_files_are_skipped_by_name(tmp_path, encoders, logs):
    good = solid_png(tmp_path / "good.png")
    png = encoded(Image.effect_noise((RES, RES), 50).convert("RGB"), format="PNG")
    jpg = encoded(Image.effect_noise((RES, RES), 50).convert("RGB"), format="JPEG")
    gif = encoded(Image.effect_noise((RES, RES), 50).convert("RGB"), format="GIF")
    (tmp_path / "zero.png").write_bytes(b"")
    (tmp_path / "trunc.png").write_bytes(png[: len(png) // 2])
    (tmp_path / "trunc.jpg").write_bytes(jpg[: len(jpg) // 2])
    (tmp_path / "trunc.gif").write_bytes(gif[: len(gif) // 2])
    (tmp_path / "random.png").write_bytes(os.urandom(2000))
    (tmp_path / "clip.png").write_bytes(b"\x00\x00\x00\x18ftypisom" + bytes(40))
    (tmp_path / "x.png").mkdir()
    os.symlink(tmp_path / "gone.png", tmp_path / "dangling.png")
    os.symlink(tmp_path / "loop.png", tmp_path / "loop.png")
    os.mkfifo(tmp_path / "pipe.png")  # opening it would block forever
    # valid chunks and CRCs, damaged compressed pixels: passes the scan, fails while caching
    (tmp_path / "damaged_pixels.png").write_bytes(png_bytes(RES, RES, 8, 2, idat=b"\x78\x9c" + os.urandom(300)))
    spec = load(str(tmp_path))
    assert names(spec) == ["damaged_pixels.png", "good.png"]
    warned = logs()
    assert "10 file(s) cannot be read and are skipped" in warned and "... and 5 more" in warned
    reasons = " ".join(u.reason for u in ds.scan_dataset(spec).unreadable)  # the warning shows the first 5
    for needle in ["zero.png is empty (0 bytes): copy it again",
                   "trunc.png is cut off", "trunc.jpg is cut off", "trunc.gif is cut off",
                   "random.png is not an image Pillow can read (the content does not match the .png name",
                   "clip.png is really a video (MP4/MOV); rename it with its video extension",
                   "x.png is a folder, not an image file", "dangling.png is a broken link",
                   "loop.png is a broken link", "pipe.png is not a regular file"]:
        assert needle in reasons, needle
    out = cache(spec, encoders)
    assert out.count == 1 and CachedDataset(out.cache_dir)[0]["source"] == os.path.basename(good)
    assert "1 image(s) could not be used and are left out of the cache" in logs()
    assert "damaged_pixels.png is damaged or unsupported" in logs()


def test_unreadable_file_and_folder(tmp_path, monkeypatch, logs):
    solid_png(tmp_path / "ok.png")
    locked = solid_png(tmp_path / "locked.png")
    os.chmod(locked, 0)
    try:
        spec = load(str(tmp_path))
        if os.geteuid() != 0:  # root reads mode-000 files, so only a normal user sees the real error
            assert "locked.png cannot be opened (permission denied)" in logs()
    finally:
        os.chmod(locked, 0o644)
    real_open = image_io.Image.open

    def denied(fp, *a, **kw):
        if str(fp) == locked:
            raise PermissionError(13, "Permission denied", fp)
        return real_open(fp, *a, **kw)

    monkeypatch.setattr(image_io.Image, "open", denied)
    assert names(load(str(tmp_path))) == ["ok.png"]
    assert "locked.png cannot be opened (permission denied): make it readable for the user running ComfyUI" in logs()
    monkeypatch.undo()
    real_listdir = os.listdir

    def listdir(folder):
        if str(folder) == str(tmp_path):
            raise PermissionError(13, "Permission denied")
        return real_listdir(folder)

    monkeypatch.setattr(image_io.os, "listdir", listdir)
    with pytest.raises(ds.DatasetError, match="cannot list dataset folder .* make it readable"):
        ds.validate(spec)


def test_all_broken_is_one_clear_error(tmp_path, encoders):
    (tmp_path / "a.png").write_bytes(b"")
    (tmp_path / "b.jpg").write_bytes(os.urandom(100))
    with pytest.raises(ds.DatasetError) as err:
        load(str(tmp_path))
    assert "none of the dataset's 2 image file(s) can be read" in str(err.value)
    assert "a.png is empty (0 bytes)" in str(err.value) and "b.jpg is not an image" in str(err.value)
    # every file passes the scan but none decodes: CacheLatents refuses to write an empty cache
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for n in range(2):
        (damaged / f"d{n}.png").write_bytes(png_bytes(RES, RES, 8, 2, idat=b"\x78\x9c" + os.urandom(200)))
    spec = load(str(damaged))
    with pytest.raises(fmt.CacheError, match=r"none of the dataset's 2 image\(s\) could be decoded.*d0\.png is "):
        cache(spec, encoders)
    assert not list(damaged.glob(".pipetrain_cache/*/manifest.json"))


# ---- captions ------------------------------------------------------------------------------

def test_caption_encodings_and_oddities(tmp_path, encoders, logs):
    for stem in ("utf8", "bom", "latin1", "utf16", "utf16nobom", "empty", "dircap", "upper", "none"):
        solid_png(tmp_path / f"{stem}.png")
    (tmp_path / "utf8.txt").write_text("café, 漢字 🙂", encoding="utf-8")
    (tmp_path / "bom.txt").write_bytes("\ufeffbom café".encode("utf-8"))
    (tmp_path / "latin1.txt").write_bytes("café crème".encode("latin-1"))
    (tmp_path / "utf16.txt").write_text("utf16 café", encoding="utf-16")  # with BOM, as Notepad's "Unicode"
    (tmp_path / "utf16nobom.txt").write_bytes("no bom café".encode("utf-16-le"))
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "dircap.txt").mkdir()
    (tmp_path / "UPPER.TXT").write_text("from windows")
    (tmp_path / "upper.png").rename(tmp_path / "Upper.png")
    spec = load(str(tmp_path))
    captions = {os.path.basename(i.path): i.caption for i in ds.scan_dataset(spec).items}
    assert captions == {"utf8.png": "café, 漢字 🙂", "bom.png": "bom café", "latin1.png": "café crème",
                        "utf16.png": "utf16 café", "utf16nobom.png": "no bom café", "empty.png": "",
                        "dircap.png": "", "Upper.png": "from windows", "none.png": None}
    warned = logs()
    assert "1 caption file(s) are not UTF-8 and were read as Windows-1252/Latin-1" in warned
    assert "latin1.txt ('café crème')" in warned
    assert "look like UTF-16 without a byte-order mark" in warned and "utf16nobom.txt" in warned
    assert "1 caption file(s) are empty" in warned and "empty.txt" in warned
    assert "dircap.txt is a folder, not a text file: rename or remove it" in warned
    assert "match their image only when ignoring upper/lower case" in warned and "Upper.png -> UPPER.TXT" in warned
    assert "1 image(s) have no caption file (.txt)" in warned and "none.png" in warned
    assert "/utf16.txt" not in warned and "/bom.txt" not in warned and "/utf8.txt" not in warned
    stored = {it["source"]: it["caption"] for it in CachedDataset(cache(spec, encoders).cache_dir)}
    assert stored["latin1.png"] == "café crème" and stored["utf8.png"] == "café, 漢字 🙂"


# ---- odd names -----------------------------------------------------------------------------

def test_odd_names_and_shared_stems(tmp_path, encoders, logs):
    odd = ["with space.png", "café.png", "漢字.png", "🙂.png", "-dash.png", "x" * 240 + ".png", "UPPER.PNG",
           "Photo.JPG", "a.png", "a.jpg"]
    for i, name in enumerate(odd):
        Image.new("RGB", (RES, RES), (10 * i, 100, 100)).save(tmp_path / name, format=("JPEG" if "jpg" in name.lower()
                                                                                          else "PNG"))
    (tmp_path / "a.txt").write_text("shared caption")
    (tmp_path / ("x" * 240 + ".txt")).write_text("long")
    solid_png(tmp_path / ".hidden.png")
    solid_png(tmp_path / "._a.png")  # macOS metadata companion: skipped without a word
    (tmp_path / ".pipetrain_cache").mkdir()
    solid_png(tmp_path / ".pipetrain_cache" / "inside.png")
    with open(os.path.join(os.fsencode(tmp_path), b"latin1-\xe9.png"), "wb") as f:
        f.write(encoded(Image.new("RGB", (RES, RES)), format="PNG"))  # a name that is not valid UTF-8
    spec = load(str(tmp_path))
    got = names(spec)
    assert len(got) == len(odd) + 1 and got.index("a.jpg") == got.index("a.png") - 1  # stable: a.jpg before a.png
    warned = logs()
    assert "1 caption file(s) are shared by images with the same name and different extensions" in warned
    assert "a.txt <- a.jpg, a.png" in warned
    assert "1 hidden file(s) (names starting with '.') are skipped" in warned and ".hidden.png" in warned
    assert "._a.png" not in warned and "inside.png" not in warned
    out = cache(spec, encoders)
    items = list(CachedDataset(out.cache_dir))
    sources = {it["source"] for it in items}
    assert out.count == len(got) and sources >= {"café.png", "漢字.png", "🙂.png", "-dash.png", "x" * 240 + ".png"}
    assert "latin1-\ufffd.png" in sources  # a name that is not UTF-8 is stored readable; the file itself was read
    assert sum(it["caption"] == "shared caption" for it in items) == 2


# ---- videos --------------------------------------------------------------------------------

def test_videos_are_skipped_without_video_frames(tmp_path, logs):
    kinds = {write_video(tmp_path / name) for name in ("a.mp4", "b.webm", "c.mov")}
    with pytest.raises(ds.DatasetError) as err:
        load(str(tmp_path))
    assert "holds only videos (3:" in str(err.value) and "set LoadDataset's 'video_frames'" in str(err.value)
    assert "a.mp4" in str(err.value) and "extract frames" in str(err.value)
    solid_png(tmp_path / "still.png")
    animated(tmp_path / "moving.gif", "GIF")  # a GIF "video" is an image: its first frame trains
    assert names(load(str(tmp_path))) == ["moving.gif", "still.png"]
    warned = logs()
    assert "3 video file(s) are skipped: set LoadDataset's 'video_frames'" in warned
    assert "1 animated image(s): only the first frame is trained" in warned
    assert kinds <= {"pyav", "magic bytes"}


# ---- the folders box -----------------------------------------------------------------------

@pytest.mark.parametrize("typed,outcome", [
    ("  cats  ", "cats"),
    ('"cats"', "cats"),
    ("'cats' | repeats=2", "cats"),
    ('" spaced "', " spaced "),
    ("sub\\cats", "sub/cats"),
    ("sub/../cats", "cats"),
    ("../outside", "../outside"),  # '..' may leave the input folder: absolute paths are allowed anyway
    ("cats/a.png", "ERR is a file, not a folder"),
    ("C:\\Users\\me\\cats", "ERR looks like a Windows path"),
    ("", "ERR no dataset folders given"),
    ("  # only a comment", "ERR no dataset folders given"),
    ("| repeats=2", "ERR names no folder"),
    ("no_such_folder", "ERR does not exist (relative paths are looked up in ComfyUI's input folder"),
    ("cats\ncats/", "ERR is listed twice"),
    ("cats\nlink_to_cats", "ERR is listed twice (the same folder as"),
])
def test_folder_box_oddities(tmp_path, monkeypatch, typed, outcome):
    base = tmp_path / "input"
    for sub in ("cats", " spaced ", "sub/cats", "outside"):
        folder = (base / sub) if sub != "outside" else (tmp_path / "outside")
        folder.mkdir(parents=True)
        solid_png(folder / "a.png")
    os.symlink(base / "cats", base / "link_to_cats")
    monkeypatch.setattr(load_node, "_input_dir", lambda: str(base))
    if outcome.startswith("ERR "):
        with pytest.raises(ds.DatasetError) as err:
            load(typed)
        assert outcome[4:] in str(err.value), str(err.value)
        assert load_node.PipeTrainLoadDataset.IS_CHANGED(typed, RES, 1) != load_node.PipeTrainLoadDataset.IS_CHANGED(
            typed, RES, 1)  # NaN: ComfyUI runs the node, which reports the error
    else:
        spec = load(typed)
        assert spec.folders[0].path == os.path.normpath(base / outcome)


def test_absolute_folder_given_twice_and_as_file(tmp_path):
    solid_png(tmp_path / "a.png")
    with pytest.raises(ds.DatasetError, match="listed twice"):
        load(f"{tmp_path}\n{tmp_path}/")
    with pytest.raises(ds.DatasetError, match=re.escape(f"{tmp_path / 'a.png'} is a file, not a folder") + ".*" +
                       re.escape(f"(e.g. {tmp_path})")):
        load(str(tmp_path / "a.png"))


# ---- the cache folder ----------------------------------------------------------------------

def test_cache_location_problems_are_clear(tmp_path, encoders, monkeypatch):
    solid_png(tmp_path / "a.png")
    spec = load(str(tmp_path))
    (tmp_path / ".pipetrain_cache").write_text("not a folder")
    with pytest.raises(fmt.CacheError, match="exists but is not a folder: PipeTrain keeps its latent cache there"):
        cache(spec, encoders)
    (tmp_path / ".pipetrain_cache").unlink()

    def full(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_node, "write_item", full)
    with pytest.raises(fmt.CacheError, match="cannot write the latent cache under .*No space left on device.*writable"):
        cache(spec, encoders)


# ---- a real ComfyUI server -----------------------------------------------------------------

@pytest.mark.slow
def test_server_trains_on_a_mixed_dataset_and_names_the_file_when_all_are_broken(comfy_server, demo_base, tmp_path):
    from tools.comfy_server import ComfyError
    from tools.demo import demo_prompt

    mixed = tmp_path / "mixed"
    shutil.copytree(demo_base["dataset"], mixed, ignore=shutil.ignore_patterns(".*"))
    (mixed / "empty.png").write_bytes(b"")
    (mixed / "noise.jpg").write_bytes(os.urandom(500))
    (mixed / "damaged_pixels.png").write_bytes(png_bytes(RES, RES, 8, 2, idat=b"\x78\x9c" + os.urandom(300)))
    write_video(mixed / "clip.mp4")
    Image.new("RGB", (RES, RES)).save(mixed / "scan.tga")  # issue 3 additions (tests/with_comfy/test_awkward_media.py)
    (mixed / "typo_caption.txt").write_text("matches no image")
    first = sorted(p for p in mixed.iterdir() if p.suffix == ".png" and p.stat().st_size)[0]
    first.with_suffix(".txt").write_text("word " * 100_000)  # cut to MAX_CAPTION_CHARS, not a stall
    prompt = demo_prompt(demo_base, steps=1, processes=1, run_name="awkward")
    prompt = {k: v for k, v in prompt.items() if k in {"1", "2", "3", "4", "5", "6", "7", "8", "23"}}  # up to TrainPipeline
    by_type = {n["class_type"]: n["inputs"] for n in prompt.values()}
    by_type["PipeTrainLoadDataset"]["folders"] = f'  "{mixed}"  '
    entry = comfy_server.run(prompt, timeout=300)
    texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
    assert any("trained 1/1 steps" in t for t in texts), texts
    log = comfy_server.log_text()
    assert "empty.png is empty (0 bytes)" in log and "1 video file(s) are skipped" in log
    assert "damaged_pixels.png is damaged or unsupported" in log
    assert "scan.tga (.tga images are not read by PipeTrain" in log and "typo_caption.txt" in log
    assert "1 caption file(s) are longer than 20000 characters" in log

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "only.png").write_bytes(b"not a png at all")
    by_type["PipeTrainLoadDataset"]["folders"] = str(broken)
    with pytest.raises(ComfyError, match=r"only\.png is not an image Pillow can read"):
        comfy_server.run(prompt, timeout=120)
