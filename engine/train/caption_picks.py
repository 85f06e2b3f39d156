"""Which caption encoding each sample trains with: one of its cached variants (LoadDataset's caption_lines and
tag_shuffles, engine/data/caption_variants.py), or the empty caption (caption_dropout).

Like the sample order (engine/train/sample_order.py), every pick is a pure function of (seed, stream
position): resume and every data-parallel rank see the picks one uninterrupted run sees.
- Dropout: the sample at position p trains with the empty caption when a uniform draw from (seed, p) is
  below caption_dropout, so about that share of the samples do, the same ones in every run with that seed.
- Lines: an item of L caption lines trains line (epoch + offset) mod L in an epoch, the offset drawn from
  (seed, item): over L epochs each line once. Tag orders: one of the line's orders, drawn from (seed, p).
- A batch is stacked, so its captions must have one length. When the picked encodings differ in shape
  (a text encoder without fixed padding), the micro-batch follows its first sample: every item takes
  that sample's variant number (the cache's buckets make those agree), and is dropped when it is.
"""
from __future__ import annotations

import hashlib
from typing import Any


def unit_draw(seed: int, what: str, n: int) -> float:
    """A uniform number in [0, 1) from (seed, what, n), the same on every machine."""
    digest = hashlib.blake2b(f"{seed}\0{what}\0{n}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def dropped(seed: int, fraction: float, position: int) -> bool:
    """Whether the sample at this stream position trains with the empty caption."""
    return fraction > 0 and unit_draw(seed, "caption_dropout", position) < fraction


def encoding_index(lines: list[int], seed: int, epoch: int, item: int, position: int) -> int:
    """Which of an item's encodings (lines[i] of them for line i, in order) the sample at `position` takes."""
    if lines == [1]:
        return 0
    line = (epoch + int(unit_draw(seed, "caption_line", item) * len(lines))) % len(lines)
    return sum(lines[:line]) + int(unit_draw(seed, "caption_order", position) * lines[line])


def _shapes(item: dict[str, Any]) -> tuple:
    extras = item["extras"]
    return (tuple(item["cross_attn"].shape),
            tuple(sorted((k, tuple(v.shape)) for k, v in extras.items() if hasattr(v, "shape"))))


def _one_shape(items: list[dict[str, Any]]) -> bool:
    return len({_shapes(it) for it in items}) <= 1


def pick_items(dataset, stream, positions: list[int]) -> list[dict[str, Any]]:
    """The items at these stream positions, each with the caption encoding it trains with."""
    ids = [stream.item_at(p) for p in positions]
    if not hasattr(dataset, "with_caption") or not hasattr(stream, "seed"):  # the eval set, test doubles
        return [dataset[i] for i in ids]
    seed, length = stream.seed, len(stream)
    lines = [dataset.caption_lines(i) for i in ids]
    picks = [encoding_index(n, seed, p // length, i, p) for n, i, p in zip(lines, ids, positions)]
    items = [dataset.with_caption(i, k) for i, k in zip(ids, picks)]
    if not _one_shape(items):
        items = [dataset.with_caption(i, picks[0] if picks[0] < sum(n) else 0) for i, n in zip(ids, lines)]
    # each item's own dataset's caption_dropout (chained datasets differ: engine/cache/joined.py)
    drops = [dropped(seed, dataset.dropout_of(i), p) for i, p in zip(ids, positions)]
    if any(drops):
        out = [dataset.without_caption(i, it) if d else it for i, it, d in zip(ids, items, drops)]
        if not _one_shape(out):
            out = [dataset.without_caption(i, it) for i, it in zip(ids, items)] if drops[0] else items
        items = out
    return items
