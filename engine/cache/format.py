"""The on-disk latent cache: written by the CacheLatents node, read by the training engine.

One folder per fingerprint, so caches for other encoders/settings coexist:

    <first dataset folder>/.pipetrain_cache/<fingerprint>/
        shards/<first item>-<hash>.safetensors
                    up to ~256 items each (engine/cache/shards.py), every tensor named "<item>/<name>"
                    (<item>: the item's 7-digit index in cache order), metadata "items": per item
                    the strings below. A shard appears by temp file + os.replace only.
        meta-<hash>/
                    the metadata table (HF `datasets` save_to_disk: one memory-mapped Arrow file),
                    one row per cached item in cache order: index, shard, source, caption, repeats,
                    width, height (the size trained at), bucket (shapes_bucket: which items may share
                    a batch), key (item_key), cond_none, cond_json, cond_unbatched.
        manifest.json
                    written LAST, atomically: its presence means "complete". A small header:
                    version, fingerprint, count, latent_shape, cond_keys, encoders, dataset, the
                    metadata folder's name and the shard files it references.

Per item, the tensor names are:
    "latent"      [C,h,w] ([C,t,h,w] for a video) raw VAE output (NOT process_latent_in'd: that
                  depends on the diffusion model, which training picks);
    "cond.cross_attn" [T,D], and "cond.<key>" for every tensor extra of the CLIP conditioning dict,
                  batch dim removed; "cond.reference_latents.N": the raw VAE latents of the item's
                  control images (what ComfyUI's ReferenceLatent node adds; engine/train/conditioning.py
                  turns the flat keys back into the list extra_conds takes);
    "caption.<k>.cross_attn", "caption.<k>.<key>" (k >= 1): the caption's other encodings (LoadDataset's
                  tag_shuffles and caption_lines; engine/cache/caption_store.py), read only when picked;
    "loss_mask"   [1,(1,)h,w]: the item's loss weights at latent size (mask_folder,
                  engine/data/pairs.py); absent = unmasked. Not conditioning: the objective
                  multiplies the loss by it.
and its metadata strings: source, caption, repeats, cond_none (extras whose value was None:
models' extra_conds read e.g. kwargs["pooled_output"] unconditionally, so the key must survive),
cond_json (other JSON-able extras), cond_unbatched (tensor extras stored as-is because they had no
leading batch dim of 1), and with caption variants caption_variants / caption_lines (VARIANTS_META).
With caption_dropout, <fingerprint>/empty_caption.safetensors holds the empty caption's encoding.

Format 1 (one file per item, every item listed in manifest.json: engine/cache/legacy.py) is still
read. A crash or Cancel leaves only whole shards behind (the items encoded since the last shard are
written as one more shard when Python can still do it), and the next run re-encodes only the items
in no complete shard. Torch + safetensors (+ `datasets` for the table); no comfy import.
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

from ..data.caption_variants import caption_options
from ..data.frame_picks import BEGINNING
from ..data.frame_rates import sampling_fps
from ..data.images import PREPROCESS_VERSION
from ..data.pairs import MASK_VERSION
from ..data.scan import DatasetItem, DatasetSpec, relative_source

CACHE_FORMAT_VERSION = 2  # 1: one file per item (engine/cache/legacy.py); 2: shards + Arrow metadata
CACHE_FOLDER = ".pipetrain_cache"  # hidden, so the dataset scan never lists it
MANIFEST = "manifest.json"
LOSS_MASK = "loss_mask"  # an item's loss weights at latent size (a tensor next to "latent")
# a caption's other encodings (shuffled tag orders, other lines): tensors "caption.<k>.cross_attn" and
# "caption.<k>.<extra>", k from 1 (0 is "cond."), their metadata strings in the item's "caption_variants"
# (JSON list: caption, cond_none, cond_json, cond_unbatched), and "caption_lines" (encodings per file line)
VARIANT_PREFIX, VARIANTS_META, LINES_META = "caption", "caption_variants", "caption_lines"
_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{16}$")


class CacheError(ValueError):
    """A cache problem the user can fix; the message names the folder and the fix."""


@dataclass(frozen=True)
class CacheSpec:
    """The PIPETRAIN_CACHE node output: where a complete cache is and what it holds. With chained datasets
    (LoadDataset's add_to) `more` holds the other datasets' caches, flat, in the chain's order."""
    cache_dir: str
    fingerprint: str
    count: int
    latent_shape: tuple[int, ...]
    more: tuple["CacheSpec", ...] = ()

    @property
    def parts(self) -> tuple["CacheSpec", ...]:
        return (dataclasses.replace(self, more=()),) + tuple(self.more)

    def to_dict(self) -> dict[str, Any]:
        d = {"cache_dir": self.cache_dir, "fingerprint": self.fingerprint, "count": self.count,
             "latent_shape": list(self.latent_shape)}
        return {**d, "more": [p.to_dict() for p in self.more]} if self.more else d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CacheSpec":
        names = {"cache_dir", "fingerprint", "count", "latent_shape"}
        if not isinstance(data, dict) or set(data) - {"more"} != names:
            raise CacheError(f"cache spec must have exactly the keys {sorted(names)} (and 'more'); got {data!r}. "
                             "Run CacheLatents again.")
        more = data.get("more", [])
        if not isinstance(more, list) or any(isinstance(p, dict) and "more" in p for p in more):
            raise CacheError(f"cache spec's 'more' must be a flat list of cache specs; got {more!r}. "
                             "Run CacheLatents again.")
        return cls(str(data["cache_dir"]), str(data["fingerprint"]), int(data["count"]),
                   tuple(int(x) for x in data["latent_shape"]), tuple(cls.from_dict(p) for p in more))


# ---- naming --------------------------------------------------------------------------------

def fingerprint(spec: DatasetSpec, scan_items: Iterable[DatasetItem], encoder_identity: Mapping[str, Any],
                digests: Mapping[str, str] | None = None) -> str:
    """sha256[:16] of everything that changes a cached tensor (and the format they are stored in).

    Repeats are deliberately left out: they change how often an item is seen, not its latent,
    so editing them must not re-encode. A video clip's sampling rate (target_fps) is in it: another
    rate picks other frames. The metadata table (rewritten on every CacheLatents run)
    is where the engine reads repeats from. digests: item path -> the content digest of its files
    (engine/cache/digests.py), so an edit that keeps size and mtime still makes a new fingerprint.
    """
    h = hashlib.sha256()
    h.update(json.dumps({"format": CACHE_FORMAT_VERSION, "preprocess": PREPROCESS_VERSION, "resolution": spec.resolution,
                         "encoders": encoder_identity}, sort_keys=True, default=str).encode())
    if spec.bucketed:  # only then, so caches written before buckets existed keep their fingerprint
        h.update(json.dumps({"aspect_ratios": list(spec.aspect_ratios), "extra_resolutions": list(spec.extra_resolutions),
                             "multiple": spec.bucket_multiple, "video_frames": spec.video_frames,
                             "frame_stride": spec.frame_stride, **_frame_rate(spec), **_clip_settings(spec)}).encode())
    if spec.mask_folder or spec.control_folder:  # only then: caches without them keep their fingerprint
        h.update(json.dumps({"mask_folder": bool(spec.mask_folder), "control_folder": bool(spec.control_folder),
                             "mask_version": MASK_VERSION}).encode())
    if caption_options(spec):  # prefix, lines, shuffles: what is encoded. Only when set, as above; caption_dropout
        # is left out: it changes which encoding a step takes, not what is stored
        h.update(json.dumps(caption_options(spec), sort_keys=True).encode("utf-8", "surrogateescape"))
    for item in scan_items:
        caption = "\0none" if item.caption is None else item.caption
        digest = (digests or {}).get(item.path)
        h.update(json.dumps([relative_source(spec, item.path), item.size_bytes, item.mtime_ns, caption]
                            + ([digest] if digest else [])).encode())
        pairs = [p.stamp() if p else None for p in (getattr(item, "mask", None), getattr(item, "control", None))]
        if any(pairs):  # a changed mask or control image re-caches its item
            h.update(json.dumps(pairs).encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:16]


def _frame_rate(spec: DatasetSpec) -> dict[str, float]:
    """The rate clips are sampled at, when it is not the source's (0, which caches written before
    target_fps existed used): only then part of the fingerprint and item keys, so theirs stay valid."""
    fps = sampling_fps(spec) if spec.clip_lengths else 0.0
    return {"target_fps": fps} if fps else {}


def _clip_settings(spec: DatasetSpec) -> dict[str, Any]:
    """frame_buckets and clip_mode (engine/data/frame_buckets.py) when set: they choose which frames are
    encoded. Left out at their defaults, so caches made with video_frames alone keep their fingerprint."""
    out: dict[str, Any] = {"frame_buckets": list(spec.frame_buckets)} if spec.frame_buckets else {}
    return {**out, **({"clip_mode": spec.clip_mode} if spec.clip_mode != BEGINNING else {})}


def cache_dir_for(spec: DatasetSpec, fp: str) -> Path:
    return Path(spec.folders[0].path) / CACHE_FOLDER / fp


def item_key(spec: DatasetSpec, item: DatasetItem, size, digest: str = "") -> str:
    """What one cached item was made from (its file's name, size, mtime and caption, every other scan
    field but repeats, the content digest of its files, the size it is cached at and, for a video, the
frame rate its clip is sampled at and, with frame_buckets or another clip_mode, its length and start). The same key in
    another cache with the same encoders and settings means the same tensors, so they can be copied
    instead of encoded. The preprocessing and mask versions are part of it: a change to how files
    become pixels re-encodes."""
    fields = {k: v for k, v in vars(item).items() if k not in ("path", "repeats")}  # nested dataclasses: their repr
    if not _clip_settings(spec):  # video_frames alone: the clip follows from the settings, and old keys stay valid
        fields = {k: v for k, v in fields.items() if k not in ("clip_frames", "clip_starts")}
    versions = {"preprocess": PREPROCESS_VERSION, "mask": MASK_VERSION, **(_frame_rate(spec) if item.frames else {}),
                **caption_options(spec)}
    made_of = [relative_source(spec, item.path), list(size), fields, versions] + ([digest] if digest else [])
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=repr).encode("utf-8", "surrogateescape")
                          ).hexdigest()[:32]


