"""Content digests of the files a cache is made from, so the fingerprint notices an edit that keeps
a file's size and modification time (`cp -p`, `rsync -t`, a restored mtime).

A file's digest is blake2b-128 of its bytes. It is kept, with the file's size, mtime, ctime and
inode, in `<first folder>/.pipetrain_cache/file_digests.json`; a later run reads the file again only
when one of those four changed, so a re-run with nothing changed reads no file. ctime (the
status-change time) is set by the system on every write, chmod and rename, and no program can set
it back (utime, `cp -p` and `rsync -t` set only atime and mtime); rsync's rename gives a new inode.
Windows reports the creation time as ctime, so there an in-place edit that restores size and mtime
is noticed only by `regenerate`.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..atomic_files import write_text
from ..data.scan import DatasetItem, DatasetSpec, relative_source
from .format import CACHE_FOLDER

DIGESTS_FILE = "file_digests.json"
_VERSION = 1
_CHUNK = 1 << 20


def file_digest(path: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def content_digests(spec: DatasetSpec, items: list[DatasetItem]) -> dict[str, str]:
    """item path -> digest of its file, mask and control image (joined): what fingerprint() and
    item_key() add to names, sizes and mtimes. Files that cannot be read get '' (encoding reports them)."""
    memo_path = Path(spec.folders[0].path) / CACHE_FOLDER / DIGESTS_FILE
    try:
        memo = json.loads(memo_path.read_text(encoding="utf-8"))
        known = memo["files"] if memo.get("version") == _VERSION else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        known = {}  # none yet, or damaged: every file is read once
    rows: dict[str, list] = {}
    inside = os.path.join(spec.folders[0].path, "")

    def digest(path: str) -> str:
        try:
            st = os.stat(path)
            stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
            # relative to the first folder, as the cache names sources (the fast way for its own files)
            key = path[len(inside):].replace(os.sep, "/") if path.startswith(inside) else relative_source(spec, path)
            row = known.get(key)
            if not (isinstance(row, list) and row[:4] == stamp):
                row = stamp + [file_digest(path)]
            rows[key] = row
            return str(row[4])
        except OSError:
            return ""

    out = {item.path: ",".join(digest(f.path) for f in (item, item.mask, item.control) if f is not None)
           for item in items}
    if rows != known:  # only this dataset's files are kept: deleted files drop out
        try:
            write_text(memo_path, json.dumps({"version": _VERSION, "files": rows}, separators=(",", ":")))
        except OSError:
            pass  # a read-only first folder: CacheLatents says so when it writes the cache
    return out
