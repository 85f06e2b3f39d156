"""Files that appear whole or not at all: every file PipeTrain writes for a user or a later process goes
to a temp file beside its target first and is renamed over it (os.replace) only once it is complete, so
a crash, a full disk or a kill leaves the old file or none, never half of one. Shared by the server
side (nodes, cache) and the training ranks; imports nothing heavy at module level."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def temp_beside(path: Path) -> Path:
    """The temp name used for `path`: hidden, in the same folder (so the rename stays on one disk), per
    process (two processes writing the same file never share a temp file)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path to write; on success it replaces `path`, on any failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_safetensors(path: str | os.PathLike, tensors: dict, metadata: dict | None = None) -> Path:
    """A safetensors file (metadata values as strings), atomically; returns its path."""
    from safetensors.torch import save_file

    with replacing(path) as tmp:
        save_file(tensors, str(tmp), metadata=None if metadata is None else {k: str(v) for k, v in metadata.items()})
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with replacing(path) as tmp:
        tmp.write_bytes(data)
