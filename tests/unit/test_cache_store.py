"""The sharded latent cache (format 2, engine/cache/shards.py), written through the cache writer API
with tiny tensors (no VAE): atomic shards, resume after a crash, lazy bounded-memory reads, and
the metadata table round trip. Format 1 caches (one file per item) still load."""
from __future__ import annotations

import json

import psutil
import pytest
import safetensors.torch
import torch

from pack import load_pack  # tests/pack.py: the repo as the package ComfyUI makes of it

load_pack()
import PipeTrain.engine.cache.format as fmt  # noqa: E402
from PipeTrain.engine.cache.legacy import bucket_key, write_manifest  # noqa: E402
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
from PipeTrain.engine.cache.writer import write_item  # noqa: E402
import PipeTrain.engine.cache.shards as store  # noqa: E402
from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec  # noqa: E402

FP = "00000000000000ab"


def cache_dir(tmp_path):
    return tmp_path / fmt.CACHE_FOLDER / FP


def spec(tmp_path) -> DatasetSpec:
    return DatasetSpec((FolderSpec(str(tmp_path)),), 64)


def add(writer, index: int, tokens: int = 7, mask: bool = False) -> list[str]:
    """Item `index`: a latent filled with the index (so a wrong read shows), a cond of `tokens` tokens."""
    extras = {"pooled_output": None, "guidance": 3.5, "attention_mask": torch.ones(1, tokens, dtype=torch.int64),
              "unbatched_thing": torch.arange(3.0)}
    return write_item(writer, index, torch.full((1, 4, 8, 8), float(index)), torch.randn(1, tokens, 16), extras,
                          f"img{index}.png", f"caption {index}", 1,
                          loss_mask=torch.full((1, 1, 8, 8), 0.5) if mask else None)


def info(index: int) -> dict:
    return {"repeats": 1 + index % 3, "width": 64, "height": 32 if index % 2 else 64, "key": f"key{index}"}


def finish(tmp_path):
    return store.write_metadata(cache_dir(tmp_path), FP, spec(tmp_path), {"vae": "tiny"}, info)


def test_metadata_round_trips(tmp_path):
    writer = store.ShardWriter(cache_dir(tmp_path), max_items=2)
    skipped = [add(writer, i, tokens=7 if i < 2 else 9, mask=i == 1) for i in range(3)]
    writer.flush()
    assert skipped == [[], [], []]
    assert len(list((cache_dir(tmp_path) / "shards").glob("*.safetensors"))) == 2  # items {0, 1} and {2}
    assert finish(tmp_path) == (3, (4, 8, 8))

    ds = CachedDataset(cache_dir(tmp_path))
    assert len(ds) == 3 and ds.fingerprint == FP and [ds.repeats(i) for i in range(3)] == [1, 2, 3]
    buckets = ds.buckets()
    assert buckets[0] == buckets[1] != buckets[2]  # 9 caption tokens: another bucket; the loss mask is left out
    assert "cond.cross_attn=7x16" in buckets[0] and "latent=4x8x8" in buckets[0]
    row = ds.table[1]
    assert {k: row[k] for k in ("index", "source", "caption", "repeats", "width", "height", "key")} == {
        "index": 1, "source": "img1.png", "caption": "caption 1", "repeats": 2, "width": 64, "height": 32,
        "key": "key1"}
    item = ds[1]
    assert torch.equal(item["latent"], torch.full((4, 8, 8), 1.0)) and item["cross_attn"].shape == (7, 16)
    assert item["extras"]["pooled_output"] is None and item["extras"]["guidance"] == 3.5
    assert item["extras"]["attention_mask"].shape == (7,) and item["unbatched"] == ("unbatched_thing",)
    assert torch.equal(item["extras"]["unbatched_thing"], torch.arange(3.0))
    assert torch.equal(item["loss_mask"], torch.full((1, 8, 8), 0.5)) and "loss_mask" not in ds[0]
    manifest = json.loads((cache_dir(tmp_path) / fmt.MANIFEST).read_text())
    assert manifest["version"] == fmt.CACHE_FORMAT_VERSION and manifest["count"] == 3 and "items" not in manifest
    assert manifest["cond_keys"] == ["attention_mask", "cross_attn", "guidance", "pooled_output", "unbatched_thing"]
    # the table is a plain HF datasets folder
    import datasets

    table = datasets.load_from_disk(str(cache_dir(tmp_path) / manifest["metadata"]))
    assert table["index"] == [0, 1, 2] and set(store.COLUMNS) == set(table.column_names)
    # finishing again with nothing changed finds the same table and writes the same manifest
    before = (cache_dir(tmp_path) / fmt.MANIFEST).read_bytes()
    finish(tmp_path)
    assert (cache_dir(tmp_path) / fmt.MANIFEST).read_bytes() == before
    with pytest.raises(IndexError):
        ds[3]


