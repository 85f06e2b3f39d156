"""The on-disk latent cache: written by the CacheLatents node, read by the training engine.

Layout (one folder per fingerprint, so caches for other encoders/settings coexist):

    <first dataset folder>/.pipetrain_cache/<fingerprint>/
        items/000000.safetensors   "latent" [C,h,w] ([C,t,h,w] for a video) raw VAE output (NOT process_latent_in'd:
                                   that depends on the diffusion model, which training picks),
                                   "cond.cross_attn" [T,D], "cond.<key>" for every tensor extra of
                                   the CLIP conditioning dict, batch dim removed.
                                   metadata: source, caption, repeats, cond_none (extras whose value
                                   was None: models' extra_conds read e.g. kwargs["pooled_output"]
                                   unconditionally, so the key must survive), cond_json (other
                                   JSON-able extras), cond_unbatched (tensor extras stored as-is
                                   because they had no leading batch dim of 1).
                                   "cond.reference_latents.N": the raw VAE latents of the item's control
                                   images (what ComfyUI's ReferenceLatent node adds; engine/conditioning.py
                                   turns the flat keys back into the list extra_conds takes).
                                   "loss_mask" [1,(1,)h,w]: the item's loss weights at latent size (mask_folder,
                                   engine/dataset_pairs.py); absent = unmasked. Not conditioning: the
                                   objective multiplies the loss by it.
        manifest.json              written LAST, atomically: its presence means "complete". Per item:
                                   file, source, repeats, size ([w, h] trained at) and bucket
                                   (bucket_key: which items may share a batch).

Every file appears atomically (temp file + os.replace), so a cancelled run leaves only whole
items behind and the next run resumes from them. Torch + safetensors only; no comfy import.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import write_text_atomic
from .dataset import PREPROCESS_VERSION, DatasetItem, DatasetSpec, relative_source
from .dataset_pairs import MASK_VERSION

CACHE_FORMAT_VERSION = 1
CACHE_FOLDER = ".pipetrain_cache"  # hidden, so the dataset scan never lists it
MANIFEST = "manifest.json"
LOSS_MASK = "loss_mask"  # an item's loss weights at latent size (a tensor next to "latent")
_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{16}$")


class CacheError(ValueError):
    """A cache problem the user can fix; the message names the folder and the fix."""


@dataclass(frozen=True)
class CacheSpec:
    """The PIPETRAIN_CACHE node output: where a complete cache is and what it holds."""
    cache_dir: str
    fingerprint: str
    count: int
    latent_shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["latent_shape"] = list(self.latent_shape)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CacheSpec":
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            raise CacheError(f"cache spec must have exactly the keys {sorted(names)}; got {data!r}. "
                             "Run CacheLatents again.")
        return cls(str(data["cache_dir"]), str(data["fingerprint"]), int(data["count"]),
                   tuple(int(x) for x in data["latent_shape"]))


# ---- naming --------------------------------------------------------------------------------

def fingerprint(spec: DatasetSpec, scan_items: Iterable[DatasetItem], encoder_identity: Mapping[str, Any]) -> str:
    """sha256[:16] of everything that changes a cached tensor.

    Repeats are deliberately left out: they change how often an item is seen, not its latent,
    so editing them must not re-encode. The manifest (rewritten on every CacheLatents run) is
    where the engine reads repeats from.
    """
    h = hashlib.sha256()
    h.update(json.dumps({"format": CACHE_FORMAT_VERSION, "preprocess": PREPROCESS_VERSION, "resolution": spec.resolution,
                         "encoders": encoder_identity}, sort_keys=True, default=str).encode())
    if spec.bucketed:  # only then, so caches written before buckets existed keep their fingerprint
        h.update(json.dumps({"aspect_ratios": list(spec.aspect_ratios), "extra_resolutions": list(spec.extra_resolutions),
                             "multiple": spec.bucket_multiple, "video_frames": spec.video_frames,
                             "frame_stride": spec.frame_stride}).encode())
    if spec.mask_folder or spec.control_folder:  # only then: caches without them keep their fingerprint
        h.update(json.dumps({"mask_folder": bool(spec.mask_folder), "control_folder": bool(spec.control_folder),
                             "mask_version": MASK_VERSION}).encode())
    for item in scan_items:
        caption = "\0none" if item.caption is None else item.caption
        h.update(json.dumps([relative_source(spec, item.path), item.size_bytes, item.mtime_ns, caption]).encode())
        pairs = [p.stamp() if p else None for p in (getattr(item, "mask", None), getattr(item, "control", None))]
        if any(pairs):  # a changed mask or control image re-caches its item
            h.update(json.dumps(pairs).encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:16]


def cache_dir_for(spec: DatasetSpec, fp: str) -> Path:
    return Path(spec.folders[0].path) / CACHE_FOLDER / fp


def item_path(cache_dir: str | os.PathLike, index: int) -> Path:
    return Path(cache_dir) / "items" / f"{index:06d}.safetensors"


def item_done(cache_dir: str | os.PathLike, index: int) -> bool:
    # Items appear by os.replace only, so an existing file is a complete file.
    return item_path(cache_dir, index).is_file()


def item_key(spec: DatasetSpec, item: DatasetItem, size) -> str:
    """What one cached item was made from (its file's name, size, mtime and caption, every other scan
    field but repeats, and the size it is cached at). The same key in another cache with the same
    encoders and settings means the same tensors, so that file can be linked instead of encoded."""
    fields = {k: v for k, v in vars(item).items() if k not in ("path", "repeats")}  # nested dataclasses: their repr
    return hashlib.sha256(json.dumps([relative_source(spec, item.path), list(size), fields], sort_keys=True,
                                     default=repr).encode("utf-8", "surrogateescape")).hexdigest()[:32]


def link_item(source: str | os.PathLike, cache_dir: str | os.PathLike, index: int) -> bool:
    """Put an existing item file at `index` (hard link, else a copy; atomic). False if `source` is gone."""
    final = item_path(cache_dir, index)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    try:
        try:
            os.link(source, tmp)
        except OSError:  # no hard links here (some network/FAT file systems): copy
            shutil.copyfile(source, tmp)
        os.replace(tmp, final)
        return True
    except FileNotFoundError:
        return False
    finally:
        if tmp.exists():
            tmp.unlink()


def remove_cache(cache_dir: str | os.PathLike) -> None:
    """Delete one fingerprint folder; refuses anything that is not <...>/.pipetrain_cache/<16 hex>."""
    p = Path(cache_dir)
    if p.parent.name != CACHE_FOLDER or not _FINGERPRINT_RE.match(p.name):
        raise CacheError(f"refusing to delete {p}: it is not a PipeTrain cache folder "
                         f"(<dataset>/{CACHE_FOLDER}/<fingerprint>).")
    if p.is_dir():
        shutil.rmtree(p)


# ---- writing -------------------------------------------------------------------------------

def _unbatch(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.ndim < 1 or t.shape[0] != 1:
        raise CacheError(f"{name} has shape {tuple(t.shape)}; expected a leading batch dimension of 1 "
                         "(one image / one caption per item).")
    return t[0]


def _json_able(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def write_item(cache_dir: str | os.PathLike, index: int, latent: torch.Tensor, cond_tensor: torch.Tensor,
               cond_extras: Mapping[str, Any], source: str, caption: str, repeats: int,
               loss_mask: torch.Tensor | None = None) -> list[str]:
    """Write one item atomically. Tensors are passed as ComfyUI returns them (batch of 1); loss_mask
    likewise ([1, 1, (1,) h, w], see the module doc).

    Returns the extras keys that could not be stored (neither tensor, None nor JSON); the
    caller decides how loudly to report them.
    """
    tensors = {"latent": _unbatch("VAE latent", latent), "cond.cross_attn": _unbatch("text conditioning", cond_tensor)}
    if loss_mask is not None:
        tensors[LOSS_MASK] = _unbatch("loss mask", loss_mask).float()
    none_keys, json_extras, unbatched, skipped = [], {}, [], []
    for key in sorted(cond_extras):
        value = cond_extras[key]
        if key == "cross_attn":
            raise CacheError("the conditioning extras contain 'cross_attn', which is reserved for the main tensor.")
        if isinstance(value, torch.Tensor):
            if value.ndim >= 1 and value.shape[0] == 1:
                tensors[f"cond.{key}"] = value[0]
            else:
                tensors[f"cond.{key}"] = value
                unbatched.append(key)
        elif value is None:
            none_keys.append(key)
        elif _json_able(value):
            json_extras[key] = value
        else:
            skipped.append(key)
    # safetensors needs contiguous CPU tensors that own their storage (slices share it)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    metadata = {"source": source, "caption": caption, "repeats": str(int(repeats)),
                "cond_none": json.dumps(none_keys), "cond_json": json.dumps(json_extras),
                "cond_unbatched": json.dumps(unbatched), "format": str(CACHE_FORMAT_VERSION)}
    final = item_path(cache_dir, index)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    return skipped


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors) of a safetensors file; damaged files raise safetensors' own errors."""
    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}


