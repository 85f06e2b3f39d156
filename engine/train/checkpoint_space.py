"""A checkpoint that failed to write, most often on a full disk: the half-written folder goes (it
would be mistaken for a checkpoint and holds the space), and a full disk reads as one, with the path,
the space a checkpoint needs (the previous one's size) and what is free. The checkpoint `latest`
names and the LoRA files are never touched."""
from __future__ import annotations

import errno
import gc
import shutil
import traceback
from pathlib import Path

MIN_FREE = 64 * 2**20  # less than this free when a write failed: the disk was full


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the message says why and what to do."""


def failed_save(exc: BaseException, root: Path, tag: str) -> CheckpointWriteError | None:
    """After engine.save_checkpoint raised `exc` for <root>/<tag>: remove what it wrote; the error to
    raise instead when the disk was full, else None (re-raise `exc`)."""
    latest = (root / "latest").read_text().strip() if (root / "latest").is_file() else ""
    partial = root / tag
    free_then = _free(root)
    written = folder_size(partial)
    needed = folder_size(root / latest) if latest and latest != tag else 0
    _release_files(exc)
    if partial.is_dir() and tag != latest:
        shutil.rmtree(partial, ignore_errors=True)
    if not (_no_space(exc) or free_then < max(needed, MIN_FREE)):
        return None
    if needed:
        need = f"it needs about {human(needed)} (the size of the previous checkpoint, {latest})"
        then = f"then resume: training continues from {latest}"
    else:
        need = f"it needs more than the {human(written)} written before the disk filled"
        then = "then train again (there is no earlier checkpoint to resume from)"
    cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return CheckpointWriteError(
        f"disk full: the checkpoint {partial} could not be written: {need}, and {human(_free(root))} are free "
        f"there. Free space on that disk or move the run folder to a larger one, {then}. The partial folder "
        f"was removed; earlier checkpoints and the LoRA files are untouched. (The writer said: {cause})")


def folder_size(folder: Path) -> int:
    if not folder.is_dir():
        return 0
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _free(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def _release_files(exc: BaseException | None) -> None:
    """Close the writer's files: the failed frames hold them open, and a removed file that is still
    open keeps its space (the error event and train.log could not be written then)."""
    while exc is not None:
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__
    gc.collect()


def _no_space(exc: BaseException | None) -> bool:
    """ENOSPC or EDQUOT anywhere in the exception's chain (torch's zip writer hides it in its text)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
