"""The caches of chained datasets (LoadDataset's add_to) read as one: what training opens.

Item i of the whole is item i - offset of the part that holds it, parts in the chain's order, so
the sample stream (engine/train/sample_order.py) sees every item of every dataset, each with its
own dataset's repeats. Bucket keys get the part's number in front: a batch never holds items of
two datasets (each may have its own batch size some day, and their latents usually differ). One
cache alone is opened as it always was, so runs of one dataset read and order exactly as before.
"""
from __future__ import annotations

import bisect
import os
from typing import Any, Sequence

from .format import CacheError
from .reader import CachedDataset


def open_caches(cache_dir: str | os.PathLike, more: Sequence[str] = ()):
    """The training cache: a CachedDataset, or JoinedCaches when run.json lists more_cache_dirs."""
    first = CachedDataset(cache_dir)
    return JoinedCaches([first] + [CachedDataset(d) for d in more]) if more else first


def joined_buckets(per_part: Sequence[Sequence[str]]) -> list[str]:
    """Every item's bucket key, prefixed with its part's number so that no batch mixes datasets."""
    return [f"dataset{n} {key}" for n, keys in enumerate(per_part) for key in keys]


class JoinedCaches:
    """CachedDataset's reading interface over several caches, one after another."""

    def __init__(self, parts: list[CachedDataset]):
        channels = {p.latent_shape[0] for p in parts}
        if len(channels) > 1:
            listed = ", ".join(f"{p.cache_dir} ({p.latent_shape[0]})" for p in parts)
            raise CacheError(f"the run's caches hold latents of different channel counts: {listed}. Cache every "
                             "dataset with the same VAE (one Cache Latents node caches all chained datasets).")
        self.parts = parts
        self._starts = [0]
        for p in parts:
            self._starts.append(self._starts[-1] + len(p))

    def _find(self, i: int) -> tuple[CachedDataset, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"item {i} of {len(self)} cached items")
        n = bisect.bisect_right(self._starts, i) - 1
        return self.parts[n], i - self._starts[n]

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i: int) -> dict[str, Any]:
        part, j = self._find(i)
        return part[j]

    @property
    def fingerprint(self) -> str:
        """Every part's fingerprint, in order (the LoRA file's dataset metadata)."""
        return "+".join(p.fingerprint for p in self.parts)

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return self.parts[0].latent_shape

    @property
    def cache_dir(self):
        return self.parts[0].cache_dir

    def repeats(self, i: int) -> int:
        part, j = self._find(i)
        return part.repeats(j)

    def buckets(self) -> list[str]:
        return joined_buckets([p.buckets() for p in self.parts])

    def batches(self) -> list[int]:
        return [b for p in self.parts for b in p.batches()]

    def caption_lines(self, i: int) -> list[int]:
        part, j = self._find(i)
        return part.caption_lines(j)

    def with_caption(self, i: int, k: int) -> dict[str, Any]:
        part, j = self._find(i)
        return part.with_caption(j, k)

    def dropout_of(self, i: int) -> float:
        part, j = self._find(i)
        return part.dropout_of(j)

    def without_caption(self, i: int, item: dict[str, Any]) -> dict[str, Any]:
        part, _ = self._find(i)
        return part.with_empty_caption(item)