def remove_cache(cache_dir: str | os.PathLike) -> None:
    """Delete one fingerprint folder; refuses anything that is not <...>/.pipetrain_cache/<16 hex>."""
    p = Path(cache_dir)
    if p.parent.name != CACHE_FOLDER or not _FINGERPRINT_RE.match(p.name):
        raise CacheError(f"refusing to delete {p}: it is not a PipeTrain cache folder "
                         f"(<dataset>/{CACHE_FOLDER}/<fingerprint>).")
    if p.is_dir():
        shutil.rmtree(p)


# ---- one item's tensors and metadata -------------------------------------------------------

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


def pack_item(latent: torch.Tensor, cond_tensor: torch.Tensor, cond_extras: Mapping[str, Any], source: str,
              caption: str, repeats: int, loss_mask: torch.Tensor | None = None, variants: tuple = (),
              lines: tuple[int, ...] = ()) -> tuple[dict[str, torch.Tensor], dict[str, str], list[str]]:
    """(tensors, metadata strings, extras keys that could not be stored) of one item (module doc).
    variants: (cond tensor, caption extras, text) of the caption's other encodings (engine/cache/caption_store.py),
    lines: how many of all the encodings (the main one first) belong to each line of the caption file."""
    tensors = {"latent": _unbatch("VAE latent", latent), "cond.cross_attn": _unbatch("text conditioning", cond_tensor)}
    if loss_mask is not None:
        tensors[LOSS_MASK] = _unbatch("loss mask", loss_mask).float()
    metadata, skipped = pack_cond(tensors, "cond", cond_extras)
    for k, (v_cond, v_extras, text) in enumerate(variants, start=1):
        prefix = f"{VARIANT_PREFIX}.{k}"
        tensors[f"{prefix}.cross_attn"] = _unbatch("text conditioning", v_cond)
        v_meta, v_skipped = pack_cond(tensors, prefix, v_extras)
        metadata.setdefault(VARIANTS_META, []).append({"caption": text, **v_meta})
        skipped += [s for s in v_skipped if s not in skipped]
    if variants:
        metadata[VARIANTS_META] = json.dumps(metadata[VARIANTS_META])
        metadata[LINES_META] = json.dumps(list(lines or (len(variants) + 1,)))
    # safetensors needs contiguous CPU tensors that own their storage (slices share it)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    metadata = {"source": source, "caption": caption, "repeats": str(int(repeats)), **metadata}
    return tensors, metadata, skipped


