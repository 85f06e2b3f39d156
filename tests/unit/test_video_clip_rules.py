"""Video clips without video files: frame buckets (each video to the longest length it fills), clip modes
(which frames each clip takes, in frames and by timestamp), the values refused with their fix, the cache
entries and fingerprint, and the VAE's 4k+1 rule. Real files and a real cache: tests/with_comfy/test_video_clips.py."""
from __future__ import annotations

import dataclasses

import pytest

from pack import load_pack

load_pack()
from PipeTrain.engine.cache.format import fingerprint, item_key  # noqa: E402
from PipeTrain.engine.cache.vae_frame_rate import check_clip_lengths  # noqa: E402
from PipeTrain.engine.data.frame_buckets import check_clip_settings, parse_frame_buckets  # noqa: E402
from PipeTrain.engine.data.frame_picks import clip_starts, longest_bucket, pick_frames  # noqa: E402
from PipeTrain.engine.data.messages import DatasetError  # noqa: E402
from PipeTrain.engine.data.scan import DatasetItem, DatasetSpec, FolderSpec, cache_entries  # noqa: E402
from headless_config import cache_config_error

pytestmark = pytest.mark.core

AT_30 = [i / 30 for i in range(100)]  # a 100-frame video at 30 fps


def clips(times, frames, mode, fps=0.0, stride=1):
    return [pick_frames(times, frames, fps, stride, start) for start in clip_starts(times, frames, fps, stride, mode)]


def test_each_clip_mode_picks_its_frames():
    assert clips(AT_30, 33, "single_beginning") == [list(range(0, 33))]
    assert clips(AT_30, 33, "single_middle") == [list(range(33, 66))]  # 33 frames cut before, 34 after
    # 100 frames need ceil(100 / 33) = 4 clips of 33: from the first frame to the last, spread evenly
    over = clips(AT_30, 33, "multiple_overlapping")
    assert [c[0] for c in over] == [0, 22, 45, 67] and over[-1][-1] == 99
    assert all(c == list(range(c[0], c[0] + 33)) for c in over)
    assert set().union(*over) == set(range(100))  # every frame trains
    # 99 frames fit 3 clips of 33 exactly: no overlap; a video of exactly one clip gives that clip
    assert [c[0] for c in clips(AT_30[:99], 33, "multiple_overlapping")] == [0, 33, 66]
    assert clips(AT_30[:33], 33, "multiple_overlapping") == [list(range(33))]
    # stride 2: a clip of 17 spans 33 source frames, so the same starts
    assert [c[0] for c in clips(AT_30, 17, "multiple_overlapping", stride=2)] == [0, 22, 45, 67]
    assert clip_starts(AT_30[:20], 33, 0.0, 1, "single_middle") == []  # too short: no clip


def test_clip_modes_by_timestamp_keep_the_models_frame_spacing():
    at_60 = [i / 60 for i in range(120)]  # 2 s at 60 fps, sampled for a 16 fps model: clips of 9 span 0.5 s
    for mode in ("single_beginning", "single_middle", "multiple_overlapping"):
        for start in clip_starts(at_60, 9, 16.0, 1, mode):
            picks = pick_frames(at_60, 9, 16.0, 1, start)
            # frame i is the source frame nearest start + i/16 s: frames 1/16 s apart, to half a source frame
            assert all(abs(at_60[p] - (start + i / 16)) <= 1 / 120 + 1e-9 for i, p in enumerate(picks)), mode
    (middle,) = clips(at_60, 9, "single_middle", fps=16.0)
    assert at_60[middle[0]] - at_60[0] == pytest.approx(at_60[-1] - at_60[middle[-1]], abs=1 / 60 + 1e-9)
    over = clips(at_60, 9, "multiple_overlapping", fps=16.0)
    assert len(over) == 4 and over[0][0] == 0 and over[-1][-1] == 119  # 2 s / (9 / 16 s) -> 4 clips, to the end
    # a video slower than the model (8 fps for 30 fps clips) repeats frames: clips that would pick the same
    # frames are taken once
    at_8 = [i / 8 for i in range(5)]
    assert longest_bucket(at_8, (17,), 30.0) == 17 and len(clips(at_8, 17, "multiple_overlapping", fps=30.0)) == 1
    # at the source's own rate the timestamp rules give the frame-count rules' frames
    for mode in ("single_middle", "multiple_overlapping"):
        assert clips(AT_30, 33, mode, fps=30.0) == clips(AT_30, 33, mode)


