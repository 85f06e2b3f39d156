"""Writing the latent cache: plan it, encode one rank's share of the items, write the metadata.

The CacheLatents node runs this as rank 0 of 1; the engine's cache mode (engine/cache/cli.py)
runs it on N ranks. Item i belongs to rank i % N; each rank writes its items into its own shards
(engine/cache/shards.py), and the metadata table + manifest are written once (by rank 0, after
every rank finished) from the shards on disk, so N ranks make a cache with the same fingerprint
folder and the same items, rows and tensors as the node (only the grouping into shard files differs).

Memory: one item's pixels and the current shard's tensors (at most SHARD_ITEMS items / SHARD_MIB);
what the loop keeps besides is the dataset scan's metadata and, per distinct caption, the index of
the item that holds its encoding (a repeated caption's conditioning is read back, not kept).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..data.caption_variants import spec_caption_texts
from ..data.images import ImageReadError, describe_error
from ..data.scan import DatasetItem, DatasetSpec, cache_entries, relative_source
from ..data.scan_memo import validate_once
from ..data.video import VideoReadError
from .audio_latents import av_latent, note_line
from .caption_store import has_empty_caption, stored_encoding, write_empty_caption
from .digests import content_digests
from .format import (
    CACHE_FOLDER,
    LINES_META,
    MANIFEST,
    VARIANTS_META,
    CacheError,
    CacheSpec,
    cache_dir_for,
    fingerprint,
    item_key,
    pack_item,
)
from .items import (
    ItemOptions,
    caption_cond,
    load_pixels,
    loss_mask_tensor,
    per_item,
    safe_text,
)
from .legacy import save_item_file
from .reader import CachedDataset
from .shards import (
    ShardReader,
    ShardWriter,
    complete_manifest,
    scan_shards,
    write_metadata,
)

FAILURES_SHOWN = 5


def find_trusted_cache(dataset: DatasetSpec, identity: dict, to_copy: bool = False) -> CacheSpec | None:
    """The newest complete cache for these encoders and dataset settings, found without touching the
    dataset's files (only the cache folder's manifests are read). to_copy: a cache to copy items from,
    whose caption_dropout and batch_sizes may differ (they change no stored tensor; a trusted cache trains with
    its own)."""
    root = os.path.join(dataset.folders[0].path, CACHE_FOLDER)
    want_dataset = _settings(dataset.to_dict(), to_copy)
    want_encoders = json.loads(json.dumps(identity, default=str))
    best = None
    for name in (os.listdir(root) if os.path.isdir(root) else []):
        try:
            ds = CachedDataset(os.path.join(root, name))
        except (CacheError, OSError, KeyError):
            continue  # incomplete or damaged: not trusted
        same = _settings(ds.manifest.get("dataset"), to_copy) == want_dataset
        if same and ds.manifest.get("encoders") == want_encoders:
            mtime = os.path.getmtime(os.path.join(root, name, "manifest.json"))
            if best is None or mtime > best[0]:
                best = (mtime, ds.spec())
    return None if best is None else best[1]


def _settings(dataset: dict | None, to_copy: bool) -> dict | None:
    """A manifest's dataset settings as find_trusted_cache compares them (JSON round trip: tuples are lists)."""
    out = json.loads(json.dumps(dataset))
    if to_copy and isinstance(out, dict):  # settings that change no stored tensor
        out.pop("caption_dropout", None)
        out.pop("batch_sizes", None)
    return out


def previous_items(dataset: DatasetSpec, identity: dict, cache_dir) -> dict[str, tuple[str, int | None]]:
    """item_key -> (file, index) of the items of the newest other complete cache with these encoders
    and settings (CachedDataset.previous: a format 1 cache's items too).

    Any edited, added or removed file changes the fingerprint, so the cache gets a new folder; the
    items whose files did not change are copied from the previous cache instead of encoded again
    (their tensors are read and written once: disk I/O, no encoder call).
    """
    old = None if (Path(cache_dir) / MANIFEST).is_file() else find_trusted_cache(dataset, identity, to_copy=True)
    if old is None:  # this cache is complete already (only repeats changed), or there is no other
        return {}
    return CachedDataset(old.cache_dir).previous()


def writable_cache_root(dataset: DatasetSpec) -> None:
    root = os.path.join(dataset.folders[0].path, CACHE_FOLDER)
    if os.path.lexists(root) and not os.path.isdir(root):
        raise CacheError(f"{root} exists but is not a folder: PipeTrain keeps its latent cache there. Delete or "
                         "rename that file, then run again.")


