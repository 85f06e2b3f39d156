"""The owner of a run folder: <run_dir>/run.lock names the process training in it (standard library).

One launch at a time per folder (per node: node N of a shared folder locks run-node<N>.lock). The
lock holds pid, start time and host (engine/launch/processes.py). The node claims it before it
touches run.json, `launcher.spawn` hands it to the launcher process it starts, and whoever waited for
that process releases it. A lock whose process is gone, or whose pid now belongs to a process with
another start time (a kill -9 of everything, a reboot), is stale: the next launch takes it over.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from ..config.checks import ConfigError
from . import processes

LOCK_FILE = "run.lock"
_CLAIMING_S = 10.0  # an empty lock this young is being written by another launch


class RunFolderBusy(ConfigError):
    """The run folder belongs to a live run."""


def lock_path(run_dir: str | os.PathLike, node_rank: int = 0) -> Path:
    return Path(run_dir) / (LOCK_FILE if node_rank == 0 else f"run-node{node_rank}.lock")


def holder(run_dir: str | os.PathLike, node_rank: int = 0) -> dict | None:
    """The live process that holds the folder, or None (no lock, or a stale one)."""
    held = _read(lock_path(run_dir, node_rank))
    return held if held is not None and processes.is_running(held) else None


def claim(run_dir: str | os.PathLike, node_rank: int = 0) -> None:
    """Make this process the folder's owner; refuse a folder a live process holds (RunFolderBusy).
    Claiming a folder this process already holds is a no-op."""
    path = lock_path(run_dir, node_rank)
    me = {**processes.identity(), "since": round(time.time())}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            held = _read(path)
            if held is None and time.time() - _mtime(path) < _CLAIMING_S:
                raise RunFolderBusy(f"run folder {Path(run_dir)} is being claimed by another launch right now "
                                    "(its run.lock is being written): wait a moment and try again.") from None
            if held is not None and _same(held, me):
                return
            if held is not None and processes.is_running(held):
                raise RunFolderBusy(busy_message(run_dir, held, path)) from None
            _remove_if_unchanged(path, held)  # stale: take it over
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(me, f)
        return
    raise RunFolderBusy(f"could not take over the lock {path}: another launch keeps claiming it.")


@contextlib.contextmanager
def claimed(run_dir: str | os.PathLike, node_rank: int = 0):
    """claim() for the block; this process's own claim ends with it (a launcher it handed over to keeps it)."""
    claim(run_dir, node_rank)
    try:
        yield
    finally:
        release(run_dir, node_rank, os.getpid())


def hand_over(run_dir: str | os.PathLike, node_rank: int, pid: int) -> None:
    """The folder now belongs to process `pid` (the launcher this process started)."""
    path = lock_path(run_dir, node_rank)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({**processes.identity(pid), "since": round(time.time())}), encoding="utf-8")
    os.replace(tmp, path)


def release(run_dir: str | os.PathLike, node_rank: int, pid: int) -> None:
    """Remove the lock if process `pid` holds it (a lock another launch took over is left alone)."""
    path = lock_path(run_dir, node_rank)
    held = _read(path)
    if held is not None and int(held.get("pid", -1)) == pid and held.get("host") == processes.identity()["host"]:
        _remove_if_unchanged(path, held)


def busy_message(run_dir: str | os.PathLike, held: dict, path: Path) -> str:
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(held.get("since", 0)))
    here = held.get("host") == processes.identity()["host"]
    where = "" if here else f" on host {held.get('host')}"
    stop = (f"or stop it (Cancel in the ComfyUI that runs it, Ctrl+C in its shell, or `kill {held['pid']}`: each "
            "saves a checkpoint)" if here else f"or, if no run is training there any more, delete {path}")
    return (f"run folder {Path(run_dir)} is still training (pid {held['pid']}{where}, since {since}): two trainings "
            f"would write the same checkpoints and events. Wait for it to end, {stop}; then resume it.")


def _read(path: Path) -> dict | None:
    try:
        held = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return held if isinstance(held, dict) and isinstance(held.get("pid"), int) else None


def _same(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("pid", "start", "host"))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _remove_if_unchanged(path: Path, seen: dict | None) -> None:
    """Unlink the lock unless another launch replaced it since it was read as `seen`."""
    if _read(path) == seen:
        path.unlink(missing_ok=True)
