"""A cached item's other caption encodings and the cache's empty caption (LoadDataset's caption options,
engine/data/caption_variants.py).

- Variants: an item's main encoding is "cond.*" as always; its caption's other encodings (shuffled tag
  orders, other lines of the caption file) are "caption.<k>.*" next to it in the same shard
  (engine/cache/format.py: pack_item), read one at a time when training picks one.
- The empty caption: with caption_dropout set, CacheLatents encodes "" once per cache, into
  <cache>/empty_caption.safetensors (temp file + rename). Its tensors are named as an item's "cond.*",
  its metadata strings are cond_none / cond_json / cond_unbatched.

Items travel as CachedDataset's dicts (cross_attn, extras, unbatched, ...); swap_caption gives an item
another encoding and keeps the extras that belong to its pixels (first frame, control image, CLIP vision).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import torch

from ..atomic_files import write_safetensors
from .format import VARIANT_PREFIX, VARIANTS_META, CacheError, pack_cond, read_safetensors, restore_cond, unpack_extras
from .items import caption_cond, per_item

EMPTY_CAPTION = "empty_caption.safetensors"


def variant_meta(meta: Mapping[str, str], k: int) -> Mapping[str, str]:
    """The metadata strings of encoding k of an item (0: the item's own)."""
    return meta if k == 0 else json.loads(meta[VARIANTS_META])[k - 1]


def stored_encoding(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, str], k: int):
    """(cond tensor, extras) of an item's stored encoding k, batch dim restored, as caption_cond gives them."""
    prefix = "cond" if k == 0 else f"{VARIANT_PREFIX}.{k}"
    cond, extras = restore_cond(tensors, variant_meta(meta, k), prefix)
    return cond, {key: v for key, v in extras.items() if not per_item(key)}


def read_variant(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, str], k: int
                 ) -> tuple[torch.Tensor, dict[str, Any], tuple[str, ...], str]:
    """(cross_attn, extras, unbatched keys, caption) of encoding k >= 1, as an item dict holds them."""
    prefix, vmeta = f"{VARIANT_PREFIX}.{k}", variant_meta(meta, k)
    extras = unpack_extras(tensors, prefix, vmeta["cond_none"], vmeta["cond_json"])
    return tensors[f"{prefix}.cross_attn"], extras, tuple(json.loads(vmeta["cond_unbatched"])), vmeta["caption"]


def swap_caption(item: dict[str, Any], cross_attn: torch.Tensor, extras: Mapping[str, Any],
                 unbatched: tuple[str, ...], caption: str) -> dict[str, Any]:
    """The item with another caption encoding; the extras of its pixels stay."""
    own = {k: v for k, v in item["extras"].items() if per_item(k)}
    kept = tuple(k for k in item.get("unbatched", ()) if per_item(k))
    return {**item, "cross_attn": cross_attn, "extras": {**extras, **own}, "unbatched": kept + tuple(unbatched),
            "caption": caption}


def has_empty_caption(cache_dir: str | os.PathLike) -> bool:
    return (Path(cache_dir) / EMPTY_CAPTION).is_file()


def uncond_missing(cfg_augment: float, cache_dirs: list[str]) -> str | None:
    """Why these caches cannot train with objective.cfg_augment (one without the empty caption), or None."""
    if cfg_augment <= 1.0:
        return None
    lacking = [d for d in cache_dirs if not has_empty_caption(d)]
    if not lacking:
        return None
    return (f"objective.cfg_augment {cfg_augment:g} trains every sample against its prediction for the empty "
            f"caption, but the cache {lacking[0]} holds no encoding of the empty caption. Cache Latents stores it "
            "when LoadDataset's caption_dropout is above 0: set caption_dropout (0.05 trains 1 sample in 20 without "
            "its caption, as many CFG models were trained) and run Cache Latents again (it encodes only the empty "
            "caption), or set cfg_augment to 1.")


def write_empty_caption(cache_dir: str | os.PathLike, clip) -> None:
    """Encode the empty caption with the cache's text encoder and store it (atomically)."""
    with torch.inference_mode():
        cond, extras = caption_cond(clip, "")
    tensors = {"cond.cross_attn": cond[0]}
    meta, _ = pack_cond(tensors, "cond", extras)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    write_safetensors(Path(cache_dir) / EMPTY_CAPTION, tensors, meta)


def read_empty_caption(cache_dir: str | os.PathLike) -> tuple[torch.Tensor, dict[str, Any], tuple[str, ...]]:
    """(cross_attn, extras, unbatched keys) of the cache's empty caption; CacheError with the fix when absent."""
    path = Path(cache_dir) / EMPTY_CAPTION
    if not path.is_file():
        raise CacheError(f"cache {cache_dir} has no encoding of the empty caption, which caption_dropout trains "
                         "with: run CacheLatents again with this dataset (it encodes only that, once), or set "
                         "LoadDataset's caption_dropout to 0.")
    try:
        meta, tensors = read_safetensors(path)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise CacheError(f"cannot read {path} ({e}): delete it and run CacheLatents again.") from e
    extras = unpack_extras(tensors, "cond", meta.get("cond_none", "[]"), meta.get("cond_json", "{}"))
    return tensors["cond.cross_attn"], extras, tuple(json.loads(meta.get("cond_unbatched", "[]")))