def write_error(dataset: DatasetSpec, e: OSError) -> CacheError:
    root = os.path.join(dataset.folders[0].path, CACHE_FOLDER)
    return CacheError(f"cannot write the latent cache under {root} ({e.strerror or e}): the cache lives in the first "
                      "dataset folder, so make that folder writable (and check the disk is not full), or list a "
                      "writable folder first in LoadDataset's 'folders'.")


def write_item(target, index: int, latent: torch.Tensor, cond_tensor: torch.Tensor,
               cond_extras: Mapping[str, Any], source: str, caption: str, repeats: int,
               loss_mask: torch.Tensor | None = None, variants: tuple = (), lines: tuple[int, ...] = ()) -> list[str]:
    """Store one item. Tensors are passed as ComfyUI returns them (batch of 1); loss_mask likewise
    ([1, 1, (1,) h, w]). target: a ShardWriter (what CacheLatents writes through: the
    item joins its next shard), or a folder (a format 1 item file, written atomically). variants, lines:
    the caption's other encodings (pack_item), given only with LoadDataset's caption options.

    Returns the extras keys that could not be stored (neither tensor, None nor JSON); the
    caller decides how loudly to report them.
    """
    tensors, metadata, skipped = pack_item(latent, cond_tensor, cond_extras, source, caption, repeats, loss_mask,
                                           variants, lines)
    if isinstance(target, (str, os.PathLike)):
        save_item_file(target, index, tensors, metadata)
    else:
        target.add(index, tensors, metadata)
    return skipped


@dataclass(frozen=True)
class CachePlan:
    """What every rank agrees on before encoding: the checked dataset, where its cache goes, its items."""
    dataset: DatasetSpec
    identity: dict
    fingerprint: str
    cache_dir: Path
    entries: list  # (DatasetItem, (width, height)) in cache order: cache_entries
    digests: dict = field(default_factory=dict)  # item path -> content digest of its files (engine/cache/digests.py)
    report: tuple = ()  # the dataset scan's report rows (engine/data/messages.py: grouped_report)

    def key(self, index: int) -> str:
        """item_key of entry `index`: what it is made from, content digest included."""
        item, size = self.entries[index]
        return item_key(self.dataset, item, size, self.digests.get(item.path, ""))


def plan_cache(dataset: DatasetSpec, identity: dict, warn: Callable[[str], None]) -> CachePlan:
    """Scan the dataset (its warnings go to `warn`), fingerprint it and check the cache folder. The scan
    LoadDataset just made is reused when no file changed since (engine/data/scan_memo.py); the files'
    content digests are read only for files whose stat changed since the last run (engine/cache/digests.py)."""
    scan = validate_once(dataset)
    for warning in scan.warnings:
        warn(warning)
    writable_cache_root(dataset)
    digests = content_digests(dataset, scan.items)
    fp = fingerprint(dataset, scan.items, identity, digests)
    cache_dir = cache_dir_for(dataset, fp)
    # each image once per resolution, at its bucket size
    return CachePlan(dataset, identity, fp, cache_dir, cache_entries(dataset, scan.items), digests, scan.report)


@dataclass
class ShardResult:
    """What one rank did; failed holds the first FAILURES_SHOWN messages of failed_count."""
    reused: int = 0
    copied: int = 0  # unchanged items copied from the previous cache's shards (no encoder call)
    encoded: int = 0
    captions: int = 0  # distinct captions this rank saw
    failed_count: int = 0
    failed: list[str] = field(default_factory=list)
    skipped_keys: list[str] = field(default_factory=list)
    # what encoding each item's sound needed (engine/cache/audio_latents.py): kind -> [count, first names]
    audio_notes: dict[str, list] = field(default_factory=dict)

    def fail(self, message: str) -> None:
        self.failed_count += 1
        if len(self.failed) < FAILURES_SHOWN:
            self.failed.append(message)

    @classmethod
    def merge(cls, parts: list[ShardResult]) -> ShardResult:
        out = cls()
        for p in parts:
            out.reused, out.copied, out.encoded = out.reused + p.reused, out.copied + p.copied, out.encoded + p.encoded
            out.captions += p.captions
            out.failed_count += p.failed_count
            out.failed = (out.failed + p.failed)[:FAILURES_SHOWN]
            out.skipped_keys = sorted(set(out.skipped_keys) | set(p.skipped_keys))
            for kind, (count, names) in p.audio_notes.items():
                out.note_audio(kind, names, count)
        return out

    def note_audio(self, kind: str, names: list[str], count: int = 1) -> None:
        seen = self.audio_notes.setdefault(kind, [0, []])
        seen[0], seen[1] = seen[0] + count, (seen[1] + names)[:FAILURES_SHOWN]

    def failures_text(self) -> str:
        more = self.failed_count - len(self.failed)
        return "; ".join(self.failed) + (f" ... and {more} more" if more > 0 else "")