def pack_cond(tensors: dict[str, torch.Tensor], prefix: str, cond_extras: Mapping[str, Any]
              ) -> tuple[dict[str, str], list[str]]:
    """Put one encoding's tensor extras into `tensors` as <prefix>.<key>; returns its metadata strings
    (cond_none, cond_json, cond_unbatched) and the keys that could not be stored."""
    none_keys, json_extras, unbatched, skipped = [], {}, [], []
    for key in sorted(cond_extras):
        value = cond_extras[key]
        if key == "cross_attn":
            raise CacheError("the conditioning extras contain 'cross_attn', which is reserved for the main tensor.")
        if isinstance(value, torch.Tensor):
            if value.ndim >= 1 and value.shape[0] == 1:
                tensors[f"{prefix}.{key}"] = value[0]
            else:
                tensors[f"{prefix}.{key}"] = value
                unbatched.append(key)
        elif value is None:
            none_keys.append(key)
        elif _json_able(value):
            json_extras[key] = value
        else:
            skipped.append(key)
    return {"cond_none": json.dumps(none_keys), "cond_json": json.dumps(json_extras),
            "cond_unbatched": json.dumps(unbatched)}, skipped


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


def restore_cond(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, str],
                 prefix: str = "cond") -> tuple[torch.Tensor, dict[str, Any]]:
    """An item's conditioning as ComfyUI returned it (batch dim restored): pack_item's inverse. prefix:
    "cond" (the main encoding) or "<VARIANT_PREFIX>.<k>" with that variant's metadata strings as `meta`.

    CacheLatents uses it to give a repeated caption the stored encoding instead of keeping
    every distinct caption's tensors in memory (T5/LLM conds are megabytes each).
    """
    unbatched = set(json.loads(meta.get("cond_unbatched", "[]")))
    extras = unpack_extras(tensors, prefix, meta.get("cond_none", "[]"), meta.get("cond_json", "{}"))
    extras = {k: (v.unsqueeze(0) if torch.is_tensor(v) and k not in unbatched else v) for k, v in extras.items()}
    return tensors[f"{prefix}.cross_attn"].unsqueeze(0), extras


