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
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .caption_picks import pick_items


class SampleStream:
    def __init__(self, repeats: list[int], seed: int, buckets: list[str] | None = None, batch: int = 1):
        self.index = [item for item, r in enumerate(repeats) for _ in range(max(1, r))]
        if not self.index:
            raise ValueError("the cache holds no samples")
        self.seed = seed
        self.batch = max(1, batch)
        keys = list(buckets) if buckets is not None else [""] * len(repeats)
        if len(keys) != len(repeats):
            raise ValueError(f"{len(keys)} bucket keys for {len(repeats)} items")
        groups: dict[str, list[int]] = {}
        for item in self.index:
            groups.setdefault(keys[item], []).append(item)
        # one bucket: the plain permutation (batches may cross epochs); kept as it was before buckets
        self.groups = [groups[k] for k in sorted(groups)] if len(groups) > 1 else None
        self.padded = 0 if self.groups is None else sum(-len(g) % self.batch for g in self.groups)
        self._length = len(self.index) + self.padded
        self._epoch, self._order = -1, None

    def __len__(self) -> int:
        return self._length

    def bucket_counts(self) -> list[int]:
        """Samples per bucket per epoch (with repeats, before filling the last runs)."""
        return [len(self.index)] if self.groups is None else [len(g) for g in self.groups]

    def item_at(self, position: int) -> int:
        epoch, offset = divmod(position, self._length)
        if epoch != self._epoch:
            self._order = self._epoch_order(torch.Generator().manual_seed(self.seed * 7919 + epoch))
            self._epoch = epoch
        return self._order[offset]

    def _epoch_order(self, gen: torch.Generator) -> list[int]:
        if self.groups is None:
            return [self.index[p] for p in torch.randperm(len(self.index), generator=gen).tolist()]
        runs = []
        for group in self.groups:
            order = [group[p] for p in torch.randperm(len(group), generator=gen).tolist()]
            fill = -len(order) % self.batch
            order += (order * (fill // len(order) + 1))[:fill]
            runs += [order[i:i + self.batch] for i in range(0, len(order), self.batch)]
        return [item for r in torch.randperm(len(runs), generator=gen).tolist() for item in runs[r]]

    @staticmethod
    def positions(step: int, micro: int, rank: int, world: int, grad_accum: int, batch: int) -> list[int]:
        start = ((step * grad_accum + micro) * world + rank) * batch
        return list(range(start, start + batch))


def steps_for_epochs(epochs: float, samples_per_epoch: int, samples_per_step: int) -> int:
    return max(1, math.ceil(epochs * samples_per_epoch / samples_per_step))


def collate(dataset, stream: SampleStream, positions: list[int], device: torch.device) -> tuple[torch.Tensor, list[dict[str, Any]], list[int]]:
    """Load the samples at these stream positions, each with the caption it trains with (caption_picks):
    (latents [B,...], conds, sample ids)."""
    latents, conds = batch_items(pick_items(dataset, stream, positions), device)
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
