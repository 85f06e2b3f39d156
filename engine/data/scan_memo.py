"""The dataset scan LoadDataset makes, reused by CacheLatents while no file changes.

LoadDataset scans the dataset (every image's header probed, every caption read) and CacheLatents
needs the same scan to plan its cache; without sharing, every run scans twice. scan() is
LoadDataset's: it always scans, and keeps the last KEEP results. validate_once() is CacheLatents':
it takes a kept result whose key still matches, else scans. The key is the dataset settings, the
files' names, sizes and modification times (the stat-only signature ComfyUI's IS_CHANGED uses)
and every folder entry's name and status-change time (ctime: also a chmod or a rename). A file
edited, added, removed, renamed or made (un)readable changes the key, so the scan runs again:
the same "unchanged stat means unchanged file" rule the cache fingerprint relies on.
"""
from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict

from ..cache.format import CACHE_FOLDER
from .scan import DatasetSpec, ScanResult, files_signature, validate

KEEP = 2  # a training set and an eval set; each result holds about 1 KB per file
_memo: OrderedDict[str, ScanResult] = OrderedDict()
_lock = threading.Lock()


def _key(spec: DatasetSpec) -> str | None:
    try:
        entries = []
        for folder in spec.folders:
            with os.scandir(folder.path) as it:  # the cache folder (CacheLatents writes it here) is no dataset file
                entries.append(sorted((e.name, e.stat(follow_symlinks=False).st_ctime_ns) for e in it
                                      if e.name != CACHE_FOLDER))
        return json.dumps([spec.to_dict(), files_signature(spec), entries], sort_keys=True, default=str)
    except (OSError, ValueError):
        return None  # unreadable folder: validate() reports it


def _keep(key: str | None, result: ScanResult) -> None:
    if key is None:
        return
    with _lock:
        _memo[key] = result
        _memo.move_to_end(key)
        while len(_memo) > KEEP:
            _memo.popitem(last=False)


def scan(spec: DatasetSpec, key: str | None = None) -> ScanResult:
    """engine.data.scan.validate(spec), kept for validate_once. Raises what it raises (errors are not kept)."""
    key = key or _key(spec)  # before scanning: a file changed meanwhile gives another key later
    result = validate(spec)
    _keep(key, result)
    return result


def validate_once(spec: DatasetSpec) -> ScanResult:
    """The scan scan() kept for this dataset when no file changed since, else a new scan."""
    key = _key(spec)
    with _lock:
        if key is not None and key in _memo:
            _memo.move_to_end(key)
            return _memo[key]
    return scan(spec, key)
