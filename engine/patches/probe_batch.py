"""The small forward engine/patches/ probes the model's blocks with: one cached sample, cropped.

The first item of the cache, with its latent cut to at most PROBE_CELLS x PROBE_CELLS latent cells
(a small token count at any resolution: the probe's cost stays near a block's at the smallest
size), and every conditioning tensor laid out on the same latent grid (noise masks, loss masks,
concat latents at latent size) cut the same way. Frames, text and reference latents are kept. A
model that refuses the cut input is probed on the whole sample instead.
"""
from __future__ import annotations

from typing import Any

import torch

PROBE_CELLS = 16


def _crop(value: Any, grid: tuple[int, int], size: tuple[int, int]) -> Any:
    if torch.is_tensor(value) and value.ndim >= 2 and tuple(value.shape[-2:]) == grid:
        return value[..., : size[0], : size[1]]
    return value


def cropped(item: dict[str, Any], cells: int = PROBE_CELLS) -> dict[str, Any]:
    """A copy of a cached item whose latent grid is at most cells x cells."""
    latent = item["latent"]
    grid = tuple(latent.shape[-2:])
    size = (min(grid[0], cells), min(grid[1], cells))
    if size == grid:
        return item
    out = dict(item)
    out["latent"] = latent[..., : size[0], : size[1]]
    out["extras"] = {k: _crop(v, grid, size) for k, v in item["extras"].items()}
    if item.get("loss_mask") is not None:
        out["loss_mask"] = _crop(item["loss_mask"], grid, size)
    return out


def call_context(item: dict[str, Any]) -> str:
    """What of the sample decides code paths in the blocks: latent rank and conditioning kinds."""
    extras = sorted(k for k, v in item["extras"].items() if v is not None)
    return f"{item['latent'].ndim}d:" + ",".join(extras) + (":loss_mask" if item.get("loss_mask") is not None else "")


def probe_forward(objective, dataset, device: torch.device):
    """(run_forward, context) for engine.patches.make_trainable, from the cache's first item."""
    from ..train.sample_order import batch_items

    item = dataset[0]
    small = batch_items([cropped(item)], device)
    whole = batch_items([item], device)

    def run_forward():
        try:
            objective(*small, [0])
        except Exception:  # noqa: BLE001 - the cut sample is only an optimisation
            objective(*whole, [0])
    return run_forward, call_context(item)