def unpack_extras(tensors: Mapping[str, torch.Tensor], prefix: str, none_keys: str, json_values: str) -> dict[str, Any]:
    """Conditioning extras as written: tensors `<prefix>.<key>` (not the main `<prefix>.cross_attn`), plus
    the keys whose value was None and the JSON-able values (two JSON strings from the file's metadata)."""
    extras: dict[str, Any] = {k[len(prefix) + 1:]: v for k, v in tensors.items()
                              if k.startswith(prefix + ".") and k != f"{prefix}.cross_attn"}
    extras.update({k: None for k in json.loads(none_keys)})
    extras.update(json.loads(json_values))
    return extras


def item_summary(cache_dir: str | os.PathLike, index: int) -> tuple[tuple[int, ...], list[str]]:
    """(latent shape, cond keys incl. None-valued ones) of one item, from the header only."""
    with safe_open(str(item_path(cache_dir, index)), framework="pt") as f:
        meta = f.metadata() or {}
        shape = tuple(f.get_slice("latent").get_shape())
        keys = [k[len("cond."):] for k in f.keys() if k.startswith("cond.")]
    keys += json.loads(meta.get("cond_none", "[]")) + list(json.loads(meta.get("cond_json", "{}")))
    return shape, sorted(keys)


def bucket_key(cache_dir: str | os.PathLike, index: int) -> str:
    """Which items may share a batch: the shapes of the latent and of every conditioning tensor.

    Same latent size AND same caption token length (and mask/extra shapes): batches are stacked,
    never padded, because padded text masks break several models (MODEL-NOTES.md item 7). The loss
    mask is left out: its shape follows the latent's, and masked and unmasked items may share a batch.
    """
    with safe_open(str(item_path(cache_dir, index)), framework="pt") as f:
        shapes = {k: "x".join(str(d) for d in f.get_slice(k).get_shape()) for k in f.keys() if k != LOSS_MASK}
    return " ".join(f"{k}={shapes[k]}" for k in sorted(shapes))


