"""Unit tests for engine/data/scan.py with generated images (no torch, no ComfyUI)."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from engine.data.images import IMAGE_EXTENSIONS, load_image
from engine.data.messages import DatasetError
from engine.data.scan import DatasetSpec, FolderSpec, files_signature, parse_folder_lines, scan_dataset, validate


def _png(path, size=(40, 30), color=(200, 10, 10), mode="RGB"):
    Image.new(mode, size, color).save(path)
    return str(path)


def _spec(*folders, resolution=64, repeats=1):
    return DatasetSpec(folders=tuple(FolderSpec(str(f), repeats) for f in folders), resolution=resolution)


# ---- scanning ------------------------------------------------------------------------------

def test_scan_order_captions_and_missing(tmp_path):
    for name in ["b.png", "Z.jpg", "c.webp", "a.png"]:
        Image.new("RGB", (32, 32), (1, 2, 3)).save(tmp_path / name)
    (tmp_path / "a.txt").write_text("  a red cat \n", encoding="utf-8")
    (tmp_path / "b.txt").write_bytes("\ufeffbom caption".encode("utf-8"))  # Notepad-style BOM
    (tmp_path / "notes.md").write_text("not an image")
    result = scan_dataset(_spec(tmp_path))
    names = [os.path.basename(i.path) for i in result.items]
    assert names == ["a.png", "b.png", "c.webp", "Z.jpg"]  # case-insensitive (a plain sort puts Z first)
    captions = {os.path.basename(i.path): i.caption for i in result.items}
    assert captions == {"a.png": "a red cat", "Z.jpg": None, "b.png": "bom caption", "c.webp": None}
    assert result.missing_captions.count == 2
    assert any("2 image(s) have no caption" in w for w in result.warnings)
    assert all(i.size_bytes > 0 and i.mtime_ns > 0 for i in result.items)
    assert scan_dataset(_spec(tmp_path)) == result  # stable


def test_repeats_per_folder_and_folder_order(tmp_path):
    a, b = tmp_path / "z_first", tmp_path / "a_second"
    a.mkdir(), b.mkdir()
    _png(a / "1.png"), _png(b / "1.png")
    spec = DatasetSpec(folders=(FolderSpec(str(a), 3), FolderSpec(str(b), 1)), resolution=64)
    items = scan_dataset(spec).items
    assert [(os.path.basename(os.path.dirname(i.path)), i.repeats) for i in items] == [("z_first", 3), ("a_second", 1)]


def test_broken_files_reported_by_name(tmp_path):
    _png(tmp_path / "good.png")
    full = io.BytesIO()
    Image.new("RGB", (64, 64), (9, 9, 9)).save(full, format="PNG")
    (tmp_path / "truncated.png").write_bytes(full.getvalue()[: len(full.getvalue()) // 2])
    (tmp_path / "text.png").write_text("I am really a text file")
    (tmp_path / "empty.png").write_bytes(b"")
    result = scan_dataset(_spec(tmp_path))
    assert [os.path.basename(i.path) for i in result.items] == ["good.png"]
    bad = {os.path.basename(u.path): u.reason for u in result.unreadable}
    assert set(bad) == {"truncated.png", "text.png", "empty.png"}
    assert all(reason for reason in bad.values())
    warning = next(w for w in result.warnings if "cannot be read" in w)
    assert "truncated.png" in warning and "empty.png" in warning


def test_all_unreadable_raises_with_names(tmp_path):
    (tmp_path / "x.png").write_bytes(b"")
    (tmp_path / "y.jpg").write_text("nope")
    with pytest.raises(DatasetError) as e:
        validate(_spec(tmp_path))
    msg = str(e.value)
    assert "x.png is empty (0 bytes)" in msg and "y.jpg is not an image" in msg and "re-export it" in msg


def test_hidden_cache_folder_ignored_and_subfolder_warned(tmp_path):
    _png(tmp_path / "a.png")
    (tmp_path / ".pipetrain_cache").mkdir()
    _png(tmp_path / ".pipetrain_cache" / "hidden.png")
    (tmp_path / "more").mkdir()
    _png(tmp_path / "more" / "b.png")
    result = validate(_spec(tmp_path))
    assert len(result.items) == 1
    assert any("subfolder" in w and "more" in w for w in result.warnings)


# ---- errors --------------------------------------------------------------------------------

def test_empty_folder_names_folder_and_extensions(tmp_path):
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(DatasetError) as e:
        validate(_spec(tmp_path))
    assert str(tmp_path) in str(e.value) and ".png" in str(e.value) and ".jpg" in str(e.value)


def test_missing_folder_message_says_relative_to_input(tmp_path):
    with pytest.raises(DatasetError) as e:
        parse_folder_lines("no_such_set", str(tmp_path), 1)
    msg = str(e.value)
    assert str(tmp_path / "no_such_set") in msg and "ComfyUI's input folder" in msg and "line 1" in msg
    with pytest.raises(DatasetError) as e:
        validate(_spec(tmp_path / "gone"))
    assert str(tmp_path / "gone") in str(e.value) and "does not exist" in str(e.value)


@pytest.mark.parametrize("res", [0, 32, 100, 4160, 8192])
def test_bad_resolution(tmp_path, res):
    _png(tmp_path / "a.png")
    with pytest.raises(DatasetError) as e:
        validate(_spec(tmp_path, resolution=res))
    assert f"resolution is {res}" in str(e.value) and "multiple of 64" in str(e.value)


def test_folder_line_syntax(tmp_path):
    (tmp_path / "cats").mkdir()
    (tmp_path / "dogs").mkdir()
    text = f"# comment\n\n cats | repeats=3\n\"{tmp_path / 'dogs'}\"\n"
    folders = parse_folder_lines(text, str(tmp_path), 2)
    assert folders == (FolderSpec(str(tmp_path / "cats"), 3), FolderSpec(str(tmp_path / "dogs"), 2))
    for bad in ["cats | 3x", "cats | repeats=0", "cats | times=2"]:
        with pytest.raises(DatasetError, match="repeats=N"):
            parse_folder_lines(bad, str(tmp_path), 1)
    with pytest.raises(DatasetError, match="at least one folder"):
        parse_folder_lines("\n# nothing\n", str(tmp_path), 1)
    with pytest.raises(DatasetError, match="absolute path"):
        parse_folder_lines("cats", None, 1)


def test_duplicate_folder_rejected(tmp_path):
    _png(tmp_path / "a.png")
    spec = DatasetSpec(folders=(FolderSpec(str(tmp_path)), FolderSpec(str(tmp_path) + os.sep)), resolution=64)
    with pytest.raises(DatasetError, match="listed twice"):
        validate(spec)


def test_spec_roundtrip_and_unknown_keys():
    spec = DatasetSpec(folders=(FolderSpec("/a", 2), FolderSpec("/b")), resolution=512)
    assert DatasetSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(DatasetError, match="unknown setting"):
        DatasetSpec.from_dict({**spec.to_dict(), "bucket_mode": "x"})


def test_files_signature_tracks_captions(tmp_path):
    _png(tmp_path / "a.png")
    spec = _spec(tmp_path)
    before = files_signature(spec)
    assert files_signature(spec) == before
    (tmp_path / "a.txt").write_text("new caption")
    assert files_signature(spec) != before


# ---- loading -------------------------------------------------------------------------------

def _check_rgb(arr, res):
    assert arr.shape == (res, res, 3) and arr.dtype == np.float32
    assert 0.0 <= arr.min() and arr.max() <= 1.0


def test_modes_convert_to_rgb(tmp_path):
    res = 64
    cases = {
        "rgba.png": Image.new("RGBA", (80, 64), (255, 0, 0, 0)),  # fully transparent red -> white
        "la.png": Image.new("LA", (64, 90), (0, 0)),  # transparent black -> white
        "l.png": Image.new("L", (64, 64), 128),
        "cmyk.jpg": Image.new("CMYK", (70, 64), (0, 255, 255, 0)),  # red in CMYK
        "p.gif": Image.new("RGB", (64, 64), (0, 0, 255)).convert("P"),
        "i16.png": Image.fromarray(np.full((64, 100), 65535 // 2, dtype=np.uint16)),
    }
    for name, im in cases.items():
        im.save(tmp_path / name)
    out = {name: load_image(str(tmp_path / name), res) for name in cases}
    for arr in out.values():
        _check_rgb(arr, res)
    np.testing.assert_allclose(out["rgba.png"], 1.0, atol=1e-6)
    np.testing.assert_allclose(out["la.png"], 1.0, atol=1e-6)
    np.testing.assert_allclose(out["l.png"], 128 / 255, atol=1e-6)
    r, g, b = out["cmyk.jpg"][32, 32]
    assert r > 0.9 and g < 0.1 and b < 0.1
    np.testing.assert_allclose(out["p.gif"][32, 32], [0, 0, 1], atol=0.02)
    np.testing.assert_allclose(out["i16.png"], 0.5, atol=1e-3)  # 16-bit gray kept at full precision


def test_rgba_partial_alpha_over_white(tmp_path):
    Image.new("RGBA", (64, 64), (0, 0, 0, 128)).save(tmp_path / "half.png")
    arr = load_image(str(tmp_path / "half.png"), 64)
    np.testing.assert_allclose(arr, 127 / 255, atol=1 / 255)


def test_exif_rotation_applied(tmp_path):
    im = Image.new("RGB", (120, 64), (0, 0, 0))
    im.paste((255, 255, 255), (0, 0, 60, 64))  # left half white as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": stored left half ends up on top
    im.save(tmp_path / "rot.jpg", exif=exif, quality=95)
    arr = load_image(str(tmp_path / "rot.jpg"), 64)
    _check_rgb(arr, 64)
    top, bottom = arr[:20].mean(), arr[-20:].mean()
    assert top > 0.8 and bottom < 0.2


def test_resize_shorter_side_then_center_crop(tmp_path):
    im = Image.new("RGB", (300, 100), (255, 0, 0))
    im.paste((0, 255, 0), (100, 0, 200, 100))  # green middle third survives the center crop
    im.save(tmp_path / "wide.png")
    arr = load_image(str(tmp_path / "wide.png"), 64)
    _check_rgb(arr, 64)
    np.testing.assert_allclose(arr[32, 32], [0, 1, 0], atol=0.02)
    small = Image.new("RGB", (20, 30), (10, 20, 30))
    small.save(tmp_path / "small.png")
    _check_rgb(load_image(str(tmp_path / "small.png"), 128), 128)  # upscaled


def test_every_listed_extension_is_readable(tmp_path):
    formats = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".jfif": "JPEG", ".webp": "WEBP", ".bmp": "BMP",
               ".tif": "TIFF", ".tiff": "TIFF", ".gif": "GIF"}
    if ".avif" in IMAGE_EXTENSIONS:  # listed only when this Pillow was built with AVIF
        formats[".avif"] = "AVIF"
    assert set(formats) == set(IMAGE_EXTENSIONS)
    for ext, fmt in formats.items():
        Image.new("RGB", (64, 64), (10, 200, 30)).save(tmp_path / f"img{ext}", format=fmt)
    result = validate(_spec(tmp_path))
    assert len(result.items) == len(formats) and not result.unreadable
    for item in result.items:
        _check_rgb(load_image(item.path, 64), 64)
