"""The global batch of a resume on another number of GPUs (engine/config/revisions.py asks it).

The samples of an optimizer step are batch_size x grad_accum x data-parallel replicas, and their order
is a function of (seed, step) only (engine/train/sample_order.py). So a resume on another number of
GPUs computes what an uninterrupted run computes when train.grad_accum makes up for it (2 GPUs at
grad_accum 1 -> 1 GPU at grad_accum 2): grad_accum is judged through the global batch wherever the
replicas of both starts are known. Plain data, no torch.
"""
from __future__ import annotations

from typing import Any

NAME = ("global batch (train.batch_size x train.grad_accum x data-parallel replicas, which are "
        "launch.num_gpus x nodes / memory.pipeline_stages)")
HINT = (" To resume on another number of GPUs, keep the global batch: scale train.grad_accum inversely "
        "(e.g. 2 GPUs at grad_accum 1 -> 1 GPU at grad_accum 2).")


def replicas_of(config: dict[str, Any]) -> int | None:
    """The data-parallel replicas a run.json launches (None: its nodes are known only from the hostfile)."""
    launch, memory = config.get("launch") or {}, config.get("memory") or {}
    cluster = launch.get("cluster") or {}
    nodes = cluster.get("num_nodes") or (0 if cluster.get("hostfile") else 1)
    if not nodes:
        return None
    return max(1, launch.get("num_gpus", 1) * nodes // max(1, memory.get("pipeline_stages", 1)))


def size(config: dict[str, Any], replicas: int) -> int:
    train = config.get("train") or {}
    return train.get("batch_size", 1) * train.get("grad_accum", 1) * replicas


def judged(changed: list[tuple[str, Any, Any]], before: dict[str, Any], after: dict[str, Any],
           replicas: tuple[int | None, int | None]) -> list[tuple[str, Any, Any]]:
    """`changed` (revisions.result_changes) with train.grad_accum judged by the global batch where the
    replicas (before, after) are both known: a grad_accum change that keeps it is none, and another
    number of replicas that changes it is one, (NAME, size before, size after). A pipelined run resumed
    data parallel (memory.pipeline_stages -> 1, its pipeline_split gone) computes the same (a pipeline
    trains like one process); other stage changes stay changes (engine/train/elastic.py)."""
    if (after.get("memory") or {}).get("pipeline_stages", 1) == 1:
        changed = [c for c in changed if c[0] not in ("memory.pipeline_stages", "memory.pipeline_split")]
    if None in replicas:
        return changed
    then, now = size(before, replicas[0]), size(after, replicas[1])
    kept = [c for c in changed if c[0] != "train.grad_accum"]
    return kept if then == now else kept + [(NAME, then, now)]