def test_a_crash_mid_shard_leaves_a_cache_that_resumes_and_loads_right(tmp_path, monkeypatch):
    real_save, calls = safetensors.torch.save_file, []

    def crash_on_second_shard(tensors, path, metadata=None):
        calls.append(path)
        real_save(tensors, path, metadata=metadata)
        if len(calls) == 2:  # the temp file is half written when the process dies
            with open(path, "r+b") as f:
                f.truncate(100)
            raise RuntimeError("injected crash while writing a shard")

    monkeypatch.setattr(safetensors.torch, "save_file", crash_on_second_shard)  # what atomic_files calls
    writer = store.ShardWriter(cache_dir(tmp_path), max_items=4)
    with pytest.raises(RuntimeError, match="injected crash"):
        for i in range(10):
            add(writer, i)
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    shards = cache_dir(tmp_path) / "shards"
    assert [p.name for p in shards.iterdir() if p.name.startswith(".")] == []  # the temp file is gone
    assert sorted(store.scan_shards(cache_dir(tmp_path))) == [0, 1, 2, 3]  # only the complete shard counts
    with pytest.raises(fmt.CacheError, match="incomplete"):
        CachedDataset(cache_dir(tmp_path))
    # what a hard kill leaves: a stray temp file, and a damaged file under a shard's name
    (shards / ".0000004-000000000000.safetensors.tmp999").write_bytes(b"\0" * 50)
    (shards / "0000008-000000000000.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0{")

    resumed = store.ShardWriter(cache_dir(tmp_path), max_items=4)
    todo = [i for i in range(10) if not resumed.done(i)]
    assert todo == list(range(4, 10))  # only the items in no complete shard are encoded again
    for i in todo:
        add(resumed, i)
    resumed.flush()
    assert finish(tmp_path)[0] == 10
    ds = CachedDataset(cache_dir(tmp_path))
    assert [ds.table[i]["index"] for i in range(10)] == list(range(10))
    for i in range(10):
        assert torch.equal(ds[i]["latent"], torch.full((4, 8, 8), float(i))) and ds[i]["caption"] == f"caption {i}"


def test_2000_items_open_lazily_with_bounded_memory(tmp_path, monkeypatch):
    writer = store.ShardWriter(cache_dir(tmp_path))
    for i in range(2000):
        write_item(writer, i, torch.full((1, 4, 8, 8), float(i)), torch.zeros(1, 7 + i % 2, 16), {},
                       f"img{i}.png", f"caption {i}", 1)
    writer.flush()
    assert finish(tmp_path)[0] == 2000
    assert len(list((cache_dir(tmp_path) / "shards").glob("*.safetensors"))) == 8  # 256 items per shard

    opened = []
    real_open = store.safe_open
    monkeypatch.setattr(store, "safe_open", lambda *a, **kw: opened.append(a[0]) or real_open(*a, **kw))
    rss = psutil.Process().memory_info().rss
    ds = CachedDataset(cache_dir(tmp_path))
    buckets = ds.buckets()
    repeats = [ds.repeats(i) for i in range(len(ds))]
    grown = (psutil.Process().memory_info().rss - rss) / 2**20
    assert len(ds) == 2000 and len(set(buckets)) == 2 and repeats[:3] == [1, 2, 3]
    assert opened == []  # opening, bucketing and repeats read no shard (the table is memory-mapped)
    assert grown < 32, f"opening a 2000-item cache grew RSS by {grown:.0f} MiB"
    item = ds[1234]
    assert len(opened) == 1 and opened[0].endswith(ds.table[1234]["shard"])  # one shard opened per item read
    assert torch.equal(item["latent"], torch.full((4, 8, 8), 1234.0)) and item["caption"] == "caption 1234"


def test_format_1_caches_still_load(tmp_path):
    """A cache written before shards (one file per item, every item in manifest.json) trains as it is."""
    folder = cache_dir(tmp_path)
    for i in range(2):
        write_item(folder, i, torch.full((1, 4, 8, 8), float(i)), torch.zeros(1, 7, 16), {"pooled_output": None},
                       f"img{i}.png", f"caption {i}", 1)
    write_manifest(folder, FP, spec(tmp_path), [{"file": f"items/00000{i}.safetensors", "source": f"img{i}.png",
                                                      "repeats": 2, "bucket": bucket_key(folder, i), "key": f"k{i}"}
                                                     for i in range(2)], (4, 8, 8), ["cross_attn"], {})
    ds = CachedDataset(folder)
    assert len(ds) == 2 and ds.repeats(1) == 2 and ds.buckets()[0] == ds.buckets()[1]
    assert torch.equal(ds[1]["latent"], torch.full((4, 8, 8), 1.0)) and ds[1]["extras"] == {"pooled_output": None}
    assert ds.previous()["k1"] == (str(folder / "items" / "000001.safetensors"), None)
    # a newer version than this PipeTrain knows is refused with the fix
    manifest = json.loads((folder / fmt.MANIFEST).read_text())
    (folder / fmt.MANIFEST).write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(fmt.CacheError, match="format version 99.*regenerate"):
        CachedDataset(folder)
