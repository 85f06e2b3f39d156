"""Reading a complete latent cache: `CachedDataset`, what training, the eval set and the node's
preflight open. Format 2 (shards + metadata table, engine/cache/shards.py) and format 1 (one file
per item, engine/cache/legacy.py) read the same way; the layout is engine/cache/format.py's.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..data.batch_sizes import item_batches
from .caption_store import has_empty_caption, read_empty_caption, read_variant, swap_caption
from .format import CacheError, CacheSpec, read_manifest
from .legacy import LegacyItems
from .shards import ShardedItems


class CachedDataset:
    """Random access to a complete cache. Opening it reads the manifest and memory-maps the metadata
    table (format 2); items are read lazily, one shard lookup per access, so a process holds only what
    it is using."""

    def __init__(self, cache_dir: str | os.PathLike):
        self.cache_dir = Path(cache_dir)
        self.manifest = read_manifest(self.cache_dir)
        if self.manifest["version"] == 1:
            self._store = LegacyItems(self.cache_dir, self.manifest)
        else:
            self._store = ShardedItems(self.cache_dir, self.manifest)
        self._repeats = None
        self._empty = None
        if self.caption_dropout and not has_empty_caption(self.cache_dir):  # refused at open: before any step
            raise CacheError(f"cache {cache_dir} is set to caption_dropout {self.caption_dropout} but holds no "
                             "encoding of the empty caption: run CacheLatents again (it encodes only that, once), or set "
                             "LoadDataset's caption_dropout to 0 and run it.")

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return tuple(self.manifest["latent_shape"])

    @property
    def items(self) -> list[dict[str, Any]]:
        """Per item: file, source, repeats, size, bucket, key (format 2 builds it from `table` on request)."""
        return self._store.items

    @property
    def table(self):
        """Format 2: the metadata table (a memory-mapped `datasets.Dataset`)."""
        return self._store.table

    def __len__(self) -> int:
        return len(self._store)

    def repeats(self, i: int) -> int:
        if self._repeats is None:
            self._repeats = self._store.repeats()  # the table's value: see fingerprint() on why
        return int(self._repeats[i])

    def batches(self) -> list[int]:
        """Per item, its micro batch size by LoadDataset's batch_sizes (engine/data/batch_sizes.py); 0 = the
        run's batch_size (no entry for its resolution, or a cache made before batch_sizes existed)."""
        dataset = self.manifest.get("dataset") or {}
        if not dataset.get("batch_sizes"):
            return [0] * len(self)
        return item_batches(dataset, [tuple(it["size"]) for it in self.items])

    def buckets(self) -> list[str]:
        """Per item, the key of the batches it may join (shapes_bucket); caches written before buckets
        existed hold one latent size and get one key."""
        return self._store.buckets()

    def previous(self) -> dict[str, tuple[str, int | None]]:
        """item_key -> (file, item index in it or None for a format 1 item file): what a new cache of
        the same encoders copies unchanged items from."""
        return self._store.previous()

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise IndexError(f"item {i} of a cache of {len(self)}")
        return self._store.item(i)

    @property
    def caption_dropout(self) -> float:
        """LoadDataset's caption_dropout this cache was made with (training reads it here; 0 = off)."""
        return float((self.manifest.get("dataset") or {}).get("caption_dropout", 0.0))

    def caption_lines(self, i: int) -> list[int]:
        """Item i's caption encodings per line of its caption file: [1] = its own only
        (engine/cache/caption_store.py)."""
        lines = getattr(self._store, "caption_lines", None)  # format 1 caches hold one encoding per item
        return lines(i) if lines is not None else [1]

    def with_caption(self, i: int, k: int) -> dict[str, Any]:
        """Item i with its caption encoding k (0: the item as stored)."""
        item = self[i]
        return item if k == 0 else swap_caption(item, *read_variant(*self._store.caption_variant(i, k), k))

    def dropout_of(self, i: int) -> float:
        """The caption_dropout item i trains with (chained datasets: its own dataset's; engine/cache/joined.py)."""
        return self.caption_dropout

    def without_caption(self, i: int, item: dict[str, Any]) -> dict[str, Any]:
        """Item i (as `item`, with the caption it was picked with) trained with the empty caption."""
        return self.with_empty_caption(item)

    def with_empty_caption(self, item: dict[str, Any]) -> dict[str, Any]:
        """The item trained with the empty caption (caption_dropout)."""
        if self._empty is None:
            self._empty = read_empty_caption(self.cache_dir)
        return swap_caption(item, *self._empty, "")

    def spec(self) -> CacheSpec:
        return CacheSpec(str(self.cache_dir), self.fingerprint, len(self), self.latent_shape)