def encode_shard(plan: CachePlan, vae, clip, rank: int = 0, world: int = 1, regenerate: bool = False,
                 options: ItemOptions = ItemOptions(), write: Callable[..., list[str]] = write_item,
                 check_cancel: Callable[[], None] | None = None,
                 progress: Callable[[], None] | None = None) -> ShardResult:
    """Encode and write the items i with i % world == rank that are in no complete shard yet.

    Items in a complete shard are skipped (a cancelled run resumes), unchanged files are copied from
    the previous cache (ShardResult.copied), files that fail to decode are counted in the result.
    write(writer, index, ...) is write_item. check_cancel runs before each item (the
    node raises ComfyUI's interrupt there), progress after each. options: what each item stores besides
    its latent and caption (first-frame conditioning, CLIP vision, control images; cache_items.ItemOptions).
    On any exception the items done so far are written as one more shard before it propagates (a
    hard kill loses them: the next run encodes them again).
    """
    dataset, cache_dir = plan.dataset, plan.cache_dir
    previous = {} if regenerate else previous_items(dataset, plan.identity, cache_dir)
    writer = ShardWriter(cache_dir)
    try:
        out = _encode_loop(plan, vae, clip, rank, world, options, write, check_cancel, progress,
                           (previous, ShardReader()), writer)
        writer.flush()
        if rank == 0 and dataset.caption_dropout and not has_empty_caption(cache_dir):
            write_empty_caption(cache_dir, clip)  # what caption_dropout trains with, once per cache
    except OSError as e:
        raise write_error(dataset, e) from e
    except BaseException:
        try:
            writer.flush()  # whole items, so the next run resumes after them
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass
        raise
    return out


def _encode_loop(plan: CachePlan, vae, clip, rank: int, world: int, options: ItemOptions, write,
                 check_cancel, progress, previous: tuple[dict, ShardReader],
                 writer: ShardWriter) -> ShardResult:
    # identical captions are encoded once per rank; later ones copy the first item's stored
    # conditioning from disk rather than keeping every caption's tensors in memory (keys: digests)
    caption_item: dict[bytes, tuple[int, int]] = {}  # text digest -> (item, which of its encodings)
    out = ShardResult()
    skipped: set[str] = set()
    for index in range(rank, len(plan.entries), world):
        item, size = plan.entries[index]
        if check_cancel is not None:  # finished items are already on disk, so the next run resumes
            check_cancel()
        texts = spec_caption_texts(plan.dataset, item.caption)  # per caption line, its orders
        keys = [_digest(text) for line in texts for text in line]
        if writer.done(index):
            out.reused += 1
            _stored_at(caption_item, keys, index)  # its stored conds serve these captions
        elif _copy_previous(previous, plan, index, writer):
            out.copied += 1  # unchanged file: the previous cache's tensors, read and written again
            _stored_at(caption_item, keys, index)
        else:
            message = _encode_one(plan, vae, clip, index, item, size, [caption_item.get(k) for k in keys], texts,
                                  options, write, skipped, writer, out)
            if message is None:
                _stored_at(caption_item, keys, index)
                out.encoded += 1
            else:
                out.fail(message)
        if progress is not None:
            progress()
    out.captions = len(caption_item)
    out.skipped_keys = sorted(skipped)
    return out


def _stored_at(caption_item: dict[bytes, tuple[int, int]], keys: list[bytes], index: int) -> None:
    for k, key in enumerate(keys):
        caption_item.setdefault(key, (index, k))