def test_a_video_goes_to_the_longest_bucket_it_fills():
    assert longest_bucket(AT_30[:40], (17, 33, 65), 0.0) == 33
    assert longest_bucket(AT_30[:33], (17, 33, 65), 0.0) == 33  # exactly one clip long
    assert longest_bucket(AT_30[:100], (17, 33, 65), 0.0) == 65
    assert longest_bucket(AT_30[:16], (17, 33, 65), 0.0) is None  # shorter than every bucket
    assert longest_bucket(AT_30[:40], (17, 33), 16.0) == 17  # 40 frames at 30 fps = 1.3 s; 33 at 16 fps need 2 s


@pytest.mark.parametrize("settings, words", [
    ((0, (0, 17), "single_beginning"), "frame_buckets lists 0: every clip length must be a whole number"),
    ((0, (-5,), "single_beginning"), "frame_buckets lists -5"),
    ((0, (17,), "random"), "clip_mode is 'random': use single_beginning, single_middle, multiple_overlapping"),
    ((9, (17, 33), "single_beginning"), "Set video_frames to 0 .* or add 9 to frame_buckets"),
    ((-1, (), "single_beginning"), "video_frames is -1"),
])
def test_bad_clip_settings_are_refused_with_the_fix(settings, words):
    with pytest.raises(DatasetError, match=words):
        check_clip_settings(*settings)
    spec = DatasetSpec(folders=(FolderSpec("/d"),), resolution=64, video_frames=settings[0],
                       frame_buckets=settings[1], clip_mode=settings[2])
    with pytest.raises(DatasetError, match=words):  # the spec's own check (node, run.json, cache.json) says the same
        spec.check()


def test_frame_buckets_text_and_json():
    assert parse_frame_buckets("33, 17 65;17") == (17, 33, 65) and parse_frame_buckets("") == ()
    assert parse_frame_buckets([33, 17]) == (17, 33)
    with pytest.raises(DatasetError, match="frame_buckets entry 'x17' is not a whole number"):
        parse_frame_buckets("x17, 33")
    with pytest.raises(DatasetError, match="a list of whole numbers"):
        DatasetSpec.from_dict({"folders": [{"path": "/d"}], "resolution": 64, "frame_buckets": [17.5]})
    spec = DatasetSpec(folders=(FolderSpec("/d"),), resolution=64, frame_buckets=(17, 33), clip_mode="single_middle")
    assert spec.to_dict()["frame_buckets"] == [17, 33] and spec.to_dict()["clip_mode"] == "single_middle"
    assert DatasetSpec.from_dict(spec.to_dict()) == spec and spec.clip_lengths == (17, 33) and spec.bucketed
    old = DatasetSpec(folders=(FolderSpec("/d"),), resolution=64, video_frames=17)
    assert "frame_buckets" not in old.to_dict() and "clip_mode" not in old.to_dict() and old.clip_lengths == (17,)
    spec.check()
    DatasetSpec(folders=(FolderSpec("/d"),), resolution=64, video_frames=17, frame_buckets=(17, 33)).check()


class _VideoVAE:
    """Stands in for ComfyUI's VAE: what temporal_compression_decode says (4 for Wan, 8 for LTXV, None: images)."""

    def __init__(self, per_latent):
        self.per_latent = per_latent

    def temporal_compression_decode(self):
        return self.per_latent