def shapes_bucket(shapes: Mapping[str, Iterable[int]]) -> str:
    """Which items may share a batch: the shapes of the latent and of every conditioning tensor.

    Same latent size AND same caption token length (and mask/extra shapes): batches are stacked,
    never padded, because padded text masks break several models (MODEL-NOTES.md item 7). The loss
    mask is left out: its shape follows the latent's, and masked and unmasked items may share a batch. So
    are caption variants shaped like the main encoding (_same_as_main).
    """
    return " ".join(f"{k}={'x'.join(str(d) for d in shapes[k])}" for k in sorted(shapes)
                    if k != LOSS_MASK and not _same_as_main(k, shapes))


def _same_as_main(name: str, shapes: Mapping[str, Iterable[int]]) -> bool:
    """A caption variant's tensor of the shape of the main encoding's: any variant of such items may share a
    batch with any other, so it does not split buckets (one whose shape differs does)."""
    if not name.startswith(VARIANT_PREFIX + "."):
        return False
    main = "cond." + name.split(".", 2)[2]
    return main in shapes and list(shapes[main]) == list(shapes[name])


def cond_keys_of(tensor_names: Iterable[str], meta: Mapping[str, str]) -> list[str]:
    """An item's conditioning keys (cross_attn, tensor extras, None-valued and JSON extras)."""
    keys = [k[len("cond."):] for k in tensor_names if k.startswith("cond.")]
    return sorted(keys + json.loads(meta.get("cond_none", "[]")) + list(json.loads(meta.get("cond_json", "{}"))))


# ---- reading (the engine side) -------------------------------------------------------------

def read_manifest(cache_dir: str | os.PathLike) -> dict[str, Any]:
    """A complete cache's manifest; CacheError (naming the fix) when it is absent, damaged or of an unknown format."""
    path = Path(cache_dir) / MANIFEST
    if not path.is_file():
        raise CacheError(f"cache {cache_dir} is incomplete (no {MANIFEST}): run CacheLatents again; "
                         "it resumes where it stopped.")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CacheError(f"cannot read {path} ({e}): run CacheLatents with regenerate on.") from e
    version = manifest.get("version") if isinstance(manifest, dict) else None
    if version not in (1, CACHE_FORMAT_VERSION):
        raise CacheError(f"cache {cache_dir} has format version {version}, this PipeTrain reads 1 and "
                         f"{CACHE_FORMAT_VERSION}: run CacheLatents with regenerate on (or update PipeTrain).")
    return manifest
