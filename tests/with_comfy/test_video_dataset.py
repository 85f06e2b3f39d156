"""Video datasets: real video files (PyAV-encoded), frame sampling, the dataset report for broken or
short videos, and caching with a real ComfyUI video VAE (TAEHV, random weights) and tiny CLIP."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from media_writers import write_video
from pack import load_pack

load_pack()
from PipeTrain.engine.cache.format import CacheError  # noqa: E402
from PipeTrain.engine.cache.reader import CachedDataset
from PipeTrain.engine.data.messages import DatasetError
from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec, validate  # noqa: E402
from PipeTrain.engine.data.video import VideoReadError, load_video, probe_video  # noqa: E402


def test_probe_and_stride_sampling(tmp_path):
    path = write_video(tmp_path / "clip.mkv", 12)
    info = probe_video(str(path))
    assert (info.width, info.height, info.frames) == (64, 48, 12) and info.fps == pytest.approx(24)
    clip = load_video(str(path), (32, 24), frames=5, stride=2)
    assert clip.shape == (5, 24, 32, 3)
    greys = clip[:, :, :8].mean(axis=(1, 2, 3)) * 255
    np.testing.assert_allclose(greys, [0, 20, 40, 60, 80], atol=2)  # frames 0, 2, 4, 6, 8
    with pytest.raises(VideoReadError, match="clip.mkv decoded to only 3 usable frame.* lower 'video_frames'"):
        load_video(str(path), (32, 24), frames=5, stride=4)  # needs 17 frames


def test_scan_lists_short_broken_and_skipped_videos(tmp_path):
    write_video(tmp_path / "long one.mp4", 9, codec="libx264")
    write_video(tmp_path / "short.mkv", 3)
    (tmp_path / "zero.mp4").write_bytes(b"")
    (tmp_path / "noise.webm").write_bytes(np.random.default_rng(0).integers(0, 255, 5000, dtype=np.uint8).tobytes())
    good = write_video(tmp_path / "cut.mp4", 9, codec="libx264").read_bytes()
    (tmp_path / "cut.mp4").write_bytes(good[: len(good) // 3])
    (tmp_path / "long one.txt").write_text("a grey fade", encoding="utf-8")
    spec = DatasetSpec(folders=(FolderSpec(str(tmp_path)),), resolution=64, video_frames=5)
    scan = validate(spec)
    assert [(Path(i.path).name, i.frames, i.caption) for i in scan.items] == [("long one.mp4", 9, "a grey fade")]
    warned = " ".join(scan.warnings)
    assert "1 video(s) are shorter than one clip (5 frames" in warned and "short.mkv (3 frames)" in warned
    reasons = " ".join(u.reason for u in scan.unreadable)
    assert "zero.mp4 is empty (0 bytes)" in reasons
    assert "noise.webm cannot be decoded as a video" in reasons and "re-encode it as H.264 MP4" in reasons
    assert len(scan.unreadable) == 3 and "cut.mp4" in reasons
    # without video_frames the same folder trains on nothing, and the error says how to use the videos
    with pytest.raises(DatasetError, match="set LoadDataset's 'video_frames'"):
        validate(DatasetSpec(folders=spec.folders, resolution=64))
    with pytest.raises(DatasetError, match="video_frames is -1"):
        DatasetSpec(folders=spec.folders, resolution=64, video_frames=-1).check()


@pytest.fixture(scope="module")
def encoders(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    from tiny_encoders import random_video_vae, tiny_image_encoders

    image_vae, clip = tiny_image_encoders(tmp_path_factory.mktemp("enc"))
    return random_video_vae(), image_vae, clip


def test_videos_cache_as_video_latents(encoders, tmp_path):
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    video_vae, image_vae, clip = encoders
    write_video(tmp_path / "wide.mkv", 10, size=(96, 48))
    write_video(tmp_path / "square.mkv", 6, size=(64, 64))
    (tmp_path / "wide.txt").write_text("a wide fade", encoding="utf-8")
    (spec,) = PipeTrainLoadDataset().load(folders=str(tmp_path), resolution=64, repeats=1, aspect_ratios="1:1, 2:1",
                                          bucket_multiple=16, video_frames=5, frame_stride=1)
    (cache,) = PipeTrainCacheLatents().cache(dataset=spec, vae=video_vae, clip=clip, regenerate=False)
    ds = CachedDataset(cache.cache_dir)
    shapes = {e["source"]: tuple(ds[i]["latent"].shape) for i, e in enumerate(ds.items)}
    # 5 frames -> 2 latent frames (4x temporal), 8x spatial; each video at its own bucket
    assert shapes == {"square.mkv": (16, 2, 8, 8), "wide.mkv": (16, 2, 6, 12)}
    wide = [i for i, e in enumerate(ds.items) if e["source"] == "wide.mkv"][0]
    frames = torch.from_numpy(load_video(str(tmp_path / "wide.mkv"), (96, 48), 5))
    torch.testing.assert_close(ds[wide]["latent"], video_vae.encode(frames)[0])
    assert ds[wide]["latent"].abs().max() > 0 and torch.isfinite(ds[wide]["latent"]).all()
    # the clip's frames are distinct (a fade), so its two latent frames are too
    assert not torch.allclose(ds[wide]["latent"][:, 0], ds[wide]["latent"][:, 1])
    assert ds[wide]["caption"] == "a wide fade" and len(set(ds.buckets())) == 2
    # an image VAE cannot encode clips: a clear error naming the file and the fix
    with pytest.raises(CacheError, match="square.mkv as 5 separate images .* Connect the VAE of a video model"):
        PipeTrainCacheLatents().cache(dataset=spec, vae=image_vae, clip=clip, regenerate=False)


def test_first_frame_conditioning_feeds_wan_i2v(encoders, tmp_path):
    """Wan i2v first-frame extras, cached with ComfyUI's key names, go straight into a real (tiny)
    WAN21 i2v model's extra_conds and apply_model through the training objective."""
    import comfy.supported_models
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    video_vae, _, clip = encoders
    write_video(tmp_path / "fade.mkv", 5, size=(64, 64))
    (spec,) = PipeTrainLoadDataset().load(folders=str(tmp_path), resolution=64, repeats=1, video_frames=5)
    (cache,) = PipeTrainCacheLatents().cache(dataset=spec, vae=video_vae, clip=clip, regenerate=False,
                                             first_frame_conditioning=True)
    (plain,) = PipeTrainCacheLatents().cache(dataset=spec, vae=video_vae, clip=clip, regenerate=False)
    assert plain.cache_dir != cache.cache_dir  # the option is part of the fingerprint
    item = CachedDataset(cache.cache_dir)[0]
    frames = torch.from_numpy(load_video(str(tmp_path / "fade.mkv"), (64, 64), 5))
    expected = torch.full_like(frames, 0.5)
    expected[0] = frames[0]
    torch.testing.assert_close(item["extras"]["concat_latent_image"], video_vae.encode(expected)[0])  # raw VAE output
    mask = item["extras"]["concat_mask"]
    assert mask.shape == (1, 2, 8, 8) and mask[:, 0].abs().max() == 0 and mask[:, 1].min() == 1

    torch.manual_seed(0)
    model = comfy.supported_models.WAN21_I2V(dict(
        image_model="wan2.1", model_type="i2v", patch_size=(1, 2, 2), in_dim=36, dim=64, ffn_dim=128, freq_dim=256,
        text_dim=item["cross_attn"].shape[-1], out_dim=16, num_heads=2, num_layers=2, window_size=(-1, -1),
        qk_norm=True, cross_attn_norm=True, eps=1e-6)).get_model({})
    for p in model.diffusion_model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    objective = DiffusionObjective(model, seed=0)
    conds = [{"cross_attn": item["cross_attn"], "extras": item["extras"]}]
    latents = item["latent"].unsqueeze(0)
    prepared = objective.prepare(latents, conds, [0])
    assert prepared.kwargs["c_concat"].shape == (1, 20, 2, 8, 8)  # 4 mask + 16 image channels, as in sampling
    assert torch.isfinite(objective(latents, conds, [0]))