def test_clip_lengths_must_suit_the_vae():
    spec = DatasetSpec(folders=(FolderSpec("/d"),), resolution=64, frame_buckets=(17, 20))
    with pytest.raises(DatasetError, match="20 frames per clip does not suit the VAE .* clips need 4k\\+1 frames. "
                                           "Use 17 or 21 instead of 20"):
        check_clip_lengths(spec, _VideoVAE(4))
    with pytest.raises(DatasetError, match="8k\\+1 frames. Use 17 or 25 instead of 20"):
        check_clip_lengths(spec, _VideoVAE(8))
    with pytest.raises(DatasetError, match="Use 17 or 21 instead of 18"):  # video_frames is held to the same rule
        check_clip_lengths(DatasetSpec(folders=spec.folders, resolution=64, video_frames=18), _VideoVAE(4))
    check_clip_lengths(dataclasses.replace(spec, frame_buckets=(1, 17, 33)), _VideoVAE(4))
    check_clip_lengths(dataclasses.replace(spec, frame_buckets=(25, 49)), _VideoVAE(8))
    check_clip_lengths(spec, _VideoVAE(None))  # an image VAE has no such rule
    check_clip_lengths(spec, object())  # nor has an object that does not say


def test_each_clip_is_a_cache_entry_and_part_of_the_cache_key():
    spec = DatasetSpec(folders=(FolderSpec("/d"),), resolution=64, frame_buckets=(17, 33),
                       clip_mode="multiple_overlapping", extra_resolutions=(128,))
    video = DatasetItem("/d/a.mkv", "a", 1, 10, 5, 64, 64, 100, clip_frames=33, clip_starts=(0.0, 0.7, 1.5, 2.2))
    image = DatasetItem("/d/b.png", "b", 1, 10, 5, 64, 64)
    entries = cache_entries(spec, [video, image])
    assert [(e.clip_starts, size) for e, size in entries[:8:2]] == [((0.0,), (64, 64)), ((0.7,), (64, 64)),
                                                                    ((1.5,), (64, 64)), ((2.2,), (64, 64))]
    assert len(entries) == 10 and entries[-1][0] == image  # 4 clips x 2 sizes, then the image at 2 sizes
    keys = {item_key(spec, e, size) for e, size in entries}
    assert len(keys) == 10  # no two clips share a key: the previous cache's items are copied to the right clip
    ident = {"vae": {"class": "TAEHV"}}
    base = DatasetSpec(folders=spec.folders, resolution=64, video_frames=17)
    prints = {fingerprint(s, [video], ident) for s in (
        base, dataclasses.replace(base, clip_mode="single_middle"), dataclasses.replace(base, clip_mode="multiple_overlapping"),
        dataclasses.replace(base, video_frames=0, frame_buckets=(17, 33)),
        dataclasses.replace(base, video_frames=0, frame_buckets=(17, 65)))}
    assert len(prints) == 5  # each setting makes its own cache
    # video_frames alone: the fingerprint and item keys of caches made before frame buckets (golden values of
    # tests/with_comfy/test_video_frame_rate.py), whatever clip the scan recorded
    old = DatasetSpec(folders=(FolderSpec("/data/clips"),), resolution=64, video_frames=9)
    clip = DatasetItem("/data/clips/a.mkv", "a caption", 1, 1000, 123456789, 64, 48, 40)
    scanned = dataclasses.replace(clip, clip_frames=9, clip_starts=(0.0,))
    assert fingerprint(old, [scanned], {"vae": {"class": "TAEHV"}, "clip": {"class": "SD1ClipModel"}}) == \
        fingerprint(old, [clip], {"vae": {"class": "TAEHV"}, "clip": {"class": "SD1ClipModel"}})
    assert item_key(old, scanned, (64, 64)) == "b8501ccd10215df0b6f1f0881b2c1b37"
    assert cache_entries(old, [scanned]) == [(scanned, (64, 64))]


def test_headless_cache_config_takes_the_clip_keys_and_refuses_bad_values(tmp_path):
    error = cache_config_error(tmp_path)

    assert "dataset: frame_buckets lists 0" in error(frame_buckets=[0, 17])
    assert "dataset: frame_buckets is 17: give a list of whole numbers" in error(frame_buckets=17)
    assert "dataset: clip_mode is 'middle': use single_beginning" in error(clip_mode="middle")
    # good values pass the dataset checks; the next missing setting is the VAE
    assert "no VAE" in error(frame_buckets=[17, 33], clip_mode="multiple_overlapping")
