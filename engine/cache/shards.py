"""Format 2 of the latent cache: items grouped into shard files, metadata in an Arrow table.

See engine/cache/format.py for the layout. Here: ShardWriter (one per rank: it buffers whole
items and writes them as one shard, atomically, every SHARD_ITEMS items or SHARD_MIB of tensors),
scan_shards (which items are in a complete shard: what a resumed run skips), write_metadata (the
table + manifest, once every rank finished) and ShardedItems (CachedDataset's reader).

Memory: the writer holds at most one shard's tensors; the reader memory-maps the table and opens
one shard per item read (safe_open reads that item's tensors only).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..atomic_files import write_safetensors, write_text
from ..data.scan import DatasetSpec
from .format import (
    CACHE_FORMAT_VERSION,
    LINES_META,
    LOSS_MASK,
    MANIFEST,
    VARIANT_PREFIX,
    CacheError,
    cond_keys_of,
    shapes_bucket,
    unpack_extras,
)

SHARDS = "shards"
META_PREFIX = "meta-"
# A shard closes at whichever comes first. Environment overrides: tests and benchmarks (small shards).
SHARD_ITEMS = int(os.environ.get("PIPETRAIN_CACHE_SHARD_ITEMS", "256"))
SHARD_MIB = float(os.environ.get("PIPETRAIN_CACHE_SHARD_MIB", "1024"))
OPEN_SHARDS = 8  # shard files a reader keeps open (their parsed headers): sequential reads open each once
COLUMNS = ("index", "shard", "source", "caption", "repeats", "width", "height", "bucket", "key", "cond_none",
           "cond_json", "cond_unbatched")


def _prefix(index: int) -> str:
    return f"{index:07d}/"


def shard_items(path: str | os.PathLike) -> dict[int, dict[str, str]]:
    """index -> metadata strings of the items in one shard file (its header only)."""
    with safe_open(str(path), framework="pt") as f:
        return {int(k): v for k, v in json.loads((f.metadata() or {})["items"]).items()}


def scan_shards(cache_dir: str | os.PathLike) -> dict[int, str]:
    """index -> shard file name, for every item in a complete shard. Temp files (dot names) are not
    shards; a file that is not a readable shard is ignored, so its items are encoded again."""
    folder = Path(cache_dir) / SHARDS
    out: dict[int, str] = {}
    for path in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        if path.name.startswith("."):
            continue
        try:
            indices = shard_items(path)
        except Exception:  # noqa: BLE001 - safetensors/JSON errors of a damaged file
            continue
        for index in indices:
            out.setdefault(index, path.name)
    return out


def write_shard(cache_dir: str | os.PathLike, items: dict[int, tuple[dict[str, torch.Tensor], dict[str, str]]]) -> str:
    """Write items {index: (tensors, metadata)} as one shard (temp file + os.replace); returns its name.
    The name follows from the item indices, so writing the same items again replaces the same file."""
    order = sorted(items)
    digest = hashlib.sha256(json.dumps(order).encode()).hexdigest()[:12]
    name = f"{order[0]:07d}-{digest}.safetensors"
    flat = {_prefix(i) + k: v for i in order for k, v in items[i][0].items()}
    metadata = {"format": str(CACHE_FORMAT_VERSION), "items": json.dumps({str(i): items[i][1] for i in order})}
    write_safetensors(Path(cache_dir) / SHARDS / name, flat, metadata)
    return name


def read_stored(path: str | os.PathLike, index: int | None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of one stored item: item `index` of a shard, or a format 1 item file (None)."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if index is None:
            return {k: f.get_tensor(k) for k in f.keys()}, meta
        p = _prefix(index)
        tensors = {k[len(p):]: f.get_tensor(k) for k in f.keys() if k.startswith(p)}
    return tensors, json.loads(meta["items"])[str(index)]


class OpenShards:
    """The last OPEN_SHARDS shard files kept open with their tensor names grouped by item index (and the
    items' metadata, parsed on first use): reading a shard's items one after another then parses its
    header once instead of once per item."""

    def __init__(self):
        self._open: OrderedDict[str, list[Any]] = OrderedDict()  # path -> [handle, names by index, metadata]

    def _entry(self, path: str | os.PathLike) -> list[Any]:
        key = str(path)
        if key in self._open:
            self._open.move_to_end(key)
        else:
            handle = safe_open(key, framework="pt")
            names: dict[int, list[str]] = {}
            for name in handle.keys():
                names.setdefault(int(name.split("/", 1)[0]), []).append(name)
            self._open[key] = [handle, names, None]
            if len(self._open) > OPEN_SHARDS:
                self._open.popitem(last=False)
        return self._open[key]

    def tensors(self, path: str | os.PathLike, index: int,
                keep: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
        """An item's tensors (keep: only the names it accepts; None: all). Unkept ones are not read."""
        handle, names, _ = self._entry(path)
        named = ((name, name.split("/", 1)[1]) for name in names.get(index, []))
        return {short: handle.get_tensor(name) for name, short in named if keep is None or keep(short)}

    def meta(self, path: str | os.PathLike, index: int) -> dict[str, str]:
        entry = self._entry(path)
        if entry[2] is None:
            entry[2] = json.loads((entry[0].metadata() or {})["items"])
        return entry[2][str(index)]  # KeyError: the shard does not hold that item


class ShardReader:
    """Reads stored items (read_stored's answer) from shards kept open (OpenShards): copying a previous
    cache reads a shard's items one after another."""

    def __init__(self):
        self._shards = OpenShards()

    def read(self, path: str | os.PathLike, index: int | None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        if index is None:  # a format 1 item file: one item, nothing to keep
            return read_stored(path, None)
        meta = self._shards.meta(path, index)
        return self._shards.tensors(path, index), meta


class ShardWriter:
    """One rank's writer: whole items go into a buffer, a full buffer becomes one shard.

    `written` starts as what the folder already holds in complete shards (every rank scans it), so
    done() tells which items a resumed run skips. Items are lost only when the process dies before
    their shard is written; the caller flushes on exceptions it sees (encode_shard does).
    """

    def __init__(self, cache_dir: str | os.PathLike, max_items: int | None = None, max_mib: float | None = None):
        self.cache_dir = Path(cache_dir)
        self.max_items = max(1, max_items or SHARD_ITEMS)
        self.max_bytes = (max_mib or SHARD_MIB) * 2**20
        self.written = scan_shards(self.cache_dir)
        self.pending: dict[int, tuple[dict[str, torch.Tensor], dict[str, str]]] = {}
        self._bytes = 0

    def done(self, index: int) -> bool:
        return index in self.written or index in self.pending

    def add(self, index: int, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
        self.pending[index] = (tensors, dict(metadata))
        self._bytes += sum(t.numel() * t.element_size() for t in tensors.values())
        if len(self.pending) >= self.max_items or self._bytes >= self.max_bytes:
            self.flush()

    def stored(self, index: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """An item this writer holds or the folder has (e.g. to reuse its caption's conditioning)."""
        if index in self.pending:
            return self.pending[index]
        return read_stored(self.cache_dir / SHARDS / self.written[index], index)

    def flush(self) -> None:
        if not self.pending:
            return
        name = write_shard(self.cache_dir, self.pending)
        self.written.update(dict.fromkeys(self.pending, name))
        self.pending, self._bytes = {}, 0


# ---- the metadata table and the manifest ----------------------------------------------------

def _rows(cache_dir: Path, done: dict[int, str], info: Callable[[int], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One table row per item, shard by shard (each shard's header is read once)."""
    by_shard: dict[str, list[int]] = {}
    for index, name in done.items():
        by_shard.setdefault(name, []).append(index)
    for name in sorted(by_shard):
        with safe_open(str(cache_dir / SHARDS / name), framework="pt") as f:
            metas = json.loads((f.metadata() or {})["items"])
            shapes: dict[int, dict[str, list[int]]] = {}
            for key in f.keys():
                index, tensor = key.split("/", 1)
                shapes.setdefault(int(index), {})[tensor] = f.get_slice(key).get_shape()
        for index in by_shard[name]:
            meta, extra = metas[str(index)], info(index)
            yield {"index": index, "shard": name, "source": extra.get("source", meta["source"]),
                   "caption": meta["caption"], "repeats": int(extra.get("repeats", meta["repeats"])),
                   "width": int(extra.get("width", 0)), "height": int(extra.get("height", 0)),
                   "bucket": shapes_bucket(shapes[index]), "key": str(extra.get("key", "")),
                   "cond_none": meta["cond_none"], "cond_json": meta["cond_json"],
                   "cond_unbatched": meta["cond_unbatched"]}


def _save_table(cache_dir: Path, name: str, rows: Callable[[], Iterator[dict[str, Any]]]) -> None:
    """The rows, sorted by index, as an HF `datasets` folder <cache_dir>/<name>, built aside and renamed in."""
    import datasets

    features = datasets.Features({c: datasets.Value("int64" if c in ("index", "repeats", "width", "height")
                                                    else "string") for c in COLUMNS})
    work = cache_dir / f".{name}.tmp{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    quiet = not datasets.are_progress_bars_disabled()
    if quiet:
        datasets.disable_progress_bars()
    try:  # from_generator writes Arrow in batches (bounded memory); its cache stays inside `work`
        table = datasets.Dataset.from_generator(rows, features=features, cache_dir=str(work / "gen"), fingerprint=name)
        with warnings.catch_warnings():  # pyarrow's deprecation notice from inside datasets' sort
            warnings.simplefilter("ignore", FutureWarning)
            table = table.sort("index")
        table.save_to_disk(str(work / "table"))
        os.replace(work / "table", cache_dir / name)
    finally:
        if quiet:
            datasets.enable_progress_bars()
        shutil.rmtree(work, ignore_errors=True)


def write_metadata(cache_dir: str | os.PathLike, fp: str, spec: DatasetSpec, encoders: dict,
                   info: Callable[[int], dict[str, Any]]) -> tuple[int, tuple[int, ...]]:
    """Write the metadata table of every item in a complete shard, then the manifest (last, atomically);
    returns (count, latent shape). info(index) -> the plan's source, repeats, width, height and key.

    The table folder is named by a hash of what it holds (shards, repeats, sizes, keys): a run that
    changes nothing finds it and writes the same manifest; tables no manifest names are deleted after.
    """
    cache_dir = Path(cache_dir)
    done = scan_shards(cache_dir)
    if not done:
        raise CacheError(f"cache {cache_dir} holds no complete shard: run CacheLatents again.")
    h = hashlib.sha256(str(CACHE_FORMAT_VERSION).encode())
    for index in sorted(done):
        h.update(json.dumps([index, done[index], info(index)], sort_keys=True, default=str).encode())
    name = META_PREFIX + h.hexdigest()[:16]
    if not (cache_dir / name).is_dir():
        _save_table(cache_dir, name, lambda: _rows(cache_dir, done, info))
    first = min(done)
    shapes, meta = read_stored_shapes(cache_dir / SHARDS / done[first], first)
    manifest = {"version": CACHE_FORMAT_VERSION, "fingerprint": fp, "count": len(done),
                "latent_shape": list(shapes["latent"]), "cond_keys": cond_keys_of(shapes, meta),
                "encoders": dict(encoders), "dataset": spec.to_dict(), "metadata": name,
                "shards": sorted(set(done.values()))}
    write_text(cache_dir / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True, default=str))
    for old in cache_dir.glob(META_PREFIX + "*"):
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return len(done), tuple(manifest["latent_shape"])


def complete_manifest(cache_dir: str | os.PathLike, fp: str, spec: DatasetSpec, encoders: dict) -> dict | None:
    """The manifest of a complete cache that write_metadata would write again unchanged (same fingerprint,
    encoders and dataset settings, its table and shards present), else None. With nothing encoded or
    copied, such a manifest already describes every item: a re-run need not rebuild the table's hash."""
    cache_dir = Path(cache_dir)
    try:
        manifest = json.loads((cache_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    want = json.loads(json.dumps({"fingerprint": fp, "encoders": dict(encoders), "dataset": spec.to_dict(),
                                  "version": CACHE_FORMAT_VERSION}, default=str))
    if any(manifest.get(k) != v for k, v in want.items()):
        return None
    table, shards = cache_dir / str(manifest.get("metadata", "")), manifest.get("shards") or []
    if not manifest.get("metadata") or not table.is_dir() or not shards:
        return None
    on_disk = {p.name for p in (cache_dir / SHARDS).glob("*.safetensors") if not p.name.startswith(".")}
    return manifest if on_disk == set(shards) else None


def read_stored_shapes(path: Path, index: int) -> tuple[dict[str, list[int]], dict[str, str]]:
    """({tensor name: shape}, metadata) of one shard item, from the header only."""
    with safe_open(str(path), framework="pt") as f:
        p = _prefix(index)
        shapes = {k[len(p):]: f.get_slice(k).get_shape() for k in f.keys() if k.startswith(p)}
        return shapes, json.loads((f.metadata() or {})["items"])[str(index)]


# ---- reading -------------------------------------------------------------------------------

class ShardedItems:
    """The items of a format 2 cache (CachedDataset's backend): the memory-mapped table + lazy shard reads."""

    def __init__(self, cache_dir: Path, manifest: dict[str, Any]):
        import datasets

        self.cache_dir = cache_dir
        missing = [s for s in manifest.get("shards", []) if not (cache_dir / SHARDS / s).is_file()]
        if missing:
            raise CacheError(f"cache {cache_dir} is missing {len(missing)} shard file(s) (first: {SHARDS}/{missing[0]}): "
                             "run CacheLatents again (it re-encodes only their items).")
        table_dir = cache_dir / str(manifest.get("metadata", ""))
        try:
            self.table = datasets.load_from_disk(str(table_dir))  # memory-mapped Arrow: rows are read on access
        except (OSError, ValueError) as e:
            raise CacheError(f"cannot read the cache's metadata table {table_dir} ({e}): run CacheLatents with "
                             "regenerate on.") from e
        self._shards = OpenShards()
        if len(self.table) != manifest.get("count"):
            raise CacheError(f"{cache_dir / MANIFEST} says count={manifest.get('count')} but the table holds "
                             f"{len(self.table)} rows: run CacheLatents with regenerate on.")

    def __len__(self) -> int:
        return len(self.table)

    @property
    def items(self) -> list[dict[str, Any]]:
        """Format 1's per-item list (file, source, repeats, size, bucket, key), built from the table on
        request for tools and tests; training never asks for it (a dict per item)."""
        cols = self.table.data.select(["shard", "source", "repeats", "width", "height", "bucket", "key"]).to_pydict()
        return [{"file": f"{SHARDS}/{s}", "source": src, "repeats": r, "size": [w, h], "bucket": b, "key": k}
                for s, src, r, w, h, b, k in zip(*cols.values())]

    def repeats(self):
        return self.table.data.column("repeats").to_numpy()  # one int64 array, not a Python object per item

    def buckets(self) -> list[str]:
        """One str per item, the distinct keys shared (the column is dictionary-encoded)."""
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(self.table.data.column("bucket")).combine_chunks()
        keys = encoded.dictionary.to_pylist()
        return [keys[i] for i in encoded.indices.to_numpy(zero_copy_only=False)]

    def item(self, i: int) -> dict[str, Any]:
        row = self.table[i]
        path = self.cache_dir / SHARDS / row["shard"]
        try:
            tensors = self._tensors(path, row["index"])
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise CacheError(f"cache file {path} (item {row['index']}, from {row['source']}) cannot be read ({e}): "
                             "run CacheLatents with regenerate on.") from e
        if "latent" not in tensors:
            raise CacheError(f"cache file {path} holds no item {row['index']} (from {row['source']}): run "
                             "CacheLatents with regenerate on.")
        out = {"latent": tensors["latent"], "cross_attn": tensors["cond.cross_attn"],
               "extras": unpack_extras(tensors, "cond", row["cond_none"], row["cond_json"]),
               "caption": row["caption"], "source": row["source"],
               "unbatched": tuple(json.loads(row["cond_unbatched"]))}
        if LOSS_MASK in tensors:
            out[LOSS_MASK] = tensors[LOSS_MASK]
        return out

    def _tensors(self, path: Path, index: int) -> dict[str, torch.Tensor]:
        # the caption's other encodings are read only when picked (caption_variant)
        return self._shards.tensors(path, index, lambda name: not name.startswith(VARIANT_PREFIX + "."))

    def caption_lines(self, i: int) -> list[int]:
        """How many caption encodings item i holds per line of its caption file ([1]: only its own)."""
        row = self.table[i]
        meta = self._shards.meta(self.cache_dir / SHARDS / row["shard"], row["index"])
        return json.loads(meta.get(LINES_META, "[1]"))

    def caption_variant(self, i: int, k: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """(tensors, metadata) of item i holding only its caption encoding k >= 1 (caption_store.read_variant)."""
        row = self.table[i]
        path = self.cache_dir / SHARDS / row["shard"]
        part = f"{VARIANT_PREFIX}.{k}."
        return (self._shards.tensors(path, row["index"], lambda name: name.startswith(part)),
                self._shards.meta(path, row["index"]))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_shards": OpenShards()}  # open files do not travel to other processes

    def previous(self) -> dict[str, tuple[str, int | None]]:
        """item_key -> (shard path, index): where a new cache copies an unchanged item's tensors from."""
        cols = self.table.data.select(["key", "shard", "index"]).to_pydict()
        folder = self.cache_dir / SHARDS
        return {k: (str(folder / s), i) for k, s, i in zip(cols["key"], cols["shard"], cols["index"]) if k}
