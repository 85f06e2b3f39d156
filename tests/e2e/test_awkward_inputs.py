"""Awkward inputs beyond tests/e2e/test_awkward_datasets.py and tests/with_comfy/test_awkward_media.py: caption files
that are pipes, devices or pictures, phone photos stored as MPO, TIFF orientation, PostScript under
an image name, damaged EXIF, media without a known extension, kohya-style folder trees, videos with
transparency or a web page under a video name, and masks that leave nothing to train.

Each case is either used correctly or skipped and reported, counted and naming the file and the fix;
never a hang, a crash or a silently wrong tensor. Real node functions with the tiny ComfyUI VAE and
CLIP in process; one slow test drives a real ComfyUI server. Every file is made here.
"""
from __future__ import annotations

import dataclasses
import io
import os
import threading
import warnings

import numpy as np
import pytest
from pack import load_pack
from PIL import EpsImagePlugin, Image, TiffImagePlugin
from dataset_files import RES, cache, encoders, load, logs, names, solid_png  # noqa: F401

load_pack()
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
import PipeTrain.engine.data.scan as ds  # noqa: E402
from PipeTrain.engine.data.images import load_image  # noqa: E402
import PipeTrain.nodes.load_dataset as load_node  # noqa: E402
from PipeTrain.engine.data.video import VideoReadError, load_video, probe_video  # noqa: E402