def _digest(caption: str) -> bytes:
    """A caption's key in the reuse table: 16 bytes however long the caption is."""
    return hashlib.blake2b(caption.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def _copy_previous(previous: tuple[dict, ShardReader], plan: CachePlan, index: int, writer: ShardWriter) -> bool:
    """Copy an unchanged item's tensors from the previous cache into this one; False if it is gone or unreadable.
    previous: (previous_items' table, the reader that keeps the shards being copied from open)."""
    items, reader = previous
    source = items.get(plan.key(index)) if items else None
    if not source:
        return False
    try:
        tensors, meta = reader.read(*source)
    except Exception:  # noqa: BLE001 - deleted or damaged meanwhile: encode it instead
        return False
    writer.add(index, tensors, {k: meta[k] for k in ("source", "caption", "repeats", "cond_none", "cond_json",
                                                      "cond_unbatched", VARIANTS_META, LINES_META) if k in meta})
    return True


def _encode_one(plan: CachePlan, vae, clip, index: int, item: DatasetItem, size, seen: list, texts: list[list[str]],
                options: ItemOptions, write, skipped: set[str], writer: ShardWriter, result: ShardResult) -> str | None:
    """Encode and write one item; returns why it failed to decode, or None when it was written.
    texts: per caption line, the texts to encode (engine/data/caption_variants.py); seen: per text (all lines
    in order), (item, encoding) already written with that text (its conditioning is reused), or None.
    With options.audio_vae the latent written is the packed video + audio row (engine/cache/audio_latents.py);
    what its sound needed goes to result.note_audio."""
    dataset = plan.dataset
    source = safe_text(relative_source(dataset, item.path))
    try:
        pixels, control = load_pixels(dataset, item, size)
    except (ImageReadError, VideoReadError) as e:  # passed the scan but fails to decode fully (e.g. damaged pixel data)
        return str(e)
    except Exception as e:  # noqa: BLE001 - anything else Pillow/numpy raise for one file
        return describe_error(item.path, e)
    with torch.inference_mode():  # no autograd graph: encoders are frozen here
        latent = vae.encode(pixels)
        if item.frames and latent.ndim != 5:
            raise CacheError(f"the VAE encoded the video {item.path} as {latent.shape[0]} separate images "
                             f"(latent {tuple(latent.shape)}): it is an image VAE. Connect the VAE of a video "
                             "model (Wan, HunyuanVideo, LTXV...), or set LoadDataset's video_frames to 0.")
        flat = [text for line in texts for text in line]
        encodings = [stored_encoding(*writer.stored(at[0]), at[1]) if at is not None else caption_cond(clip, text)
                     for text, at in zip(flat, seen)]
        cond, extras = encodings[0]
        extras = {k: v for k, v in extras.items() if not per_item(k)}  # per item, not per caption
        extras.update(options.extras(vae, item, pixels, latent, control))
        if options.audio_vae is not None:
            try:
                # image-to-video (first_frame_style clean_first_frame): its noise mask is packed like the row
                latent, packed_extras, notes = av_latent(options.audio_vae, dataset, item, pixels, latent,
                                                         extras.get("denoise_mask"))
            except VideoReadError as e:
                return str(e)
            extras.update(packed_extras)
            for note in notes:
                result.note_audio(note.kind, [f"{source} ({note.detail})" if note.detail else source])
        more = {"variants": tuple((c, e, t) for (c, e), t in zip(encodings[1:], flat[1:])),
                "lines": tuple(len(line) for line in texts)} if len(flat) > 1 else {}
    try:
        # a mask failing to decode after passing the scan skips the item (engine/data/pairs.py policy)
        mask = loss_mask_tensor(item, size, latent) if item.mask else None
    except ImageReadError as e:
        return str(e)
    try:
        skipped.update(write(writer, index, latent, cond, extras, source, flat[0], item.repeats, loss_mask=mask,
                             **more))
    except OSError as e:
        raise write_error(dataset, e) from e
    return None


def finish_cache(plan: CachePlan, result: ShardResult, warn: Callable[[str], None]) -> CacheSpec:
    """Report what failed and write the metadata table and the manifest (last, atomically) from the
    shards on disk. Run once, after every rank finished. Raises CacheError when no item could be encoded.
    """
    dataset, cache_dir, entries = plan.dataset, plan.cache_dir, plan.entries
    failures = result.failures_text()
    if result.failed_count:
        warn(f"{result.failed_count} image(s) could not be used and are left out of the cache (the reason follows "
             f"each name; the rest trains; fix them and run again to add them): {failures}")
    for kind, (count, names) in sorted(result.audio_notes.items()):
        warn(note_line(kind, count, names))
    if result.skipped_keys:
        warn(f"conditioning value(s) {', '.join(result.skipped_keys)} are neither tensors nor JSON and were not "
             "cached; models that need them will not train correctly.")
    if not result.encoded and not result.copied:
        manifest = complete_manifest(cache_dir, plan.fingerprint, dataset, plan.identity)
        if manifest is not None:  # a re-run that changed nothing: the manifest already describes every item
            return CacheSpec(str(cache_dir), plan.fingerprint, int(manifest["count"]), tuple(manifest["latent_shape"]))
    if not scan_shards(cache_dir):
        raise CacheError(f"none of the dataset's {len(entries)} image(s) could be decoded, so there is nothing to "
                         f"train on: {failures or '?'}.")

    def info(index: int) -> dict[str, Any]:
        item, (width, height) = entries[index]
        return {"source": safe_text(relative_source(dataset, item.path)), "repeats": item.repeats, "width": width,
                "height": height, "key": plan.key(index)}
    try:
        count, latent_shape = write_metadata(cache_dir, plan.fingerprint, dataset, plan.identity, info)
    except OSError as e:
        raise write_error(dataset, e) from e
    return CacheSpec(str(cache_dir), plan.fingerprint, count, tuple(latent_shape))
