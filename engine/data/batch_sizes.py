"""Batch size per resolution: LoadDataset's `batch_sizes` ("512:4, 1024:1"), diffusion-pipe's
`micro_batch_size_per_gpu = [[512, 4], [1024, 1]]`.

A sample's resolution is the one of the dataset's resolutions (resolution, extra_resolutions) whose
buckets hold the size it is cached at; a micro step of the run trains one batch of one bucket, so
its size is that resolution's entry here, or the run's batch_size for a resolution not listed.
It changes no cached tensor: it is not in the cache fingerprint (like repeats and caption_dropout),
and the cache's manifest keeps it for training (engine/cache/reader.py). Plain data, no torch.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from ..config.checks import ConfigError
from .buckets import bucket_sizes
from .messages import DatasetError

MAX_BATCH = 1024
_ENTRY = re.compile(r"^\s*(\d+)\s*[:=x]\s*(\d+)\s*$")


def parse_batch_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """'512:4, 1024:1' -> ((512, 4), (1024, 1)); empty -> (): every resolution at the run's batch_size."""
    out = []
    for part in (p for p in re.split(r"[,;\n]", text or "") if p.strip()):
        m = _ENTRY.match(part)
        if not m:
            raise DatasetError(f"batch_sizes entry {part.strip()!r}: write resolution:batch pairs, e.g. "
                               "'512:4, 1024:1', or leave it empty for the run's batch_size everywhere.")
        out.append((int(m.group(1)), int(m.group(2))))
    return tuple(out)


def from_json(value: Any) -> tuple[tuple[int, int], ...]:
    """dataset.batch_sizes from JSON: [[resolution, batch], ...]."""
    try:
        pairs = tuple((int(r), int(b)) for r, b in value)
    except (TypeError, ValueError):
        raise DatasetError(f"dataset.batch_sizes must be a list of [resolution, batch] pairs, e.g. [[512, 4], "
                           f"[1024, 1]]; got {value!r}.") from None
    return pairs


def check_batch_sizes(pairs: tuple[tuple[int, int], ...], resolutions: tuple[int, ...]) -> None:
    seen = set()
    for resolution, batch in pairs:
        if resolution not in resolutions:
            raise DatasetError(
                f"batch_sizes sets {resolution}:{batch}, but the dataset trains at {', '.join(map(str, resolutions))} "
                f"only: give a batch size for one of those, or add {resolution} to extra_resolutions.")
        if resolution in seen:
            raise DatasetError(f"batch_sizes sets resolution {resolution} twice: give each resolution one batch size.")
        if not 1 <= batch <= MAX_BATCH:
            raise DatasetError(f"batch_sizes sets {resolution}:{batch}: use a batch size from 1 to {MAX_BATCH}.")
        seen.add(resolution)


def item_batches(dataset: dict | None, sizes: Iterable[tuple[int, int]]) -> list[int]:
    """Per cached item (its trained (width, height)), its micro batch size from a manifest's dataset
    settings; 0 = the run's batch_size (no entry, or a cache made before batch_sizes existed)."""
    sizes = [tuple(s) for s in sizes]
    pairs = dict(from_json((dataset or {}).get("batch_sizes", [])))
    if not pairs:
        return [0] * len(sizes)
    ratios = tuple(float(x) for x in dataset.get("aspect_ratios", ()))
    multiple = int(dataset.get("bucket_multiple", 64))
    resolutions = [int(dataset["resolution"])] + [int(x) for x in dataset.get("extra_resolutions", ())]
    batch_of: dict[tuple[int, int], int] = {}
    for r in reversed(resolutions):  # a size two resolutions share goes to the first that lists it
        for size in bucket_sizes(r, ratios, multiple):
            batch_of[tuple(size)] = pairs.get(r, 0)
    return [batch_of.get(s, 0) for s in sizes]


def check_varied_batches(varied: bool, pipeline_stages: int) -> None:
    """Batch sizes per resolution need a data-parallel run: DeepSpeed's pipeline passes micro-batches of one size.
    Checked by TrainPipeline before launch and by every rank when it builds the sample stream."""
    if varied and pipeline_stages > 1:
        raise ConfigError(f"LoadDataset's batch_sizes give some resolutions their own batch size, which "
                          f"memory.pipeline_stages {pipeline_stages} cannot train (a pipeline passes micro-batches "
                          "of one size): set pipeline_stages to 1, or clear batch_sizes.")
