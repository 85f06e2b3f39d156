"""Dataset faults of issue 22 (items 10-13, 15, 16) that need no ComfyUI: links leaving the dataset
folder, '#' and quoted folder lines, same-size edits with a restored mtime, CRLF captions, the
report's counts and bucket notices, and a taken LoRA name found before training.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.data.buckets import auto_ratios
from PipeTrain.engine.data.captions import read_caption
from PipeTrain.engine.data.messages import DatasetError
from PipeTrain.engine.data.scan import (
    DatasetSpec,
    FolderSpec,
    files_signature,
    folder_line_notes,
    parse_folder_lines,
    scan_dataset,
)
import PipeTrain.nodes.load_dataset as load_node
import PipeTrain.nodes.save_checks as save_node


def _png(path, colour=(200, 30, 30), size=(64, 64)):
    Image.new("RGB", size, colour).save(path)
    return str(path)


def _spec(folder, **kw) -> DatasetSpec:
    return DatasetSpec(folders=(FolderSpec(str(folder)),), resolution=64, **kw)


def _names(result) -> list[str]:
    return [os.path.basename(i.path) for i in result.items]


# ---- 10: links that leave the dataset folder -------------------------------------------------

@pytest.fixture
def linked(tmp_path):
    """A dataset folder with links out of it (an image, a caption, a mask) and one link inside it."""
    outside, data, masks = tmp_path / "elsewhere", tmp_path / "data", tmp_path / "masks"
    for d in (outside, data, masks):
        d.mkdir()
    _png(outside / "secret.png")
    (outside / "hostname").write_text("secret-host\n")
    _png(data / "a.png")
    _png(data / "b.png")
    _png(outside / "mask_b.png", (255, 255, 255))
    os.symlink(outside / "secret.png", data / "link.png")
    os.symlink(outside / "hostname", data / "a.txt")
    os.symlink(data / "a.png", data / "same_folder.png")  # stays inside: always read
    os.symlink(outside / "mask_b.png", masks / "b.png")
    return data, masks


def test_links_leaving_the_folder_are_skipped_and_listed(linked):
    data, masks = linked
    result = scan_dataset(_spec(data, mask_folder=str(masks)))
    assert _names(result) == ["a.png", "same_folder.png"]  # b.png: its mask is a link out, so it is skipped
    captions = {os.path.basename(i.path): i.caption for i in result.items}
    assert captions["a.png"] == "" and "secret-host" not in json.dumps(captions)
    text = "\n".join(result.warnings)
    assert "2 file(s) are links to a file outside their folder and are skipped" in text
    assert f"{data / 'link.png'} -> {data.parent / 'elsewhere' / 'secret.png'}" in text
    assert f"{masks / 'b.png'} -> " in text and "follow_links" in text
    assert "1 caption file(s) are links to a file outside their folder" in text and str(data / "a.txt") in text
    rows = {kind: n for kind, n, _ in result.report}
    assert rows["outside_link"] == 2 and rows["caption_link"] == 1 and result.skipped == 2


def test_follow_links_reads_them(linked):
    data, masks = linked
    result = scan_dataset(_spec(data, mask_folder=str(masks), follow_links=True))
    assert _names(result) == ["a.png", "b.png", "link.png", "same_folder.png"]
    assert result.items[0].caption == "secret-host" and result.items[1].mask is not None
    assert not any("outside their folder" in w for w in result.warnings)


def test_follow_links_is_a_node_input_and_old_specs_still_load(linked):
    data, _ = linked
    optional = load_node.PipeTrainLoadDataset.INPUT_TYPES()["optional"]
    assert optional["follow_links"][1]["default"] is False and "outside" in optional["follow_links"][1]["tooltip"]
    # added at the end, in order (target_fps, then the caption options came later): saved workflows store
    # widget values by position. add_to is a link (no widget value), so it may come first
    assert list(optional) == ["add_to", "aspect_ratios", "extra_resolutions", "bucket_multiple", "video_frames",
                              "frame_stride", "mask_folder", "control_folder", "follow_links", "target_fps",
                              "caption_prefix", "caption_lines", "tag_shuffles", "keep_tokens", "caption_dropout",
                              "frame_buckets", "clip_mode", "batch_sizes"]
    (spec,) = load_node.PipeTrainLoadDataset().load(folders=str(data), resolution=64, repeats=1)
    assert spec.follow_links is False and "follow_links" not in spec.to_dict()  # old dicts stay equal
    old = {"folders": [{"path": str(data), "repeats": 1}], "resolution": 64, "caption_ext": ".txt", "version": 1}
    assert DatasetSpec.from_dict(old) == _spec(data)
    on = _spec(data, follow_links=True)
    assert DatasetSpec.from_dict(on.to_dict()) == on and files_signature(on) != files_signature(_spec(data))


# ---- 11: the folders box ---------------------------------------------------------------------

def test_comment_lines_are_reported_and_quotes_keep_hash_and_pipe(tmp_path):
    for name in ("my_set", "#1 cats", "a | b"):
        (tmp_path / name).mkdir()
    text = "my_set\n#1 cats\n# just a note"
    assert parse_folder_lines(text, str(tmp_path)) == (FolderSpec(str(tmp_path / "my_set")),)
    notes = folder_line_notes(text, str(tmp_path))
    assert len(notes) == 2
    assert notes[0].startswith("folders line 2 ('#1 cats') starts with '#', so it is a comment and is not used")
    assert "a folder named '#1 cats' exists; to train it, write the line as \"#1 cats\"" in notes[0]
    assert notes[1] == "folders line 3 ('# just a note') starts with '#', so it is a comment and is not used."
    quoted = parse_folder_lines('"#1 cats" | repeats=2\n"a | b"\n\'my_set\' | repeats = 3', str(tmp_path))
    assert quoted == (FolderSpec(str(tmp_path / "#1 cats"), 2), FolderSpec(str(tmp_path / "a | b")),
                      FolderSpec(str(tmp_path / "my_set"), 3))
    absolute = f'"{tmp_path / "a | b"}" | repeats=4'
    assert parse_folder_lines(absolute, None) == (FolderSpec(str(tmp_path / "a | b"), 4),)
    with pytest.raises(DatasetError, match="put the name in quotes"):
        parse_folder_lines("a | b", str(tmp_path))
    with pytest.raises(DatasetError, match="only '| repeats=N' may follow it"):
        parse_folder_lines('"my_set" extra', str(tmp_path))


def test_a_lone_comment_line_says_why_nothing_is_used(tmp_path):
    (tmp_path / "#1 cats").mkdir()
    with pytest.raises(DatasetError) as err:
        parse_folder_lines("#1 cats", str(tmp_path))
    message = str(err.value)
    assert message.startswith("no dataset folders given") and "line 1 ('#1 cats') starts with '#'" in message
    assert "write the line as \"#1 cats\"" in message


def test_node_reports_the_comment_line(tmp_path, monkeypatch):
    for name in ("my_set", "#1 cats"):
        (tmp_path / name).mkdir()
        _png(tmp_path / name / "a.png")
    monkeypatch.setattr(load_node, "_input_dir", lambda: str(tmp_path))
    out = load_node.PipeTrainLoadDataset().load_and_report(folders="my_set\n#1 cats", resolution=64, repeats=1)
    text = out["ui"]["text"]
    assert text[0].startswith("1 image(s) in 1 folder(s)")
    assert any("folders line 2 ('#1 cats')" in line and "exists" in line for line in text)
    assert {"reason": "folder_line", "count": 1}.items() <= out["ui"]["pipetrain_report"][-1].items()


# ---- 12: an edit that keeps size and mtime ---------------------------------------------------

def test_same_size_edit_with_restored_mtime_changes_the_signature_and_the_digest(tmp_path):
    from PipeTrain.engine.cache import digests as digest_module

    image = tmp_path / "a.bmp"  # BMP: same size in bytes for any pixels of the same dimensions
    Image.new("RGB", (64, 64), (10, 10, 10)).save(image)
    spec = _spec(tmp_path)
    items = list(scan_dataset(spec).items)
    before_sig, before = files_signature(spec), digest_module.content_digests(spec, items)
    st = os.stat(image)
    size = st.st_size
    Image.new("RGB", (64, 64), (250, 250, 250)).save(str(image) + ".new", format="BMP")
    shutil.copyfile(str(image) + ".new", image)  # in place: same inode, like cp -p
    os.remove(str(image) + ".new")
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(image).st_size == size and os.stat(image).st_mtime_ns == st.st_mtime_ns
    assert files_signature(spec) != before_sig  # IS_CHANGED: ComfyUI runs the nodes again
    assert digest_module.content_digests(spec, list(scan_dataset(spec).items)) != before


def test_digests_are_read_once_per_unchanged_file(tmp_path, monkeypatch):
    from PipeTrain.engine.cache import digests as digest_module

    for i in range(3):
        _png(tmp_path / f"{i}.png", (i * 40, 0, 0))
    spec = _spec(tmp_path)
    items = list(scan_dataset(spec).items)
    reads = []
    real = digest_module.file_digest
    monkeypatch.setattr(digest_module, "file_digest", lambda p: reads.append(p) or real(p))
    first = digest_module.content_digests(spec, items)
    assert len(reads) == 3
    assert digest_module.content_digests(spec, items) == first and len(reads) == 3  # stat only
    os.chmod(items[1].path, 0o600)  # a new ctime: read again, same digest
    assert digest_module.content_digests(spec, items) == first and reads[3:] == [items[1].path]


# ---- 13: CRLF captions -----------------------------------------------------------------------

def test_crlf_and_cr_line_ends_become_newlines(tmp_path):
    crlf = tmp_path / "a.txt"
    crlf.write_bytes(b"\xef\xbb\xbfcaption\r\nmore\r\n")
    assert read_caption(str(crlf))[0] == "caption\nmore"
    cr = tmp_path / "b.txt"
    cr.write_bytes(b"old mac\rline\r")
    assert read_caption(str(cr))[0] == "old mac\nline"


# ---- 15: the report --------------------------------------------------------------------------

def _short_clip(path, frames=4):
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width = stream.height = 32
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 60 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_summary_counts_every_skipped_file(tmp_path):
    _png(tmp_path / "still.png")
    _short_clip(tmp_path / "short.mp4")
    frames = [Image.new("RGB", (64, 64), c) for c in ((255, 0, 0), (0, 0, 255))]
    frames[0].save(tmp_path / "moving.webp", save_all=True, append_images=frames[1:], duration=100, loop=0)
    out = load_node.PipeTrainLoadDataset().load_and_report(folders=str(tmp_path), resolution=64, repeats=1,
                                                          video_frames=17)
    summary = out["ui"]["text"][0]
    assert "2 file(s) skipped (1 video(s) shorter than a clip, 1 animated image(s) while video_frames is set)" in summary
    assert "0 video(s) skipped" not in summary
    report = {row["reason"]: row for row in out["ui"]["pipetrain_report"]}
    assert report["short"]["count"] == 1 and report["short"]["first"][0].startswith(str(tmp_path / "short.mp4"))
    assert report["animated_video"] == {"reason": "animated_video", "count": 1, "first": [str(tmp_path / "moving.webp")]}
    assert any("video(s) are shorter than one clip" in line for line in out["ui"]["text"])


def test_merged_buckets_get_a_notice_and_the_crop_advice_fits(tmp_path):
    _png(tmp_path / "wide.png", size=(512, 64))  # 8:1, far wider than the widest auto ratio (2:1)
    merged = scan_dataset(_spec(tmp_path, aspect_ratios=auto_ratios()))
    text = "\n".join(merged.warnings)
    assert "the 9 ratios round to only 1 bucket shape(s) at resolution 64 with bucket_multiple 64: 64x64" in text
    assert "Set bucket_multiple to 8" in text
    crop = next(w for w in merged.warnings if "wider than tall" in w)
    assert "add aspect ratios" not in crop and "lower bucket_multiple or raise the resolution" in crop
    square = next(w for w in scan_dataset(_spec(tmp_path)).warnings if "wider than tall" in w)
    assert "set aspect_ratios (e.g. 'auto'" in square
    roomy = DatasetSpec((FolderSpec(str(tmp_path)),), resolution=512, aspect_ratios=auto_ratios())
    wide = scan_dataset(roomy).warnings
    assert not any("round to only" in w for w in wide)
    assert "add ratios as wide as theirs" in next(w for w in wide if "wider than tall" in w)


# ---- 16: a taken LoRA name -------------------------------------------------------------------

def _graph(name, overwrite=False) -> dict:
    return {"8": {"class_type": "PipeTrainTrainPipeline", "inputs": {}},
            "9": {"class_type": "PipeTrainSaveLoRA", "inputs": {"run": ["8", 0], "name": name, "overwrite": overwrite}},
            "12": {"class_type": "PipeTrainSaveLoRA", "inputs": {"run": ["99", 0], "name": "other_run's"}}}


def test_a_taken_lora_name_is_found_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(save_node.compat, "first_folder", lambda kind: str(tmp_path))
    (tmp_path / "pipetrain").mkdir()
    (tmp_path / "pipetrain" / "taken.safetensors").write_bytes(b"someone's LoRA")
    with pytest.raises(ConfigError, match=r"name 'taken' is taken: .*taken\.safetensors already exists and overwrite "
                                          r"is off.*Nothing was trained"):
        save_node.check_save_names(_graph("taken"), "8")
    save_node.check_save_names(_graph("taken", overwrite=True), "8")
    save_node.check_save_names(_graph("free"), "8")
    save_node.check_save_names(_graph(["20", 0]), "8")  # a name wired from another node: SaveLoRA checks it
    save_node.check_save_names(_graph("taken"), "7")  # fed by another TrainPipeline
    with pytest.raises(ConfigError, match="not allowed"):
        save_node.check_save_names(_graph("../escape"), "8")
    assert (tmp_path / "pipetrain" / "taken.safetensors").read_bytes() == b"someone's LoRA"
