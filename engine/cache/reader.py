"""Reading a complete latent cache: `CachedDataset`, what training, the eval set and the node's
preflight open. Format 2 (shards + metadata table, engine/cache/shards.py) and format 1 (one file
per item, engine/cache/legacy.py) read the same way; the layout is engine/cache/format.py's.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .format import CacheSpec, read_manifest
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

    def spec(self) -> CacheSpec:
        return CacheSpec(str(self.cache_dir), self.fingerprint, len(self), self.latent_shape)
