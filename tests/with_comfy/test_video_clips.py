"""LoadDataset's frame_buckets and clip_mode with real video files: the bucket each video lands in, the
frames each clip mode hands the VAE, short videos reported and skipped, and a 2-bucket cache (a real
ComfyUI video VAE, TAEHV with random weights) whose items the trainer batches by length. The rules alone
(no files): tests/unit/test_video_clip_rules.py.

FFV1 videos whose frame i is grey 6*i (tests/media_writers.py: write_timed_video), so the pixels say which
source frames a clip holds."""
from __future__ import annotations

import pytest
import torch

from media_writers import frame_indices, write_timed_video
from pack import load_pack

load_pack()
from PipeTrain.engine.cache.items import load_pixels  # noqa: E402
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
from PipeTrain.engine.data.messages import DatasetError  # noqa: E402
from PipeTrain.engine.data.scan import cache_entries  # noqa: E402
from PipeTrain.engine.train.sample_order import SampleStream, batch_items  # noqa: E402

pytestmark = pytest.mark.core


def at_25(frames: int) -> list[int]:
    return [40 * i for i in range(frames)]  # ms


def _load(folder, **inputs):
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    return PipeTrainLoadDataset().load_and_report(folders=str(folder), resolution=64, repeats=1,
                                                  target_fps="source", **inputs)


def test_each_video_trains_at_the_longest_bucket_it_fills_and_short_ones_are_listed(tmp_path):
    for name, frames in (("long.mkv", 40), ("mid.mkv", 20), ("short.mkv", 10)):
        write_timed_video(tmp_path / name, at_25(frames))
    out = _load(tmp_path, frame_buckets="33, 17")
    spec = out["result"][0]
    assert spec.frame_buckets == (17, 33) and spec.video_frames == 0
    from PipeTrain.engine.data.scan_memo import scan

    items = {i.path.rsplit("/", 1)[-1]: i.clip_frames for i in scan(spec).items}
    assert items == {"long.mkv": 33, "mid.mkv": 17}  # 40 frames -> 33, 20 -> 17; 10 fills neither
    text = "\n".join(out["ui"]["text"])
    assert "2 video(s), clips (single_beginning) per frame bucket: 33 frames: 1, 17 frames: 1" in text
    assert ("1 video(s) are shorter than one clip (17 frames for the shortest of frame_buckets x frame_stride) "
            "and are skipped") in text and "short.mkv (10 frames)" in text
    rows = {r["reason"]: r["count"] for r in out["ui"]["pipetrain_report"]}
    assert rows["short"] == 1
    # the clips CacheLatents encodes have their bucket's length, from the video's start
    pixels = {e.path.rsplit("/", 1)[-1]: frame_indices(load_pixels(spec, e, size)[0])
              for e, size in cache_entries(spec, scan(spec).items)}
    assert pixels == {"long.mkv": list(range(33)), "mid.mkv": list(range(17))}


@pytest.mark.parametrize("mode, starts", [
    ("single_beginning", [0]), ("single_middle", [11]), ("multiple_overlapping", [0, 12, 23])])
def test_each_clip_mode_hands_the_vae_its_frames(tmp_path, mode, starts):
    write_timed_video(tmp_path / "clip.mkv", at_25(40))
    (spec,) = _load(tmp_path, video_frames=17, clip_mode=mode)["result"]
    from PipeTrain.engine.data.scan_memo import scan

    entries = cache_entries(spec, scan(spec).items)
    # 40 frames, clips of 17: the middle one cuts 11 before and 12 after; 3 clips cover all 40 (ceil(40 / 17))
    assert [frame_indices(load_pixels(spec, e, size)[0]) for e, size in entries] == \
        [list(range(s, s + 17)) for s in starts]


def test_bad_values_are_refused_before_anything_is_encoded(tmp_path):
    write_timed_video(tmp_path / "clip.mkv", at_25(20))
    with pytest.raises(DatasetError, match="frame_buckets lists 0"):
        _load(tmp_path, frame_buckets="0, 17")
    with pytest.raises(DatasetError, match="frame_buckets entry 'seventeen' is not a whole number"):
        _load(tmp_path, frame_buckets="seventeen")
    with pytest.raises(DatasetError, match="clip_mode is 'random'"):
        _load(tmp_path, video_frames=17, clip_mode="random")
    with pytest.raises(DatasetError, match="add 9 to frame_buckets"):
        _load(tmp_path, video_frames=9, frame_buckets="17")


@pytest.fixture(scope="module")
def video_encoders(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a busy 2-core machine: see tests/dataset_files.py
    import_comfy(comfy_root)
    from tiny_encoders import random_video_vae, tiny_image_encoders

    _, clip = tiny_image_encoders(tmp_path_factory.mktemp("enc"))
    yield random_video_vae(), clip
    torch.set_num_threads(threads)


def test_a_two_bucket_cache_holds_both_lengths_and_trains_them_in_separate_batches(video_encoders, tmp_path):
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents

    vae, clip = video_encoders
    write_timed_video(tmp_path / "a.mkv", at_25(12), size=(32, 32))  # bucket 9: 2 clips (0..8, 3..11)
    write_timed_video(tmp_path / "b.mkv", at_25(7), size=(32, 32))  # bucket 5: 2 clips (0..4, 2..6)
    (spec,) = _load(tmp_path, frame_buckets="5, 9", clip_mode="multiple_overlapping")["result"]
    (cache,) = PipeTrainCacheLatents().cache(dataset=spec, vae=vae, clip=clip, regenerate=False)
    ds = CachedDataset(cache.cache_dir)
    lengths = sorted((e["source"], ds[i]["latent"].shape[1]) for i, e in enumerate(ds.items))
    assert lengths == [("a.mkv", 3), ("a.mkv", 3), ("b.mkv", 2), ("b.mkv", 2)]  # 9 frames -> 3 latent, 5 -> 2
    assert len(set(ds.buckets())) == 2
    stream = SampleStream([e["repeats"] for e in ds.items], seed=0, buckets=ds.buckets(), batch=2)
    for step in range(4):
        batch = [ds[stream.item_at(p)] for p in SampleStream.positions(step, 0, 0, 1, 1, 2)]
        latents, _ = batch_items(batch, torch.device("cpu"))  # one length per batch: stacked without padding
        assert latents.shape[0] == 2
    # the VAE's rule: TAEHV turns 4 frames into one, so 6 is refused with the counts that work
    (bad,) = _load(tmp_path, frame_buckets="5, 6")["result"]
    with pytest.raises(DatasetError, match="6 frames per clip does not suit the VAE .* Use 5 or 9 instead of 6"):
        PipeTrainCacheLatents().cache(dataset=bad, vae=vae, clip=clip, regenerate=False)
