"""Several datasets in one run: LoadDataset nodes chained through `add_to` (docs/datasets.md).

The chain is one DatasetSpec whose `more` lists the other datasets, flat and in the order they were
added, each with every setting of its own (resolution, buckets, repeats, frames, caption options).
CacheLatents caches each part on its own (its own fingerprint and folder, engine/cache/format.py);
training reads all of them as one sample stream (engine/cache/joined.py). Plain data, no torch.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from .messages import DatasetError

MAX_PARTS = 64  # more is surely a mistake (a loop of links); each part is a cache of its own


def join(add_to, spec):
    """`spec` added to the datasets `add_to` describes (None: `spec` alone), checked as a whole."""
    if add_to is None:
        return spec
    if spec.more:
        raise DatasetError("this LoadDataset's dataset already has datasets added to it: chain the nodes one after "
                           "another (A -> add_to of B -> add_to of C), not into each other's add_to.")
    joined = dataclasses.replace(add_to, more=tuple(add_to.more) + (spec,))
    joined.check()
    return joined


def chained_parts(data: Any, from_dict: Callable[[dict], Any]) -> tuple:
    """dataset.more from JSON: a list of dataset objects, none with a `more` of its own."""
    if not isinstance(data, (list, tuple)):
        raise DatasetError(f"dataset.more must be a list of datasets, got {type(data).__name__}.")
    parts = tuple(from_dict(d) for d in data)
    if any(p.more for p in parts):
        raise DatasetError("dataset.more lists a dataset with a 'more' of its own: list every dataset of the run in "
                           "the first one's 'more', flat.")
    return parts


def check_chain(spec) -> None:
    """Each added dataset's own checks, and no folder in two of them (nor one's mask/control folder another's
    images). Called from DatasetSpec.check."""
    if not spec.more:
        return
    if len(spec.more) + 1 > MAX_PARTS:
        raise DatasetError(f"{len(spec.more) + 1} datasets are chained: use at most {MAX_PARTS}.")
    owner: dict[str, tuple[int, str]] = {}  # realpath -> (dataset number, what it is there)
    for number, part in enumerate(spec.parts, start=1):
        if number > 1:
            try:
                part.check()
            except DatasetError as e:
                raise DatasetError(f"dataset {number} of the chain: {e}") from None
        uses = [(f.path, "a folder") for f in part.folders] + \
            [(getattr(part, s), s) for s in ("mask_folder", "control_folder") if getattr(part, s)]
        for path, what in uses:
            key = os.path.normcase(os.path.realpath(path))
            if key in owner and owner[key][0] != number:
                first, was = owner[key]
                raise DatasetError(
                    f"{path} is {what} of dataset {number} and {was} of dataset {first} of the chained LoadDataset "
                    "nodes: each folder may belong to one dataset only (its images would train twice, at two "
                    "settings). Remove it from one of them; for another size of the same images use "
                    "extra_resolutions, to show them more often use repeats.")
            owner.setdefault(key, (number, what))


def part_name(spec, number: int) -> str:
    """'dataset 2 (cats)': how reports name a part of the chain."""
    return f"dataset {number} ({os.path.basename(os.path.normpath(spec.folders[0].path))})"
