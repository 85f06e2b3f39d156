"""Which cached samples each rank trains on at each step, reproducibly.

The global sample stream is epoch after epoch of a seeded permutation of the items (each item
listed `repeats` times). Optimizer step s, micro step j, rank r takes the `batch` consecutive
stream positions starting at ((s * gas + j) * world + r) * batch. So the data position is a pure
function of the step (resume needs no extra state), and N processes at gas 1 see exactly the
samples one process sees at gas N.

Buckets (items whose latents or caption tensors differ in shape, cache_format.shapes_bucket): each
epoch, every bucket's items are permuted and cut into runs of `batch`, the runs are permuted,
and laid end to end. Micro-batches start at multiples of `batch`, so each holds one run: one
bucket, stacked without padding. A bucket whose count is not a multiple of `batch` fills its
last run with its own first items again (nothing is dropped; a few items are seen twice).

Batch size per resolution (LoadDataset's batch_sizes, `batches`: each item's micro batch, 0 = `batch`):
when any differs from `batch`, a bucket's runs have its items' batch size, so runs differ in length.
Micro step k of the run (k = (s * gas + j) * world + r, as above) then takes run k of the stream:
run k % R of epoch k // R, R runs per epoch in that epoch's seeded order, its samples at the stream
positions where that run lies. Still a pure function of (seed, step); with one batch size everywhere
the stream is the one above, position for position.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .caption_picks import pick_items


class SampleStream:
    def __init__(self, repeats: list[int], seed: int, buckets: list[str] | None = None, batch: int = 1,
                 batches: list[int] | None = None):
        self.index = [item for item, r in enumerate(repeats) for _ in range(max(1, r))]
        if not self.index:
            raise ValueError("the cache holds no samples")
        self.seed = seed
        self.batch = max(1, batch)
        keys = list(buckets) if buckets is not None else [""] * len(repeats)
        if len(keys) != len(repeats):
            raise ValueError(f"{len(keys)} bucket keys for {len(repeats)} items")
        sizes = [b or self.batch for b in batches] if batches is not None else [self.batch] * len(repeats)
        if len(sizes) != len(repeats):
            raise ValueError(f"{len(sizes)} batch sizes for {len(repeats)} items")
        # runs of different lengths only when some item's batch size is not the run's (module doc)
        self.varied = any(b != self.batch for b in sizes)
        groups: dict[tuple[str, int], list[int]] = {}
        for item in self.index:
            groups.setdefault((keys[item], sizes[item]), []).append(item)
        # one bucket: the plain permutation (batches may cross epochs); kept as it was before buckets
        self.groups = [groups[k] for k in sorted(groups)] if len(groups) > 1 or self.varied else None
        self._run_sizes = [k[1] for k in sorted(groups)] if self.groups is not None else []
        self.padded = 0 if self.groups is None else sum(-len(g) % b for g, b in zip(self.groups, self._run_sizes))
        self._length = len(self.index) + self.padded
        self.runs_per_epoch = (sum(-(-len(g) // b) for g, b in zip(self.groups, self._run_sizes))
                               if self.groups is not None else 0)
        self._epoch, self._order, self._starts = -1, None, None

    def __len__(self) -> int:
        return self._length

    def bucket_counts(self) -> list[int]:
        """Samples per bucket per epoch (with repeats, before filling the last runs)."""
        return [len(self.index)] if self.groups is None else [len(g) for g in self.groups]

    def item_at(self, position: int) -> int:
        epoch, offset = divmod(position, self._length)
        self._load(epoch)
        return self._order[offset]

    def _load(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._order, self._starts = self._epoch_order(torch.Generator().manual_seed(self.seed * 7919 + epoch))
            self._epoch = epoch

    def _epoch_order(self, gen: torch.Generator) -> tuple[list[int], list[int]]:
        """The epoch's items in stream order, and where each of its runs starts (bucketed streams only)."""
        if self.groups is None:
            return [self.index[p] for p in torch.randperm(len(self.index), generator=gen).tolist()], []
        runs = []
        for group, size in zip(self.groups, self._run_sizes):
            order = [group[p] for p in torch.randperm(len(group), generator=gen).tolist()]
            fill = -len(order) % size
            order += (order * (fill // len(order) + 1))[:fill]
            runs += [order[i:i + size] for i in range(0, len(order), size)]
        laid = [runs[r] for r in torch.randperm(len(runs), generator=gen).tolist()]
        starts = [0]
        for run in laid:
            starts.append(starts[-1] + len(run))
        return [item for run in laid for item in run], starts

    def micro_positions(self, step: int, micro: int, rank: int, world: int, grad_accum: int) -> list[int]:
        """The stream positions a micro step of a rank trains: `batch` consecutive ones, or with batch sizes
        per resolution (varied) the run whose turn it is (module doc)."""
        if not self.varied:
            return self.positions(step, micro, rank, world, grad_accum, self.batch)
        epoch, run = divmod((step * grad_accum + micro) * world + rank, self.runs_per_epoch)
        self._load(epoch)
        base = epoch * self._length
        return list(range(base + self._starts[run], base + self._starts[run + 1]))

    def steps_for_epochs(self, epochs: float, batch: int, grad_accum: int, replicas: int) -> int:
        """Optimizer steps for `epochs` passes: by samples, or with varied runs by micro steps (one run each)."""
        if self.varied:
            return steps_for_epochs(epochs, self.runs_per_epoch, grad_accum * replicas)
        return steps_for_epochs(epochs, len(self), batch * grad_accum * replicas)

    @staticmethod
    def positions(step: int, micro: int, rank: int, world: int, grad_accum: int, batch: int) -> list[int]:
        start = ((step * grad_accum + micro) * world + rank) * batch
        return list(range(start, start + batch))


def steps_for_epochs(epochs: float, samples_per_epoch: int, samples_per_step: int) -> int:
    return max(1, math.ceil(epochs * samples_per_epoch / samples_per_step))


def collate(dataset, stream: SampleStream, positions: list[int], device: torch.device,
            uncond: bool = False) -> tuple[torch.Tensor, list[dict[str, Any]], list[int]]:
    """Load the samples at these stream positions, each with the caption it trains with (caption_picks):
    (latents [B,...], conds, sample ids). uncond: each cond also holds the item on the empty caption under
    "uncond" (CFG-augmented training, engine/train/cfg_augment.py)."""
    items = pick_items(dataset, stream, positions)
    latents, conds = batch_items(items, device)
    if uncond:
        ids = [stream.item_at(p) for p in positions]
        _, blanks = batch_items([dataset.without_caption(i, item) for i, item in zip(ids, items)], device)
        for cond, blank in zip(conds, blanks):
            cond["uncond"] = blank
    return latents, conds, positions


def batch_items(items: list[dict[str, Any]], device: torch.device) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """Cached items (CachedDataset's dicts) as the objective takes them: (latents [B,...], conds)."""
    shapes = {tuple(it["latent"].shape) for it in items}
    if len(shapes) > 1:  # SampleStream keeps buckets apart; this means the stream was built without them
        raise ValueError(f"latents of different sizes {sorted(shapes)} in one batch: build SampleStream with the "
                         "cache's buckets and the batch size (or use batch_size 1)")
    latents = torch.stack([it["latent"] for it in items]).to(device)
    conds = [{"cross_attn": it["cross_attn"].to(device),
              "extras": {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in it["extras"].items()},
              "unbatched": tuple(it.get("unbatched", ()))}  # extras ComfyUI keeps without a batch dim
             for it in items]
    for cond, it in zip(conds, items):
        if it.get("loss_mask") is not None:  # the mask_folder's weights (objective.loss_mask)
            cond["loss_mask"] = it["loss_mask"].to(device)
    return latents, conds
