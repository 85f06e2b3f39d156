"""Aspect-ratio buckets and multi-resolution: sizes, cropping, the cache, batches that never mix
shapes or caption lengths, and a real engine run on a bucketed cache with batch_size 2."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pack import load_pack

load_pack()
from PipeTrain.engine.data import buckets as bk  # noqa: E402
from PipeTrain.engine.cache.legacy import bucket_key  # noqa: E402
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
from PipeTrain.engine.cache.writer import write_item  # noqa: E402
from PipeTrain.engine.train.sample_order import SampleStream, collate  # noqa: E402
from PipeTrain.engine.data.images import load_image
from PipeTrain.engine.data.messages import DatasetError
from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec, cache_entries, scan_dataset  # noqa: E402

# ---- sizes and parsing ----------------------------------------------------------------------


def test_parse_aspect_ratios_and_errors_name_the_input():
    assert bk.parse_aspect_ratios("") == () and bk.parse_aspect_ratios("square") == ()
    auto = bk.parse_aspect_ratios("auto")
    assert len(auto) == 9 and auto[0] == pytest.approx(0.5) and auto[4] == pytest.approx(1.0) and auto[-1] == pytest.approx(2.0)
    assert bk.parse_aspect_ratios("16:9, 1/1; 0.75\n4x3") == pytest.approx((0.75, 1.0, 4 / 3, 16 / 9), abs=1e-6)
    for bad, words in [("wide", "is not a ratio"), ("0:1", "zero side"), ("20:1", "outside 1:8")]:
        with pytest.raises(bk.BucketError, match="aspect_ratios") as e:
            bk.parse_aspect_ratios(bad)
        assert words in str(e.value)
    assert bk.parse_resolutions("768, 1024 768") == (768, 1024)
    with pytest.raises(bk.BucketError, match="extra_resolutions entry '7x7'"):
        bk.parse_resolutions("7x7")


def test_bucket_sizes_keep_the_area_and_the_multiple():
    sizes = bk.bucket_sizes(512, bk.auto_ratios(), 64)
    assert (512, 512) in sizes and (704, 384) in sizes and (384, 704) in sizes
    for w, h in sizes:
        assert w % 64 == 0 and h % 64 == 0 and 0.8 < w * h / 512**2 < 1.2
    # 16:9 = 1.78 lies between the 640x384 (1.67) and 704x384 (1.83) buckets, nearer the second
    assert bk.nearest_bucket(1920, 1080, sizes) == (704, 384) and bk.nearest_bucket(1080, 1920, sizes) == (384, 704)
    assert bk.nearest_bucket(1600, 1000, sizes) == (640, 384)
    assert bk.nearest_bucket(300, 300, sizes) == (512, 512)


def test_spec_checks_and_round_trip(tmp_path):
    spec = DatasetSpec(folders=(FolderSpec(str(tmp_path)),), resolution=64, aspect_ratios=(0.5, 1.0, 2.0),
                       extra_resolutions=(128,), bucket_multiple=16)
    spec.check()
    assert DatasetSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.resolutions == (64, 128) and spec.sizes_for(200, 100) == ((96, 48), (176, 96))
    with pytest.raises(DatasetError, match="extra_resolutions lists 100"):
        DatasetSpec(folders=spec.folders, resolution=64, extra_resolutions=(100,)).check()
    with pytest.raises(DatasetError, match="bucket_multiple is 12"):
        DatasetSpec(folders=spec.folders, resolution=64, bucket_multiple=12).check()
    # old JSON (before buckets) still loads as square, single-resolution
    old = {"folders": [{"path": str(tmp_path), "repeats": 1}], "resolution": 64, "caption_ext": ".txt", "version": 1}
    assert not DatasetSpec.from_dict(old).bucketed


def test_load_image_crops_to_the_bucket_shape(tmp_path):
    # 200x100: left quarter red, middle half green, right quarter blue. A 2:1 bucket keeps all three;
    # a square crop keeps only green.
    arr = np.zeros((100, 200, 3), np.uint8)
    arr[:, :50] = (255, 0, 0)
    arr[:, 50:150] = (0, 255, 0)
    arr[:, 150:] = (0, 0, 255)
    Image.fromarray(arr).save(tmp_path / "w.png")
    wide = load_image(str(tmp_path / "w.png"), (128, 64))
    assert wide.shape == (64, 128, 3)
    assert wide[32, 4, 0] > 0.9 and wide[32, 64, 1] > 0.9 and wide[32, 123, 2] > 0.9
    square = load_image(str(tmp_path / "w.png"), 64)
    assert square.shape == (64, 64, 3) and square[:, :, 1].min() > 0.9 and square[:, :, 0].max() < 0.1
    # a tall bucket from a wide picture: the center column band, scaled up
    tall = load_image(str(tmp_path / "w.png"), (64, 128))
    assert tall.shape == (128, 64, 3) and tall[:, :, 1].min() > 0.9


def test_scan_reports_per_bucket_and_crops(tmp_path):
    for name, size in [("wide.png", (300, 150)), ("tall.png", (150, 300)), ("sq.png", (200, 200)),
                       ("strip.png", (900, 100))]:
        Image.new("RGB", size, (9, 9, 9)).save(tmp_path / name)
    spec = DatasetSpec(folders=(FolderSpec(str(tmp_path)),), resolution=64, aspect_ratios=(0.5, 1.0, 2.0),
                       extra_resolutions=(128,), bucket_multiple=16)
    scan = scan_dataset(spec)
    entries = cache_entries(spec, scan.items)
    sizes = {name: [size for item, size in entries if Path(item.path).name == name] for name in ("wide.png", "tall.png", "sq.png")}
    assert len(entries) == 8  # every image at both resolutions
    assert sizes == {"wide.png": [(96, 48), (176, 96)], "tall.png": [(48, 96), (96, 176)], "sq.png": [(64, 64), (128, 128)]}
    warned = " ".join(scan.warnings)
    # 9:1 into a 2:1 bucket keeps 22%: reported with the bucket it goes to; 2:1 into 2:1 is not
    assert "strip.png (900x100 into 96x48, 22.2% of the picture kept)" in warned and "wide.png (300" not in warned


# ---- the stream ------------------------------------------------------------------------------


def test_stream_batches_hold_one_bucket_and_every_item_each_epoch():
    keys = ["a"] * 5 + ["b"] * 3 + ["c"] * 1  # e.g. two latent sizes and one other caption length
    repeats = [1, 2, 1, 1, 1, 1, 1, 3, 1]
    stream = SampleStream(repeats, seed=4, buckets=keys, batch=2)
    assert len(stream) == 14 and stream.padded == 2  # 6 + 5(+1) + 1(+1)
    for epoch in range(3):
        order = [stream.item_at(epoch * len(stream) + p) for p in range(len(stream))]
        for start in range(0, len(order), 2):
            assert len({keys[i] for i in order[start:start + 2]}) == 1, order
        for item, r in enumerate(repeats):
            assert order.count(item) >= r  # nothing dropped; at most one extra per bucket
    # a pure function of (seed, position): a fresh stream, read out of order, agrees
    again = SampleStream(repeats, seed=4, buckets=keys, batch=2)
    assert [again.item_at(p) for p in reversed(range(40))] == [stream.item_at(p) for p in reversed(range(40))]
    assert [SampleStream(repeats, 5, keys, 2).item_at(p) for p in range(14)] != [stream.item_at(p) for p in range(14)]


def test_one_bucket_keeps_the_plain_permutation():
    plain = SampleStream([1, 2, 1], seed=3)
    keyed = SampleStream([1, 2, 1], seed=3, buckets=["x"] * 3, batch=2)
    assert [keyed.item_at(p) for p in range(12)] == [plain.item_at(p) for p in range(12)]
    gen = torch.Generator().manual_seed(3 * 7919)
    assert [plain.item_at(p) for p in range(4)] == [[0, 1, 1, 2][i] for i in torch.randperm(4, generator=gen).tolist()]


def test_bucket_key_separates_caption_lengths(tmp_path):
    extras = {"pooled_output": None}
    for index, (h, tokens) in enumerate([(8, 77), (8, 77), (8, 154), (16, 77)]):
        write_item(tmp_path, index, torch.zeros(1, 4, h, 8), torch.zeros(1, tokens, 32), extras, f"{index}.png", "", 1)
    keys = [bucket_key(tmp_path, i) for i in range(4)]
    assert keys[0] == keys[1] and len(set(keys)) == 3
    assert "cond.cross_attn=154x32" in keys[2] and "latent=4x16x8" in keys[3]


# ---- the real cache and the real engine -----------------------------------------------------

def _media(folder: Path) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i, size in enumerate([(128, 64), (130, 60), (64, 128), (64, 64), (96, 96), (140, 70), (60, 124)]):
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(folder / f"img {i}.png")
        (folder / f"img {i}.txt").write_text(f"random noise number {i}", encoding="utf-8")


@pytest.fixture(scope="module")
def bucketed_cache(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset, bucket_report
    from tools.tiny_assets import load_tiny_encoders, write_tiny_clip, write_tiny_vae

    d = tmp_path_factory.mktemp("bucketed")
    write_tiny_vae(str(d / "vae.safetensors"), seed=0)
    write_tiny_clip(str(d / "clip.safetensors"), seed=0)
    vae, clip = load_tiny_encoders(str(d / "vae.safetensors"), str(d / "clip.safetensors"))
    _media(d / "set")
    (spec,) = PipeTrainLoadDataset().load(folders=str(d / "set"), resolution=64, repeats=1, aspect_ratios="1:2, 1:1, 2:1",
                                          extra_resolutions="128", bucket_multiple=16)
    report = bucket_report(spec, scan_dataset(spec).items)
    (cache,) = PipeTrainCacheLatents().cache(dataset=spec, vae=vae, clip=clip, regenerate=False)
    return cache, report, vae


def test_cache_holds_each_image_at_its_bucket_and_batches_stack(bucketed_cache):
    cache, report, vae = bucketed_cache
    assert report == "96x48: 3, 176x96: 3, 48x96: 2, 64x64: 2, 96x176: 2, 128x128: 2"
    ds = CachedDataset(cache.cache_dir)
    assert len(ds) == 14
    for i, entry in enumerate(ds.items):
        w, h = entry["size"]
        assert tuple(ds[i]["latent"].shape) == (4, h // 8, w // 8)  # the tiny VAE downsamples by 8
    # the first wide image at 64: its latent is the VAE encoding of the 2:1 crop, not of a square
    src = Path(cache.cache_dir).parents[1] / "img 0.png"
    pixels = torch.from_numpy(load_image(str(src), (96, 48))).unsqueeze(0)
    torch.testing.assert_close(ds[0]["latent"], vae.encode(pixels)[0])
    stream = SampleStream([ds.repeats(i) for i in range(len(ds))], seed=1, buckets=ds.buckets(), batch=2)
    for start in range(0, 2 * len(stream), 2):  # two epochs, every batch stacks without padding
        latents, conds, _ = collate(ds, stream, [start, start + 1], torch.device("cpu"))
        assert latents.shape[0] == 2 and conds[0]["cross_attn"].shape == conds[1]["cross_attn"].shape


@pytest.mark.slow
def test_engine_trains_on_a_bucketed_cache_with_batch_2(bucketed_cache, tmp_path, comfy_root, demo_base):
    from engine_runs import make_config, run_to_end

    cache, _, _ = bucketed_cache
    run = run_to_end(make_config(tmp_path / "run", comfy_root, demo_base, cache.cache_dir, steps=6, batch_size=2))
    losses = run.losses()
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert (tmp_path / "run" / "lora" / "lora_final.safetensors").is_file()