def load_cond(cache_dir: str | os.PathLike, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """An item's conditioning as ComfyUI returned it (batch dim restored): write_item's inverse.

    CacheLatents uses it to give a repeated caption the stored encoding instead of keeping
    every distinct caption's tensors in memory (T5/LLM conds are megabytes each).
    """
    meta, tensors = read_safetensors(item_path(cache_dir, index))
    unbatched = set(json.loads(meta.get("cond_unbatched", "[]")))
    extras = unpack_extras(tensors, "cond", meta.get("cond_none", "[]"), meta.get("cond_json", "{}"))
    extras = {k: (v.unsqueeze(0) if torch.is_tensor(v) and k not in unbatched else v) for k, v in extras.items()}
    return tensors["cond.cross_attn"].unsqueeze(0), extras


def write_manifest(cache_dir: str | os.PathLike, fp: str, spec: DatasetSpec, items: list[dict[str, Any]],
                   latent_shape: tuple[int, ...], cond_keys: list[str], encoders: Mapping[str, Any]) -> Path:
    """items: [{"file": "items/000000.safetensors", "source": ..., "repeats": N, "size": [w, h],
    "bucket": bucket_key(...)}, ...] in cache order."""
    manifest = {"version": CACHE_FORMAT_VERSION, "fingerprint": fp, "count": len(items), "items": list(items),
                "latent_shape": list(latent_shape), "cond_keys": sorted(cond_keys), "encoders": dict(encoders),
                "dataset": spec.to_dict()}
    path = Path(cache_dir) / MANIFEST
    write_text_atomic(path, json.dumps(manifest, indent=1, sort_keys=True, default=str))
    return path


# ---- reading (the engine side) -------------------------------------------------------------

class CachedDataset:
    """Random access to a complete cache. Items are read lazily, one safetensors file per access,
    so a data-loader worker holds only what it is using."""

    def __init__(self, cache_dir: str | os.PathLike):
        self.cache_dir = Path(cache_dir)
        path = self.cache_dir / MANIFEST
        if not path.is_file():
            raise CacheError(f"cache {self.cache_dir} is incomplete (no {MANIFEST}): run CacheLatents again; "
                             "it resumes where it stopped.")
        try:
            self.manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise CacheError(f"cannot read {path} ({e}): run CacheLatents with regenerate on.") from e
        version = self.manifest.get("version")
        if version != CACHE_FORMAT_VERSION:
            raise CacheError(f"cache {self.cache_dir} has format version {version}, this PipeTrain reads "
                             f"{CACHE_FORMAT_VERSION}: run CacheLatents with regenerate on.")
        self.items: list[dict[str, Any]] = self.manifest["items"]
        if self.manifest.get("count") != len(self.items):
            raise CacheError(f"{path} says count={self.manifest.get('count')} but lists {len(self.items)} items: "
                             "run CacheLatents with regenerate on.")
        missing = [it["file"] for it in self.items if not (self.cache_dir / it["file"]).is_file()]
        if missing:
            raise CacheError(f"cache {self.cache_dir} is missing {len(missing)} item file(s) (first: {missing[0]}): "
                             "run CacheLatents with regenerate on.")

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return tuple(self.manifest["latent_shape"])

    def __len__(self) -> int:
        return len(self.items)

    def repeats(self, i: int) -> int:
        return int(self.items[i]["repeats"])  # the manifest's value: see fingerprint() on why

    def buckets(self) -> list[str]:
        """Per item, the key of the batches it may join (bucket_key); caches written before buckets
        existed hold one latent size and get one key."""
        return [str(it.get("bucket", "")) for it in self.items]

    def __getitem__(self, i: int) -> dict[str, Any]:
        entry = self.items[i]
        path = self.cache_dir / entry["file"]
        try:
            meta, tensors = read_safetensors(path)
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise CacheError(f"cache file {path} (from {entry.get('source')}) cannot be read ({e}): "
                             "run CacheLatents with regenerate on.") from e
        extras = unpack_extras(tensors, "cond", meta.get("cond_none", "[]"), meta.get("cond_json", "{}"))
        out = {"latent": tensors["latent"], "cross_attn": tensors["cond.cross_attn"], "extras": extras,
               "caption": meta.get("caption", ""), "source": entry.get("source", meta.get("source", "")),
               "unbatched": tuple(json.loads(meta.get("cond_unbatched", "[]")))}
        if LOSS_MASK in tensors:
            out[LOSS_MASK] = tensors[LOSS_MASK]
        return out

    def spec(self) -> CacheSpec:
        return CacheSpec(str(self.cache_dir), self.fingerprint, len(self), self.latent_shape)

