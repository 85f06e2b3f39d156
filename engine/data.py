"""Which cached samples each rank trains on at each step, reproducibly.

The global sample stream is epoch after epoch of a seeded permutation of the items (each item
listed `repeats` times). Optimizer step s, micro step j, rank r takes the `batch` consecutive
stream positions starting at ((s * gas + j) * world + r) * batch. So the data position is a pure
function of the step (resume needs no extra state), and N processes at gas 1 see exactly the
samples one process sees at gas N.
"""
from __future__ import annotations

import math
from typing import Any

import torch


class SampleStream:
    def __init__(self, repeats: list[int], seed: int):
        self.index = [item for item, r in enumerate(repeats) for _ in range(max(1, r))]
        if not self.index:
            raise ValueError("the cache holds no samples")
        self.seed = seed
        self._epoch, self._perm = -1, None

    def __len__(self) -> int:
        return len(self.index)

    def item_at(self, position: int) -> int:
        epoch, offset = divmod(position, len(self.index))
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._perm = torch.randperm(len(self.index), generator=gen).tolist()
            self._epoch = epoch
        return self.index[self._perm[offset]]

    @staticmethod
    def positions(step: int, micro: int, rank: int, world: int, grad_accum: int, batch: int) -> list[int]:
        start = ((step * grad_accum + micro) * world + rank) * batch
        return list(range(start, start + batch))


def steps_for_epochs(epochs: float, samples_per_epoch: int, samples_per_step: int) -> int:
    return max(1, math.ceil(epochs * samples_per_epoch / samples_per_step))


def collate(dataset, stream: SampleStream, positions: list[int], device: torch.device) -> tuple[torch.Tensor, list[dict[str, Any]], list[int]]:
    """Load the samples at these stream positions: (latents [B,...], conds, sample ids)."""
    items = [dataset[stream.item_at(p)] for p in positions]
    shapes = {tuple(it["latent"].shape) for it in items}
    if len(shapes) > 1:
        raise ValueError(f"latents of different sizes {sorted(shapes)} in one batch: use batch_size 1")
    latents = torch.stack([it["latent"] for it in items]).to(device)
    conds = [{"cross_attn": it["cross_attn"].to(device),
              "extras": {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in it["extras"].items()}}
             for it in items]
    return latents, conds, positions
