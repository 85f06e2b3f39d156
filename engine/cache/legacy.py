"""Format 1 of the latent cache: one safetensors file per item, every item listed in manifest.json.

CacheLatents writes format 2 (engine/cache/shards.py). Format 1 is still read, so caches made
before the change train as they are, and it stays a convenient way to write a small cache by
hand (the tests and benchmarks build tiny caches with write_item(<folder>, ...) + write_manifest):

    <fingerprint>/items/000000.safetensors   one item: cache_format's tensor names and metadata
    <fingerprint>/manifest.json               written last, atomically; per item: file, source,
                                              repeats, size ([w, h]), bucket, key (item_key)

A new CacheLatents run over a dataset whose only cache is format 1 gets another fingerprint (the
format is part of it) and copies the unchanged items' tensors from the old files instead of
encoding them again.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import safe_open

from ..atomic_files import replacing, write_safetensors, write_text
from ..data.scan import DatasetSpec
from .format import (
    LOSS_MASK,
    MANIFEST,
    CacheError,
    read_safetensors,
    restore_cond,
    shapes_bucket,
    unpack_extras,
)

LEGACY_VERSION = 1


def item_path(cache_dir: str | os.PathLike, index: int) -> Path:
    return Path(cache_dir) / "items" / f"{index:06d}.safetensors"


def item_done(cache_dir: str | os.PathLike, index: int) -> bool:
    # Items appear by os.replace only, so an existing file is a complete file.
    return item_path(cache_dir, index).is_file()


def save_item_file(cache_dir: str | os.PathLike, index: int, tensors: dict[str, torch.Tensor],
                   metadata: dict[str, str]) -> None:
    """One packed item (cache_format.pack_item) as items/<index>.safetensors, atomically."""
    write_safetensors(item_path(cache_dir, index), tensors, {**metadata, "format": str(LEGACY_VERSION)})


def link_item(source: str | os.PathLike, cache_dir: str | os.PathLike, index: int) -> bool:
    """Put an existing item file at `index` (hard link, else a copy; atomic). False if `source` is gone."""
    try:
        with replacing(item_path(cache_dir, index)) as tmp:
            try:
                os.link(source, tmp)
            except OSError:  # no hard links here (some network/FAT file systems): copy
                shutil.copyfile(source, tmp)
        return True
    except FileNotFoundError:
        return False


def item_summary(cache_dir: str | os.PathLike, index: int) -> tuple[tuple[int, ...], list[str]]:
    """(latent shape, cond keys incl. None-valued ones) of one item, from the header only."""
    with safe_open(str(item_path(cache_dir, index)), framework="pt") as f:
        meta = f.metadata() or {}
        shape = tuple(f.get_slice("latent").get_shape())
        keys = [k[len("cond."):] for k in f.keys() if k.startswith("cond.")]
    keys += json.loads(meta.get("cond_none", "[]")) + list(json.loads(meta.get("cond_json", "{}")))
    return shape, sorted(keys)


def bucket_key(cache_dir: str | os.PathLike, index: int) -> str:
    """Which items may share a batch (cache_format.shapes_bucket), from the item file's header."""
    with safe_open(str(item_path(cache_dir, index)), framework="pt") as f:
        return shapes_bucket({k: f.get_slice(k).get_shape() for k in f.keys()})


def load_cond(cache_dir: str | os.PathLike, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """An item's conditioning as ComfyUI returned it (batch dim restored): write_item's inverse."""
    meta, tensors = read_safetensors(item_path(cache_dir, index))
    return restore_cond(tensors, meta)


def write_manifest(cache_dir: str | os.PathLike, fp: str, spec: DatasetSpec, items: list[dict[str, Any]],
                   latent_shape: tuple[int, ...], cond_keys: list[str], encoders: Mapping[str, Any]) -> Path:
    """items: [{"file": "items/000000.safetensors", "source": ..., "repeats": N, "size": [w, h],
    "bucket": bucket_key(...)}, ...] in cache order."""
    manifest = {"version": LEGACY_VERSION, "fingerprint": fp, "count": len(items), "items": list(items),
                "latent_shape": list(latent_shape), "cond_keys": sorted(cond_keys), "encoders": dict(encoders),
                "dataset": spec.to_dict()}
    path = Path(cache_dir) / MANIFEST
    write_text(path, json.dumps(manifest, indent=1, sort_keys=True, default=str))
    return path


class LegacyItems:
    """The items of a format 1 cache (CachedDataset's backend for it): the manifest's list."""

    def __init__(self, cache_dir: Path, manifest: dict[str, Any]):
        self.cache_dir = cache_dir
        self.items: list[dict[str, Any]] = manifest["items"]
        if manifest.get("count") != len(self.items):
            raise CacheError(f"{cache_dir / MANIFEST} says count={manifest.get('count')} but lists {len(self.items)} "
                             "items: run CacheLatents with regenerate on.")
        missing = [it["file"] for it in self.items if not (cache_dir / it["file"]).is_file()]
        if missing:
            raise CacheError(f"cache {cache_dir} is missing {len(missing)} item file(s) (first: {missing[0]}): "
                             "run CacheLatents with regenerate on.")

    def __len__(self) -> int:
        return len(self.items)

    def repeats(self) -> list[int]:
        return [int(it["repeats"]) for it in self.items]

    def buckets(self) -> list[str]:
        return [str(it.get("bucket", "")) for it in self.items]  # caches from before buckets: one key

    def item(self, i: int) -> dict[str, Any]:
        entry = self.items[i]
        path = self.cache_dir / entry["file"]
        try:
            meta, tensors = read_safetensors(path)
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise CacheError(f"cache file {path} (from {entry.get('source')}) cannot be read ({e}): "
                             "run CacheLatents with regenerate on.") from e
        out = {"latent": tensors["latent"], "cross_attn": tensors["cond.cross_attn"],
               "extras": unpack_extras(tensors, "cond", meta.get("cond_none", "[]"), meta.get("cond_json", "{}")),
               "caption": meta.get("caption", ""), "source": entry.get("source", meta.get("source", "")),
               "unbatched": tuple(json.loads(meta.get("cond_unbatched", "[]")))}
        if LOSS_MASK in tensors:
            out[LOSS_MASK] = tensors[LOSS_MASK]
        return out

    def previous(self) -> dict[str, tuple[str, int | None]]:
        """item_key -> (item file, None): where a new cache copies an unchanged item's tensors from."""
        return {it["key"]: (str(self.cache_dir / it["file"]), None) for it in self.items if "key" in it}
