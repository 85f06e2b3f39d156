"""Several datasets in one run (LoadDataset's add_to): the chained spec and its JSON, the refusals before
launch, and the caches read as one sample stream (engine/cache/joined.py) with real cache files."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from PIL import Image

from pack import load_pack

load_pack()
import PipeTrain.nodes.load_dataset as load_node  # noqa: E402
from PipeTrain.engine.cache.format import CacheSpec  # noqa: E402
from PipeTrain.engine.cache.joined import JoinedCaches, open_caches  # noqa: E402
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
from PipeTrain.engine.config.checks import ConfigError  # noqa: E402
from PipeTrain.engine.config.run import RunConfig  # noqa: E402
from PipeTrain.engine.data.messages import DatasetError  # noqa: E402
from PipeTrain.engine.data.scan import DatasetSpec, files_signature  # noqa: E402
from PipeTrain.engine.train.sample_order import SampleStream  # noqa: E402
from headless_config import cache_config_error  # noqa: E402
from tiny_detected import write_cache  # noqa: E402

pytestmark = pytest.mark.core  # also on ComfyUI 0.33


def _images(folder: Path, count: int, size=(64, 64)) -> str:
    folder.mkdir(parents=True)
    for i in range(count):
        Image.new("RGB", size, (i * 40, 80, 120)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"caption {i}")
    return str(folder)


def test_chained_load_dataset_nodes_give_one_spec_with_every_part_and_its_own_settings(tmp_path):
    node = load_node.PipeTrainLoadDataset()
    a, b, c = (_images(tmp_path / n, 2, (128, 128)) for n in "abc")
    (first,) = node.load(folders=a, resolution=64, repeats=1)
    (two,) = node.load(folders=b, resolution=128, repeats=3, aspect_ratios="1:1, 2:1", add_to=first)
    out = node.load_and_report(folders=c, resolution=64, repeats=1, caption_prefix="ohwx, ", add_to=two)
    chain = out["result"][0]
    assert [p.folders[0].path for p in chain.parts] == [a, b, c]
    assert [p.resolution for p in chain.parts] == [64, 128, 64]
    assert chain.parts[1].aspect_ratios == (1.0, 2.0) and chain.parts[1].folders[0].repeats == 3
    assert chain.parts[2].caption_prefix == "ohwx, " and chain.parts[0].caption_prefix == ""
    assert all(p.more == () for p in chain.parts)
    assert out["ui"]["text"][0].startswith("dataset 3 (c) joins 2 dataset(s)")
    # the JSON round trip keeps the chain; one dataset's JSON has no "more" (old caches compare it as it was)
    back = DatasetSpec.from_dict(json.loads(json.dumps(chain.to_dict())))
    assert back.to_dict() == chain.to_dict() and len(back.parts) == 3  # (an image set's target_fps is not written)
    assert "more" not in first.to_dict() and first.parts == (first,)
    # a change in an added dataset changes the chain's signature (ComfyUI runs the nodes again)
    before = files_signature(chain)
    (Path(c) / "0.txt").write_text("another caption")
    assert files_signature(chain) != before and files_signature(first) == files_signature(chain.parts[0])


def test_a_folder_in_two_chained_datasets_is_refused_with_the_fix(tmp_path):
    node = load_node.PipeTrainLoadDataset()
    a, b = _images(tmp_path / "a", 2), _images(tmp_path / "b", 2)
    (first,) = node.load(folders=a, resolution=64, repeats=1)
    with pytest.raises(DatasetError, match=r"is a folder of dataset 2 and a folder of dataset 1 .*each folder may "
                                           r"belong to one dataset only.*extra_resolutions"):
        node.load(folders=f"{b}\n{a}/", resolution=128, repeats=1, add_to=first)
    with pytest.raises(DatasetError, match="is mask_folder of dataset 2 and a folder of dataset 1"):
        node.load(folders=b, resolution=64, repeats=1, mask_folder=a, add_to=first)
    # a bad setting of an added dataset, written in JSON by hand, names the dataset
    bad = {**first.to_dict(), "more": [{**first.to_dict(), "folders": [{"path": b}], "resolution": 100}]}
    with pytest.raises(DatasetError, match="dataset 2 of the chain: resolution is 100"):
        DatasetSpec.from_dict(bad).check()
    nested = {**first.to_dict(), "more": [{**first.to_dict(), "folders": [{"path": b}], "more": [first.to_dict()]}]}
    with pytest.raises(DatasetError, match="list every dataset of the run in the first one's 'more', flat"):
        DatasetSpec.from_dict(nested)


def test_headless_cache_config_reads_chained_datasets_with_relative_folders(tmp_path):
    error = cache_config_error(tmp_path)
    (tmp_path / "other").mkdir()
    assert "dataset.more[0].folders[0]: the folder" in error(more=[{"folders": ["missing"], "resolution": 64}])
    assert "is a folder of dataset 2 and a folder of dataset 1" in error(more=[{"folders": ["set"], "resolution": 64}])
    # good: the next missing setting is the VAE
    assert "no VAE" in error(more=[{"folders": ["other"], "resolution": 128}])


def _cache(root: Path, items: int, latent: tuple, repeats: int, seed: int) -> str:
    """A real (format 1) cache of `items` items, each with these repeats."""
    root.mkdir()
    cache = write_cache(root, latent=latent, text_width=8, items=items, seed=seed)
    manifest = Path(cache) / "manifest.json"
    data = json.loads(manifest.read_text())
    data["items"] = [{**it, "repeats": repeats} for it in data["items"]]
    manifest.write_text(json.dumps(data))
    return cache


def test_two_caches_in_one_stream_each_item_by_its_repeats_and_no_batch_mixes_datasets(tmp_path):
    small = _cache(tmp_path / "a", 3, (4, 8, 8), repeats=1, seed=1)
    big = _cache(tmp_path / "b", 2, (4, 16, 16), repeats=3, seed=2)
    joined = open_caches(small, [big])
    assert isinstance(joined, JoinedCaches) and len(joined) == 5
    assert [tuple(joined[i]["latent"].shape) for i in range(5)] == [(4, 8, 8)] * 3 + [(4, 16, 16)] * 2
    assert joined[4]["latent"].equal(CachedDataset(big)[1]["latent"])
    assert [joined.repeats(i) for i in range(5)] == [1, 1, 1, 3, 3]
    batch = 2
    stream = SampleStream([joined.repeats(i) for i in range(len(joined))], seed=7, buckets=joined.buckets(),
                          batch=batch)
    for epoch in range(3):
        order = [stream.item_at(epoch * len(stream) + p) for p in range(len(stream))]
        # each item its repeats per epoch; a bucket's last run is filled with its own first items again
        assert all(order.count(i) >= r for i, r in enumerate([1, 1, 1, 3, 3]))
        assert len(order) == 3 + 1 + 6  # 3 items + 1 to fill the last run of two, 6 = 2 items x 3 repeats
        for start in range(0, len(order), batch):
            run = order[start:start + batch]
            assert len({i < 3 for i in run}) == 1, f"batch {run} mixes the datasets"
    # a pure function of (seed, position): a new stream (a resume, another rank) sees the same order
    again = SampleStream([joined.repeats(i) for i in range(len(joined))], seed=7, buckets=joined.buckets(), batch=2)
    assert [again.item_at(p) for p in range(40)] == [stream.item_at(p) for p in range(40)]
    # two datasets of the same latent size are still kept apart
    same = open_caches(small, [_cache(tmp_path / "c", 2, (4, 8, 8), repeats=1, seed=3)])
    assert len(set(same.buckets())) == 2
    # one cache opens as it always did: its own buckets, the stream of a run before chains existed
    alone = open_caches(small)
    assert isinstance(alone, CachedDataset) and alone.buckets() == CachedDataset(small).buckets()


def test_caches_of_other_vaes_are_refused_and_run_json_lists_the_more_caches(tmp_path):
    small = _cache(tmp_path / "a", 2, (4, 8, 8), repeats=1, seed=1)
    other = _cache(tmp_path / "b", 2, (16, 8, 8), repeats=1, seed=2)
    with pytest.raises(Exception, match="different channel counts.*same VAE"):
        open_caches(small, [other])
    (tmp_path / "comfy").mkdir()
    (tmp_path / "comfy" / "sd.py").write_text("")
    (tmp_path / "m").write_bytes(b"")
    base = {"run_name": "r", "run_dir": "", "comfyui_root": str(tmp_path), "model_path": str(tmp_path / "m"),
            "cache_dir": small}
    cfg = RunConfig.from_dict({**base, "more_cache_dirs": [other]})
    assert cfg.more_cache_dirs == (other,) and RunConfig.from_dict(cfg.to_dict()) == cfg
    assert RunConfig.from_dict(base).more_cache_dirs == ()  # run.json written before chains
    with pytest.raises(ConfigError, match="lists the cache .* twice"):
        RunConfig.from_dict({**base, "more_cache_dirs": [small]})
    with pytest.raises(ConfigError, match="must be a list of strings"):
        RunConfig.from_dict({**base, "more_cache_dirs": "x"})
    cfg.check_files()
    missing = dataclasses.replace(cfg, more_cache_dirs=(str(tmp_path / "none"),))
    with pytest.raises(ConfigError, match="more_cache_dirs: the cache .* is incomplete"):
        missing.check_files()


def test_the_cache_output_lists_every_part_and_old_cache_json_still_loads():
    one = CacheSpec("/c/a", "f" * 16, 3, (4, 8, 8))
    chain = dataclasses.replace(one, more=(CacheSpec("/c/b", "e" * 16, 2, (4, 16, 16)),))
    assert CacheSpec.from_dict(json.loads(json.dumps(chain.to_dict()))) == chain
    assert "more" not in one.to_dict() and CacheSpec.from_dict(one.to_dict()) == one
    assert [p.cache_dir for p in chain.parts] == ["/c/a", "/c/b"]