def left_black(size=(120, 60)) -> Image.Image:
    im = Image.new("RGB", size, (255, 255, 255))
    im.paste((0, 0, 0), (0, 0, size[0] // 2, size[1]))
    return im


# ---- captions ------------------------------------------------------------------------------

def test_caption_pipes_devices_and_pictures_are_reported_not_read(tmp_path, logs):  # noqa: F811
    for stem in ("fifo", "device", "picture", "invisible", "escape", "ok"):
        solid_png(tmp_path / f"{stem}.png")
    os.mkfifo(tmp_path / "fifo.txt")  # opening it would wait for a writer forever
    os.symlink("/dev/zero", tmp_path / "device.txt")  # never ends
    Image.new("RGB", (8, 8)).save(tmp_path / "picture.txt", format="PNG")
    (tmp_path / "invisible.txt").write_text("\u200b\ufeff a red square \u3000\u200b", encoding="utf-8")
    (tmp_path / "escape.txt").write_bytes(b"a red\x1b square\x07")
    (tmp_path / "ok.txt").write_text("a red square")
    result = {}
    scan = threading.Thread(target=lambda: result.setdefault("spec", load(str(tmp_path))), daemon=True)
    scan.start()
    scan.join(timeout=60)
    assert not scan.is_alive(), "LoadDataset hangs on a caption that is a named pipe"
    captions = {os.path.basename(i.path): i.caption for i in ds.scan_dataset(result["spec"]).items}
    assert captions == {"fifo.png": "", "device.png": "", "picture.png": "", "invisible.png": "a red square",
                        "escape.png": "a red square", "ok.png": "a red square"}
    warned = logs()
    assert "1 caption file(s) cannot be read; their images train with the empty caption" in warned
    assert "fifo.txt is not a regular file (a pipe, socket or device): replace it with a UTF-8 text file" in warned
    assert "device.txt -> /dev/zero" in warned  # a link out of the folder is not read (issue 22 item 10)
    followed = ds.scan_dataset(dataclasses.replace(result["spec"], follow_links=True))  # followed: still not read
    assert "device.txt is not a regular file" in "\n".join(followed.warnings)
    assert {os.path.basename(i.path): i.caption for i in followed.items}["device.png"] == ""
    assert "1 caption file(s) hold binary data, not text" in warned
    assert "picture.txt (a PNG image saved under the caption's name)" in warned
    assert "caption file(s) are empty" not in warned  # each is reported once, as what it is


# ---- still images --------------------------------------------------------------------------

def test_phone_mpo_photo_is_a_still_not_an_animation(tmp_path, logs):  # noqa: F811
    main, depth = Image.new("RGB", (RES, RES), (255, 0, 0)), Image.new("RGB", (RES, RES), (0, 0, 255))
    main.save(tmp_path / "phone.jpg", format="MPO", save_all=True, append_images=[depth])
    with Image.open(tmp_path / "phone.jpg") as im:
        assert im.format == "MPO" and im.is_animated  # what Pillow says about such photos
    assert names(load(str(tmp_path))) == ["phone.jpg"]
    assert "animated" not in logs()
    np.testing.assert_allclose(load_image(str(tmp_path / "phone.jpg"), RES)[5, 5], (1, 0, 0), atol=0.02)
    # in a video dataset a still trains as a 1-frame clip; it used to be skipped as "animated"
    (spec,) = load_node.PipeTrainLoadDataset().load(folders=str(tmp_path), resolution=RES, repeats=1,
                                                    video_frames=1)
    assert names(spec) == ["phone.jpg"]


def test_tiff_orientation_gives_the_displayed_size_and_bucket(tmp_path):
    tags = TiffImagePlugin.ImageFileDirectory_v2()
    tags[274] = 6  # stored 120x60, displayed 60x120
    left_black().save(tmp_path / "turned.tif", tiffinfo=tags)
    exif = Image.Exif()
    exif[0x0112] = 6
    left_black().save(tmp_path / "turned.jpg", exif=exif, quality=95)
    (spec,) = load_node.PipeTrainLoadDataset().load(folders=str(tmp_path), resolution=RES, repeats=1,
                                                    aspect_ratios="1:2, 2:1", bucket_multiple=8)
    items = {os.path.basename(i.path): i for i in ds.scan_dataset(spec).items}
    for name in ("turned.tif", "turned.jpg"):
        item = items[name]
        assert (item.width, item.height) == (60, 120), name  # as displayed, like the JPEG
        (size,) = spec.sizes_for(item.width, item.height)
        assert size[1] > size[0], (name, size)  # a portrait bucket for a portrait picture
        pixels = load_image(item.path, size)
        assert pixels.shape == (size[1], size[0], 3)
        # orientation 6 turns the stored picture upright: its black left half becomes the top half
        assert pixels[: size[1] // 4].mean() < 0.1 and pixels[-size[1] // 4:].mean() > 0.9, name


def test_postscript_under_an_image_name_never_reaches_ghostscript(tmp_path, monkeypatch, logs):  # noqa: F811
    def ghostscript(*a, **kw):
        raise AssertionError("Ghostscript must not run on dataset files")

    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", ghostscript)
    solid_png(tmp_path / "ok.png")
    Image.new("RGB", (RES, RES)).save(tmp_path / "drawing.png", format="EPS")
    Image.new("RGB", (RES, RES)).save(tmp_path / "logo.eps", format="EPS")
    assert names(load(str(tmp_path))) == ["ok.png"]
    warned = logs()
    assert "drawing.png is really a PostScript/EPS drawing, not a .png image: replace it with a PNG or JPEG" in warned
    assert "logo.eps (EPS/PostScript drawings are not read: export it as PNG" in warned


def test_damaged_exif_loads_quietly_as_stored(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6
    exif[0x010E] = "x" * 200  # a long description, so the damage stays inside the EXIF segment
    buf = io.BytesIO()
    left_black().save(buf, format="JPEG", exif=exif)
    data = bytearray(buf.getvalue())
    start = data.find(b"Exif\x00\x00") + 6
    data[start + 8: start + 60] = b"\xee" * 52  # the directory is garbage now
    (tmp_path / "damaged_exif.jpg").write_bytes(bytes(data))
    info = ds.probe_image(str(tmp_path / "damaged_exif.jpg"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pixels = load_image(str(tmp_path / "damaged_exif.jpg"), (info.width, info.height))
    assert (info.width, info.height) == (120, 60)  # the orientation cannot be read: kept as stored, both ways
    assert pixels.shape == (60, 120, 3) and pixels[:, :50].mean() < 0.1
    assert not [str(w.message) for w in caught]  # Pillow's "Corrupt EXIF data" stays out of the console


def test_small_cut_off_jpeg_with_an_embedded_end_marker_is_caught_by_the_scan(tmp_path, logs):  # noqa: F811
    solid_png(tmp_path / "ok.png")
    buf = io.BytesIO()
    Image.effect_noise((256, 256), 60).convert("RGB").save(buf, format="JPEG", quality=95)
    data = buf.getvalue()
    # an end-of-image marker before the picture, as an EXIF thumbnail has one (here in a comment segment)
    comment = b"\xff\xfe" + (2 + 4).to_bytes(2, "big") + b"\xff\xd9ok"
    data = data[:2] + comment + data[2:]
    assert len(data) < 64 * 1024  # all of it in the tail the scan looks at
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) * 2 // 3])
    assert names(load(str(tmp_path))) == ["ok.png"]  # reported when the dataset loads, not only while caching
    assert "cut.jpg is cut off (truncated" in logs()


# ---- names and folders ---------------------------------------------------------------------

def test_media_without_a_known_extension_is_named_with_the_fix(tmp_path, logs):  # noqa: F811
    solid_png(tmp_path / "ok.png")
    Image.new("RGB", (RES, RES)).save(tmp_path / "photo", format="PNG")
    Image.new("RGB", (RES, RES)).save(tmp_path / "tweet.jpg_large", format="JPEG")
    Image.new("RGB", (RES, RES)).save(tmp_path / "moving.apng", format="PNG")
    (tmp_path / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0" + bytes(60))
    (tmp_path / "desktop.ini").write_text("[.ShellClassInfo]")
    (tmp_path / "notes.json").write_text("{}")
    assert names(load(str(tmp_path))) == ["ok.png"]
    warned = logs()
    assert "3 file(s) hold an image or a video but their name lacks a known extension, so they are skipped" in warned
    assert "moving.apng (a PNG image: rename it to moving.png)" in warned
    assert "photo (a PNG image: rename it to photo.png)" in warned
    assert "tweet.jpg_large (a JPEG image: rename it to tweet.jpg)" in warned
    assert "Thumbs.db" not in warned and "desktop.ini" not in warned and "notes.json" not in warned
    os.remove(tmp_path / "ok.png")
    with pytest.raises(ds.DatasetError, match=r"has no file with an image extension, but 3 file\(s\) hold images "
                                              r"or videos: .*moving\.apng \(a PNG image: rename it to moving\.png\)"):
        load(str(tmp_path))


def test_kohya_style_folder_tree_says_which_lines_to_write(tmp_path, logs):  # noqa: F811
    for sub in ("10_cat", "2_dog"):
        (tmp_path / "train" / sub).mkdir(parents=True)
        solid_png(tmp_path / "train" / sub / "a.png")
    (tmp_path / "train" / "empty_sub").mkdir()
    with pytest.raises(ds.DatasetError) as err:
        load(str(tmp_path / "train"))
    message = str(err.value)
    assert "has no images of its own, but 2 subfolder(s) do, and subfolders are not scanned" in message
    assert f"{tmp_path / 'train' / '10_cat'} | repeats=10" in message
    assert f"{tmp_path / 'train' / '2_dog'} | repeats=2" in message and "empty_sub" not in message
    spec = load(f"{tmp_path / 'train' / '10_cat'} | repeats=10\n{tmp_path / 'train' / '2_dog'} | repeats=2")
    assert [f.repeats for f in spec.folders] == [10, 2]  # the suggested lines work as written
    solid_png(tmp_path / "train" / "top.png")  # the parent and its subfolders listed: nothing is left unscanned
    load(f"{tmp_path / 'train'}\n{tmp_path / 'train' / '10_cat'}\n{tmp_path / 'train' / '2_dog'}")
    assert "subfolders are not scanned" not in logs()
    load(str(tmp_path / "train"))
    assert f"subfolder {tmp_path / 'train' / '10_cat'} holds images but subfolders are not scanned" in logs()


def test_captions_saved_with_another_tools_extension_are_pointed_out(tmp_path, logs):  # noqa: F811
    for stem in ("blip", "tagger", "sidecar", "plain"):
        solid_png(tmp_path / f"{stem}.png")
    (tmp_path / "blip.caption").write_text("a red square")
    (tmp_path / "tagger.tags").write_text("red, square")
    (tmp_path / "sidecar.json").write_text("{}")  # metadata, not a caption: not pointed out
    captions = {os.path.basename(i.path): i.caption for i in ds.scan_dataset(load(str(tmp_path))).items}
    assert captions == dict.fromkeys(("blip.png", "plain.png", "sidecar.png", "tagger.png"))  # still the empty caption
    warned = logs()
    assert "4 image(s) have no caption file (.txt)" in warned
    assert ("2 image(s) have no .txt caption but a text file with their name and another extension, which is not "
            "read: rename those to .txt") in warned
    assert "blip.png (blip.caption)" in warned and "tagger.png (tagger.tags)" in warned and "sidecar.json" not in warned


# ---- videos --------------------------------------------------------------------------------

def test_transparent_video_is_composited_over_white_and_fake_video_named(tmp_path):
    import av

    path = tmp_path / "cutout.mov"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("png", rate=8)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "rgba"
        for _ in range(3):
            frame = np.zeros((32, 32, 4), np.uint8)  # black, and fully transparent
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgba")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    assert probe_video(str(path)).frames == 3
    clip = load_video(str(path), (32, 32), frames=3)
    np.testing.assert_allclose(clip, 1.0)  # white, as transparent images are; not the hidden black
    (tmp_path / "download.mp4").write_text("<!DOCTYPE html><html>Please log in</html>")
    with pytest.raises(VideoReadError, match=r"download\.mp4 is really a web page \(HTML\), probably a failed "
                                             r"download, not a video: replace it"):
        probe_video(str(tmp_path / "download.mp4"))


# ---- masks ---------------------------------------------------------------------------------

def test_mask_black_over_the_trained_crop_is_left_out_by_name(tmp_path, encoders, logs):  # noqa: F811
    data, masks = tmp_path / "data", tmp_path / "masks"
    data.mkdir()
    masks.mkdir()
    for stem in ("black", "edges", "half"):
        solid_png(data / f"{stem}.png", size=(RES * 2, RES))
    Image.new("L", (RES * 2, RES), 0).save(masks / "black.png")
    edges = np.zeros((RES, RES * 2), np.uint8)
    edges[:, : RES // 4] = edges[:, -RES // 4:] = 255  # white only where the center crop cuts away
    Image.fromarray(edges).save(masks / "edges.png")
    half = np.zeros((RES, RES * 2), np.uint8)
    half[: RES // 2] = 255
    Image.fromarray(half).save(masks / "half.png")
    (spec,) = load_node.PipeTrainLoadDataset().load(folders=str(data), resolution=RES, repeats=1,
                                                    mask_folder=str(masks))
    out = cache(spec, encoders)
    assert out.count == 1 and [it["source"] for it in CachedDataset(out.cache_dir)] == ["half.png"]
    warned = logs()
    assert "2 image(s) could not be used and are left out of the cache" in warned
    for stem in ("black", "edges"):
        assert (f"masks/{stem}.png is black everywhere in the part of {data / stem}.png that trains at 64x64 "
                "(loss weight 0)") in warned
    assert "delete the mask to train it unmasked" in warned


# ---- a real ComfyUI server -----------------------------------------------------------------

@pytest.mark.slow
def test_server_names_the_subfolder_lines_and_a_pipe_caption_does_not_hang(comfy_server, demo_base, tmp_path):
    from tools.comfy_server import ComfyError
    from tools.demo import demo_prompt

    prompt = demo_prompt(demo_base, steps=1, processes=1, run_name="awkward_inputs")
    prompt = {k: v for k, v in prompt.items() if k in {"1", "2", "3", "4", "5", "6", "7", "8", "23"}}  # up to TrainPipeline
    by_type = {n["class_type"]: n["inputs"] for n in prompt.values()}
    (tmp_path / "train" / "5_shapes").mkdir(parents=True)
    solid_png(tmp_path / "train" / "5_shapes" / "a.png")
    os.mkfifo(tmp_path / "train" / "5_shapes" / "a.txt")
    by_type["PipeTrainLoadDataset"]["folders"] = str(tmp_path / "train")
    with pytest.raises(ComfyError, match=r"but 1 subfolder\(s\) do.*5_shapes \| repeats=5"):
        comfy_server.run(prompt, timeout=120)
    by_type["PipeTrainLoadDataset"]["folders"] = f"{tmp_path / 'train' / '5_shapes'} | repeats=5"
    entry = comfy_server.run(prompt, timeout=300)
    texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
    assert any("trained 1/1 steps" in t for t in texts), texts
    assert "a.txt is not a regular file (a pipe, socket or device)" in comfy_server.log_text()
