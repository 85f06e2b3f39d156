"""LoadDataset's target_fps: clips sampled by timestamp at the model's frame rate (engine/data/frame_picks.py),
the report of clips far from it or of variable rate, the cache fingerprint, and "auto" taken from the VAE.

Real files: FFV1 videos whose frame i is grey 6*i (tests/media_writers.py: write_timed_video), so the
pixels CacheLatents hands the VAE say which source frames a clip holds."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from media_writers import frame_indices, write_timed_video
from pack import load_pack

load_pack()
from PipeTrain.engine.cache.format import fingerprint, item_key  # noqa: E402
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
from PipeTrain.engine.data.messages import DatasetError  # noqa: E402
from PipeTrain.engine.data.scan import DatasetItem, DatasetSpec, FolderSpec  # noqa: E402
from PipeTrain.engine.data.video import load_video, probe_video  # noqa: E402

pytestmark = pytest.mark.core

AT_60 = [round(j * 1000 / 60) for j in range(40)]  # 40 frames at 60 fps, in ms
AT_24 = [round(j * 1000 / 24) for j in range(13)]  # 13 frames at 24 fps: 0.5 s, just one clip of 9 at 16 fps
# 7 frames at 30 fps, then 6 at 8 fps: a variable-frame-rate clip (a phone recording that slowed down)
VARIABLE = [0, 33, 67, 100, 133, 167, 200, 325, 450, 575, 700, 825, 950]


@pytest.fixture(scope="module")
def encoders(comfy_root, tmp_path_factory):
    """A random-weight Wan 2.1 light TAE (ComfyUI's own video VAE class and detection) and a tiny CLIP."""
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    import_comfy(comfy_root)
    from tiny_encoders import random_video_vae, tiny_image_encoders

    image_vae, clip = tiny_image_encoders(tmp_path_factory.mktemp("enc"))
    yield random_video_vae(), image_vae, clip
    torch.set_num_threads(threads)


class Recording:
    """A ComfyUI VAE that notes which source frames (frame_indices) each clip it encodes holds."""

    def __init__(self, inner):
        self._inner, self.clips = inner, []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def encode(self, pixels):
        self.clips.append(frame_indices(pixels))
        return self._inner.encode(pixels)


def nearest(times_ms, fps, frames=9) -> list[int]:
    """The rule, written out: for clip frame i the source frame nearest to i / fps seconds (ties: the earlier)."""
    return [min(range(len(times_ms)), key=lambda j: (abs(times_ms[j] - 1000 * i / fps), j)) for i in range(frames)]


def _load(folder, **options):
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    return PipeTrainLoadDataset().load_and_report(folders=str(folder), resolution=64, repeats=1, video_frames=9,
                                                  **options)


def _cache(spec, vae, clip):
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents

    return PipeTrainCacheLatents().cache_and_report(dataset=spec, vae=vae, clip=clip, regenerate=False)


def test_a_60fps_clip_cached_at_16fps_takes_the_frame_nearest_each_timestamp(encoders, tmp_path):
    video_vae, _, clip = encoders
    path = write_timed_video(tmp_path / "fast.mkv", AT_60)
    (spec,) = _load(tmp_path, target_fps="16")["result"]
    assert spec.target_fps == 16.0
    vae = Recording(video_vae)
    cached = _cache(spec, vae, clip)
    # clip frame i is at i/16 s, 3.75 source frames apart: the nearest source frame, ties to the earlier
    assert vae.clips == [[0, 4, 7, 11, 15, 19, 22, 26, 30]] == [nearest(AT_60, 16)]
    (cache,) = cached["result"]
    frames = torch.from_numpy(load_video(str(path), (64, 64), 9, target_fps=16))
    assert frame_indices(frames) == [0, 4, 7, 11, 15, 19, 22, 26, 30]
    torch.testing.assert_close(CachedDataset(cache.cache_dir)[0]["latent"], video_vae.encode(frames)[0])

    # the same settings again: reused; another rate: another cache folder, encoded from other frames
    assert "1 item(s) reused" in _cache(spec, Recording(video_vae), clip)["ui"]["text"][0]
    (at_24,) = _load(tmp_path, target_fps="24")["result"]
    vae = Recording(video_vae)
    (other,) = _cache(at_24, vae, clip)["result"]
    assert other.cache_dir != cache.cache_dir and vae.clips == [nearest(AT_60, 24)]
    # 'source' keeps the raw frames, as before target_fps existed
    (raw,) = _load(tmp_path, target_fps="source")["result"]
    vae = Recording(video_vae)
    _cache(raw, vae, clip)
    assert vae.clips == [list(range(9))]


def test_a_variable_frame_rate_clip_is_sampled_by_its_timestamps(encoders, tmp_path):
    video_vae, _, clip = encoders
    path = write_timed_video(tmp_path / "phone.mkv", VARIABLE)
    info = probe_video(str(path))
    assert info.frames == 13 and info.times == pytest.approx([t / 1000 for t in VARIABLE])
    out = _load(tmp_path, target_fps="16")
    vae = Recording(video_vae)
    _cache(out["result"][0], vae, clip)
    # frame i at i/16 s: the 30 fps start gives every other frame, the 8 fps end repeats frames
    assert vae.clips == [[0, 2, 4, 6, 6, 7, 7, 8, 8]]
    assert {"reason": "fps_variable", "count": 1, "first": ["%s (8 fps to 30.3 fps)" % path]} in \
        out["ui"]["pipetrain_report"]
    assert "1 video(s) have a variable frame rate (phone and screen recordings often do); their frames are picked " \
           "by timestamp at 16 fps, so motion keeps its real speed" in " ".join(out["ui"]["text"])


def test_the_report_lists_clips_far_from_target_fps_and_short_after_resampling(tmp_path):
    write_timed_video(tmp_path / "fast.mkv", AT_60)
    write_timed_video(tmp_path / "steady.mkv", AT_24)
    write_timed_video(tmp_path / "short.mkv", AT_24[:12])  # 0.46 s: 12 frames, but not 0.5 s of them
    write_timed_video(tmp_path / "phone.mkv", VARIABLE)
    out = _load(tmp_path, target_fps="16")
    rows = {r["reason"]: (r["count"], r["first"]) for r in out["ui"]["pipetrain_report"]}
    assert rows["fps_far"] == (1, [f"{tmp_path / 'fast.mkv'} (60 fps)"])
    assert rows["short"] == (1, [f"{tmp_path / 'short.mkv'} (0.46 s, 12 frames)"])
    assert rows["fps_variable"][0] == 1
    text = "\n".join(out["ui"]["text"])
    assert "1 video(s) run at a frame rate far from target_fps 16 fps (more than twice or less than half of it)" in text
    assert ("1 video(s) are shorter than one clip (0.50 s from the first frame to the last: 9 frames at 16 fps, "
            "stride 1) and are skipped") in text
    assert "1 file(s) skipped (1 video(s) shorter than a clip)" in text
    assert ("3 video(s) of 9 frame(s) per clip (stride 1), sampled at 16 fps; their frame rates: 12.63 fps "
            "(variable): 1, 24 fps: 1, 60 fps: 1.") in text
    # as source frames short.mkv is long enough (12 >= 9 frames), nothing is far, and the variable clip is warned about
    out = _load(tmp_path, target_fps="source")
    rows = {r["reason"]: r["count"] for r in out["ui"]["pipetrain_report"]}
    assert "short" not in rows and "fps_far" not in rows and rows["fps_variable"] == 1
    assert "target_fps is source, so they train as raw frames" in "\n".join(out["ui"]["text"])
    # "auto" (the node's default): LoadDataset cannot know the model yet, and says who decides
    out = _load(tmp_path)
    assert out["result"][0].target_fps == "auto"
    assert "sampled at the video model's frame rate (target_fps auto: CacheLatents reads it from its VAE)" in \
        out["ui"]["text"][1]
    with pytest.raises(DatasetError, match="target_fps is 'fast': enter 'auto'"):
        _load(tmp_path, target_fps="fast")


def test_the_fingerprint_follows_target_fps_and_old_caches_keep_theirs():
    spec = DatasetSpec(folders=(FolderSpec("/data/clips"),), resolution=64, video_frames=9)
    clip = DatasetItem("/data/clips/a.mkv", "a caption", 1, 1000, 123456789, 64, 48, 40)
    image = DatasetItem("/data/clips/b.png", None, 1, 500, 987654321, 64, 64, 0)
    ident = {"vae": {"class": "TAEHV"}, "clip": {"class": "SD1ClipModel"}}

    def at(fps):
        s = dataclasses.replace(spec, target_fps=fps)
        return fingerprint(s, [clip, image], ident), item_key(s, clip, (64, 64)), item_key(s, image, (64, 64))
    # computed by PipeTrain before target_fps existed: source frames keep the fingerprint and item keys
    assert at(0.0) == ("cfc0d7a076befa34", "b8501ccd10215df0b6f1f0881b2c1b37", "874adcb82ae1c7e01e8af2703127a1f5")
    assert DatasetSpec.from_dict(spec.to_dict()) == spec and "target_fps" not in spec.to_dict()
    fps16, fps24 = at(16.0), at(24.0)
    assert len({at(0.0)[0], fps16[0], fps24[0]}) == 3 and len({at(0.0)[1], fps16[1], fps24[1]}) == 3
    assert fps16[2] == fps24[2] == at(0.0)[2]  # an image's key does not depend on the clips' rate
    images = DatasetSpec(folders=spec.folders, resolution=64)  # no videos: the setting changes nothing
    assert fingerprint(dataclasses.replace(images, target_fps=16.0), [image], ident) == \
        fingerprint(images, [image], ident) == "5a0aeb572f26e94f"
    # the spec's JSON (run.json, the engine's cache.json) takes the same values as the node
    ntsc = DatasetSpec.from_dict({**spec.to_dict(), "target_fps": "30000/1001"})
    assert ntsc.target_fps == pytest.approx(29.97, 1e-3)
    assert DatasetSpec.from_dict({**spec.to_dict(), "target_fps": "auto"}).to_dict()["target_fps"] == "auto"
    with pytest.raises(DatasetError, match="target_fps is 500"):
        DatasetSpec.from_dict({**spec.to_dict(), "target_fps": 500})


def test_auto_takes_the_rate_of_the_vaes_video_model(encoders, tmp_path):
    import comfy.ldm.wan.vae
    import comfy.sd
    from PipeTrain.engine.cache.vae_frame_rate import resolve_target_fps, vae_family

    video_vae, image_vae, clip = encoders
    # a real (tiny) Wan 2.1 VAE, detected by ComfyUI from its state dict as the real file is
    wan = comfy.sd.VAE(sd=comfy.ldm.wan.vae.WanVAE(dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                                                    attn_scales=[], temperal_downsample=[False, True, True]
                                                    ).state_dict())
    assert vae_family(wan) == ("Wan 2.1 / Wan 2.2 14B", 16.0)
    assert vae_family(image_vae) is None
    assert vae_family(video_vae) is None  # light TAEs: ComfyUI shares them between Wan 2.1 and HunyuanVideo
    write_timed_video(tmp_path / "fast.mkv", AT_60)
    (spec,) = _load(tmp_path)["result"]
    said = []
    assert resolve_target_fps(spec, wan, said.append, said.append).target_fps == 16.0
    assert said == ["target_fps auto: clips are sampled at 16 fps, the rate of Wan 2.1 / Wan 2.2 14B (from the VAE)."]
    # a VAE that names no model: the source frames, and a warning with the fix
    vae = Recording(video_vae)
    out = _cache(spec, vae, clip)
    assert vae.clips == [list(range(9))]
    assert "target_fps is auto, but the VAE (TAEHV) does not say which video model's frame rate to use" in \
        "\n".join(out["ui"]["text"])


def test_the_missing_caption_line_names_videos_as_videos(tmp_path):
    """Uncaptioned clips are called videos in the report, and a mixed folder names both kinds."""
    from PIL import Image

    write_timed_video(tmp_path / "clip.mkv", AT_24)
    text = "\n".join(_load(tmp_path, target_fps="16")["ui"]["text"])
    assert "1 video(s) have no caption file (.txt)" in text and "image(s) have no caption" not in text
    Image.new("RGB", (64, 64), (10, 20, 30)).save(tmp_path / "still.png")
    text = "\n".join(_load(tmp_path, target_fps="16")["ui"]["text"])
    assert "2 image(s) and video(s) have no caption file (.txt)" in text
