"""At engine start: every node must run the same thing. And where each rank sits (node, stage).

Nodes are separate installs: one with another ComfyUI, PipeTrain, torch or DeepSpeed, another
run.json, model file or cache would train something else or hang in a collective much later.
`check_agreement` gathers a few facts from every rank once (one all_gather_object) and stops all
ranks with an error that names the node, the setting and both values. Every function here is a
collective when torch.distributed is initialised: all ranks call it at the same point.
"""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from ..config.rules import data_parallel_size
from ..config.run import RunConfig
from ..launch.cluster import ClusterError, explain_comm_failure, is_comm_failure
from ..launch import processes, rank_exits
from ..version import __version__

# Settings that may differ between nodes: their own paths (compared by content below) and how
# each node was launched (node_rank, master address; command-line overrides).
_NODE_LOCAL = {"run_dir", "comfyui_root", "model_path", "cache_dir", "more_cache_dirs", "eval.cache_dir",
               "launch.cluster"}


def node_rank() -> int:
    return int(os.environ.get("CROSS_RANK", "0"))  # set per node by the per-node launcher


def comfyui_version() -> str:
    """The version of the ComfyUI this process imported (its comfyui_version.py), without importing it."""
    import comfy.model_management  # comfy is a namespace package: ask one of its modules where it is

    # Not resolved: the ComfyUI folder on sys.path may be a tree of links to another install.
    root = os.path.dirname(os.path.dirname(comfy.model_management.__file__))
    path = Path(root) / "comfyui_version.py"
    try:
        m = re.search(r"__version__\s*=\s*[\"']([^\"']+)", path.read_text(encoding="utf-8"))
    except OSError:
        return "unknown"
    return m.group(1) if m else "unknown"


def _versions() -> dict[str, str]:
    import deepspeed

    return {"PipeTrain": __version__, "ComfyUI": comfyui_version(), "torch": torch.__version__.split("+")[0],
            "DeepSpeed": deepspeed.__version__}


def _comparable(data: Any, prefix: str = "") -> dict[str, Any]:
    """run.json flattened to 'section.key' -> value, without the node-local settings."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if name in _NODE_LOCAL:
            continue
        if isinstance(value, dict):
            flat.update(_comparable(value, name + "."))
        elif isinstance(value, str) and os.path.isabs(value):
            flat[name] = os.path.basename(value)  # e.g. lora.init_from: same file name, path may differ
        else:
            flat[name] = value
    return flat


def _facts(cfg: RunConfig) -> dict[str, Any]:
    import json

    def cache(folder: str) -> str:
        manifest = json.loads((Path(folder) / "manifest.json").read_text(encoding="utf-8"))
        return f"fingerprint {manifest.get('fingerprint', '?')} ({manifest.get('count', '?')} items)"
    # chained datasets (more_cache_dirs): each cache compared by its content like the first
    caches = {("cache" if n == 1 else f"cache (dataset {n})"): cache(folder)
              for n, folder in enumerate((cfg.cache_dir, *cfg.more_cache_dirs), start=1)}
    latest = Path(cfg.run_dir) / "checkpoints" / "latest"
    return {
        "rank": tdist.get_rank(), "node": node_rank(), "host": socket.gethostname(), "versions": _versions(),
        "pid": os.getpid(), "start": processes.start_time(os.getpid()) or "",  # a rank that dies is named by pid
        "config": _comparable(cfg.to_dict()),
        "files": {"model file": f"{os.path.basename(cfg.model_path)} ({os.path.getsize(cfg.model_path)} bytes)",
                  **caches},
        # Resuming needs the same checkpoint everywhere; DeepSpeed writes each stage's part on its own node.
        "checkpoint": (latest.read_text().strip() if latest.is_file() else "none") if cfg.resume else "",
    }


def check_agreement(cfg: RunConfig) -> list[dict[str, Any]]:
    """Raise ClusterError on every rank if any node differs from node 0; returns every rank's facts."""
    if not tdist.is_initialized():
        return []
    mine = _facts(cfg)
    facts: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(facts, mine)
    problem = disagreement(facts, cfg.run_dir)
    if problem:
        raise ClusterError(problem)
    data_parallel_size(len(facts), cfg.memory.pipeline_stages, len({f["node"] for f in facts}))
    return facts


def disagreement(facts: list[dict[str, Any]], run_dir: str) -> str:
    """The first way a rank differs from rank 0, as a message naming both nodes and values ('' if none)."""
    ref = facts[0]
    for other in facts[1:]:
        there = f"node {other['node']} (host {other['host']}, rank {other['rank']})"
        here = f"node {ref['node']} (host {ref['host']})"
        for name, value in ref["versions"].items():
            if other["versions"].get(name) != value:
                return (f"{there} runs {name} {other['versions'].get(name)} but {here} runs {name} {value}: "
                        "install the same ComfyUI, PipeTrain, torch and DeepSpeed versions on every node.")
        for name in sorted(set(ref["config"]) | set(other["config"])):
            mine, theirs = ref["config"].get(name), other["config"].get(name)
            if mine != theirs:
                return (f"{there} reads a run.json with {name} = {theirs!r} but {here} has {mine!r}: give every "
                        "node the same run.json (a shared folder, or copy it).")
        for name, value in ref["files"].items():
            if other["files"][name] != value:
                return (f"{there} reads a different {name} ({other['files'][name]}) than {here} ({value}): "
                        "every node needs the same files at the paths in run.json (see docs/multi-node.md).")
        if other["checkpoint"] != ref["checkpoint"]:
            return (f"{there} sees checkpoint {other['checkpoint']!r} in {run_dir}/checkpoints but {here} resumes "
                    f"from {ref['checkpoint']!r}: every node must see the same checkpoints folder; put the run "
                    "folder on a shared filesystem, or copy checkpoints/ to every node before resuming.")
    return ""


def rank_layout(engine, pipelined: bool) -> list[dict[str, Any]]:
    """For each rank: its node, host, pipeline stage and data-parallel replica (the 'started' event)."""
    rank = tdist.get_rank() if tdist.is_initialized() else 0
    if pipelined:
        stage, replica = engine.grid.get_stage_id(), engine.grid.get_data_parallel_rank()
    else:
        stage, replica = 0, rank
    mine = {"rank": rank, "node": node_rank(), "host": socket.gethostname(), "stage": stage, "replica": replica}
    if not tdist.is_initialized():
        return [mine]
    layout: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(layout, mine)
    return layout


def failure_message(exc: BaseException, cfg: RunConfig, peers: list[dict] | None = None) -> str:
    """The 'error' event's text: a lost node reads as one, with what to do; a rank on this host that was
    killed (peers: check_agreement's facts) is named with its pid and signal; anything else as raised."""
    if tdist.is_initialized():
        # a peer's sockets close before its exit ends: on a busy machine it may still look alive for a moment
        lost = rank_exits.lost_ranks(peers or [], tdist.get_rank(), wait_s=3.0 if is_comm_failure(exc) else 0.0)
        explained = explain_comm_failure(exc, cfg, tdist.get_rank(), tdist.get_world_size(), node_rank(), lost)
        if explained:
            return explained
    return f"{type(exc).__name__}: {exc}"
