"""PipeTrainCacheLatents: encode the dataset once with the graph's VAE and CLIP, keep it on disk.

Training then never loads an encoder. The cache lives under the first dataset folder, keyed by
a fingerprint of the files, captions, resolution and encoder identity (engine/cache_format.py),
so re-running is free, a cancelled run resumes, and a different VAE/CLIP gets its own folder.
"""
from __future__ import annotations

import json
import logging
import os
import time

from ..engine.cache_format import (CACHE_FOLDER, MANIFEST, CachedDataset, CacheError, CacheSpec, bucket_key, cache_dir_for,
                                   fingerprint, item_done, item_key, item_path, item_summary, link_item, load_cond,
                                   remove_cache, write_item, write_manifest)
from ..engine.dataset import DatasetSpec, cache_entries, relative_source, validate
from ..engine.dataset_pairs import load_mask
from ..engine.image_io import ImageReadError, describe_error, load_image
from ..engine.video_io import VideoReadError, load_video
from . import compat
from .encoder_identity import encoder_identity
from .types import CACHE, DATASET

log = logging.getLogger("PipeTrain")

# Keys of the CLIP output dict that are not data: "hooks" carries ComfyUI's hook objects for
# scheduled conditioning at sampling time, which has no meaning for a cached training caption.
_NOT_DATA_KEYS = ("hooks",)
FAILURES_SHOWN = 5
_FIRST_FRAME_KEYS = ("concat_latent_image", "concat_mask")
_REFERENCE_KEY = "reference_latents"  # ComfyUI's ReferenceLatent conditioning key (edit models)


def _per_item(key: str) -> bool:
    """Extras that belong to one item's pixels, not to its caption (dropped when a caption's cond is reused)."""
    return key in _FIRST_FRAME_KEYS or key == _REFERENCE_KEY or key.startswith(_REFERENCE_KEY + ".")


def reference_extras(vae, control_pixels) -> dict:
    """What ComfyUI's ReferenceLatent node adds for a control image: its raw VAE latent (VAEEncode's
    output; the model's extra_conds applies process_latent_in itself), as the flat key
    reference_latents.0 that engine/conditioning.py turns back into the list extra_conds takes."""
    return {f"{_REFERENCE_KEY}.0": vae.encode(control_pixels)}


def loss_mask_tensor(item, size, latent):
    """The item's mask image as loss weights at the latent's size: [1, 1, (1,) h, w] (batch of 1)."""
    import torch

    weights = load_mask(item.mask.path, (item.width, item.height), size, tuple(latent.shape[-2:]))
    return torch.from_numpy(weights).reshape((1,) * (latent.ndim - 2) + weights.shape)


def find_trusted_cache(dataset: DatasetSpec, identity: dict) -> CacheSpec | None:
    """The newest complete cache for these encoders and dataset settings, found without touching the
    dataset's files (only the cache folder's manifests are read)."""
    root = os.path.join(dataset.folders[0].path, CACHE_FOLDER)
    want_dataset = json.loads(json.dumps(dataset.to_dict()))
    want_encoders = json.loads(json.dumps(identity, default=str))
    best = None
    for name in (os.listdir(root) if os.path.isdir(root) else []):
        try:
            ds = CachedDataset(os.path.join(root, name))
        except (CacheError, OSError, KeyError):
            continue  # incomplete or damaged: not trusted
        if ds.manifest.get("dataset") == want_dataset and ds.manifest.get("encoders") == want_encoders:
            mtime = os.path.getmtime(os.path.join(root, name, "manifest.json"))
            if best is None or mtime > best[0]:
                best = (mtime, ds.spec())
    return None if best is None else best[1]


def previous_items(dataset: DatasetSpec, identity: dict, cache_dir) -> dict[str, str]:
    """item_key -> item file of the newest other complete cache with these encoders and settings.

    Any edited, added or removed file changes the fingerprint, so the cache gets a new folder; the
    items whose files did not change are linked from the previous cache instead of encoded again.
    """
    old = None if (cache_dir / MANIFEST).is_file() else find_trusted_cache(dataset, identity)
    if old is None:  # this cache is complete already (only repeats changed), or there is no other
        return {}
    with open(os.path.join(old.cache_dir, MANIFEST), encoding="utf-8") as f:
        manifest = json.load(f)
    return {it["key"]: os.path.join(old.cache_dir, it["file"]) for it in manifest["items"] if "key" in it}


def first_frame_extras(vae, clip_pixels, latent) -> dict:
    """ComfyUI's WanImageToVideo conditioning for a clip whose first frame is given.

    The frames after the first are 0.5 grey, as in the node; the latent stays raw (extra_conds
    calls process_latent_in itself, MODEL-NOTES item 6). The mask is 0 on the first latent frame.
    """
    import torch

    image = torch.full_like(clip_pixels, 0.5)
    image[:1] = clip_pixels[:1]
    concat = vae.encode(image)
    mask = torch.ones((1, 1, latent.shape[2], concat.shape[-2], concat.shape[-1]), dtype=concat.dtype)
    mask[:, :, :1] = 0.0
    return {"concat_latent_image": concat, "concat_mask": mask}


def _text(value: str) -> str:
    """A string safetensors can store: file names that are not valid UTF-8 (Linux allows any bytes)
    arrive from os.listdir with surrogate escapes, which UTF-8 cannot encode."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _writable_cache_root(dataset: DatasetSpec) -> None:
    root = os.path.join(dataset.folders[0].path, CACHE_FOLDER)
    if os.path.lexists(root) and not os.path.isdir(root):
        raise CacheError(f"{root} exists but is not a folder: PipeTrain keeps its latent cache there. Delete or "
                         "rename that file, then run again.")


def _write_error(dataset: DatasetSpec, e: OSError) -> CacheError:
    root = os.path.join(dataset.folders[0].path, CACHE_FOLDER)
    return CacheError(f"cannot write the latent cache under {root} ({e.strerror or e}): the cache lives in the first "
                      "dataset folder, so make that folder writable (and check the disk is not full), or list a "
                      "writable folder first in LoadDataset's 'folders'.")


class PipeTrainCacheLatents:
    CATEGORY = "PipeTrain"
    RETURN_TYPES = (CACHE,)
    RETURN_NAMES = ("cache",)
    OUTPUT_TOOLTIPS = ("The finished latent + caption cache; connect it to TrainPipeline.",)
    FUNCTION = "cache"
    DESCRIPTION = ("Encode every image with the VAE and every caption with the text encoder, and store the results "
                   "next to the dataset (.pipetrain_cache). Re-runs reuse it; a cancelled run resumes.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "dataset": (DATASET, {"tooltip": "The dataset from PipeTrain LoadDataset."}),
            "vae": ("VAE", {"tooltip": "The VAE of the model you will train (from the same checkpoint or a VAE "
                                       "loader); images are encoded with it."}),
            "clip": ("CLIP", {"tooltip": "The text encoder of the model you will train; captions are encoded with it. "
                                         "CLIP Set Last Layer and CLIP LoRAs applied before this node are part of "
                                         "the cache key."}),
            "regenerate": ("BOOLEAN", {"default": False,
                                       "tooltip": "Delete this dataset's cache for these encoders and encode everything "
                                                  "again. Leave off: changed files are detected automatically."}),
        }, "optional": {
            "first_frame_conditioning": ("BOOLEAN", {
                "default": False,
                "tooltip": "Image-to-video training (Wan 2.1/2.2 I2V style): each video clip's first frame is also "
                           "encoded as ComfyUI's WanImageToVideo does (first frame + grey frames -> "
                           "concat_latent_image, with concat_mask 0 on that frame), so the model learns to continue "
                           "a given first frame. Only affects videos."}),
            "trust_cache": ("BOOLEAN", {
                "default": False,
                "tooltip": "For very large datasets: skip checking every file and reuse the newest complete cache made "
                           "with these encoders and dataset settings, even if files changed since. Turn off (or use "
                           "regenerate) after adding or editing files."}),
        }}

    def cache(self, dataset: DatasetSpec, vae, clip, regenerate: bool, first_frame_conditioning: bool = False,
              trust_cache: bool = False):
        import torch

        identity = encoder_identity(vae, clip)
        if first_frame_conditioning:  # part of the fingerprint: such a cache holds more tensors
            identity = {**identity, "first_frame_conditioning": True}
        if trust_cache and not regenerate:
            trusted = find_trusted_cache(dataset, identity)
            if trusted is not None:
                log.info("PipeTrain CacheLatents: trust_cache is on, reusing %s without checking the files",
                         trusted.cache_dir)
                return (trusted,)
            log.info("PipeTrain CacheLatents: trust_cache is on but no complete cache matches; checking every file")
        scan = validate(dataset)
        for warning in scan.warnings:
            log.warning("PipeTrain CacheLatents: %s", warning)
        fp = fingerprint(dataset, scan.items, identity)
        cache_dir = cache_dir_for(dataset, fp)
        _writable_cache_root(dataset)
        if regenerate and cache_dir.exists():
            log.info("PipeTrain CacheLatents: regenerate is on, deleting %s", cache_dir)
            remove_cache(cache_dir)

        entries = cache_entries(dataset, scan.items)  # each image once per resolution, at its bucket size
        total = len(entries)
        pbar = compat.progress_bar(total)
        previous = {} if regenerate else previous_items(dataset, identity, cache_dir)
        # identical captions are encoded once per run; later ones copy the first item's stored
        # conditioning from disk rather than keeping every caption's tensors in memory
        caption_item: dict[str, int] = {}
        reused = encoded = linked = 0
        failed: list[str] = []
        skipped_keys: set[str] = set()
        start = time.monotonic()
        for index, (item, size) in enumerate(entries):
            # Cancel in the UI lands here; finished items are already on disk, so the next run resumes.
            compat.raise_if_interrupted()
            if item_done(cache_dir, index):
                reused += 1
                caption_item.setdefault(item.caption or "", index)  # its stored cond serves this caption
                pbar.update(1)
                continue
            source = previous.get(item_key(dataset, item, size)) if previous else None
            if source and link_item(source, cache_dir, index):  # unchanged file: the previous cache's tensors
                linked += 1
                caption_item.setdefault(item.caption or "", index)
                pbar.update(1)
                continue
            caption = item.caption or ""
            try:
                if item.frames:  # a video: [frames, H, W, 3], which ComfyUI's video VAEs encode as one clip
                    pixels = torch.from_numpy(load_video(item.path, size, dataset.video_frames, dataset.frame_stride))
                else:
                    pixels = torch.from_numpy(load_image(item.path, size)).unsqueeze(0)
                # the control image is cropped and resized to the same bucket as its target image
                control = torch.from_numpy(load_image(item.control.path, size)).unsqueeze(0) if item.control else None
            except (ImageReadError, VideoReadError) as e:  # passed the scan but fails to decode fully (e.g. damaged pixel data)
                failed.append(str(e))
                pbar.update(1)
                continue
            except Exception as e:  # noqa: BLE001 - anything else Pillow/numpy raise for one file
                failed.append(describe_error(item.path, e))
                pbar.update(1)
                continue
            with torch.inference_mode():  # no autograd graph: encoders are frozen here
                latent = vae.encode(pixels)
                if item.frames and latent.ndim != 5:
                    raise CacheError(f"the VAE encoded the video {item.path} as {latent.shape[0]} separate images "
                                     f"(latent {tuple(latent.shape)}): it is an image VAE. Connect the VAE of a video "
                                     "model (Wan, HunyuanVideo, LTXV...), or set LoadDataset's video_frames to 0.")
                if caption in caption_item:
                    cond, extras = load_cond(cache_dir, caption_item[caption])
                else:
                    cond, extras = clip.encode_from_tokens_scheduled(clip.tokenize(caption))[0]
                    extras = {k: v for k, v in extras.items() if k not in _NOT_DATA_KEYS}
                extras = {k: v for k, v in extras.items() if not _per_item(k)}  # per item, not per caption
                if first_frame_conditioning and item.frames:
                    extras.update(first_frame_extras(vae, pixels, latent))
                if control is not None:
                    extras.update(reference_extras(vae, control))
            try:
                # a mask failing to decode after passing the scan skips the item (engine/dataset_pairs.py policy)
                mask = loss_mask_tensor(item, size, latent) if item.mask else None
            except ImageReadError as e:
                failed.append(str(e))
                pbar.update(1)
                continue
            try:
                skipped_keys.update(write_item(cache_dir, index, latent, cond, extras,
                                               _text(relative_source(dataset, item.path)), caption, item.repeats,
                                               loss_mask=mask))
            except OSError as e:
                raise _write_error(dataset, e) from e
            caption_item.setdefault(caption, index)
            encoded += 1
            pbar.update(1)

        failures = "; ".join(failed[:FAILURES_SHOWN]) + (
            f" ... and {len(failed) - FAILURES_SHOWN} more" if len(failed) > FAILURES_SHOWN else "")
        if failed:
            log.warning("PipeTrain CacheLatents: %d image(s) could not be decoded and are left out of the cache "
                        "(the rest trains; fix them and run again to add them): %s", len(failed), failures)
        if skipped_keys:
            log.warning("PipeTrain CacheLatents: conditioning value(s) %s are neither tensors nor JSON and were not "
                        "cached; models that need them will not train correctly.", ", ".join(sorted(skipped_keys)))
        done = [i for i in range(total) if item_done(cache_dir, i)]
        if not done:
            raise CacheError(f"none of the dataset's {total} image(s) could be decoded, so there is nothing to train "
                             f"on: {failures or '?'}.")
        latent_shape, cond_keys = item_summary(cache_dir, done[0])
        items = [{"file": item_path(cache_dir, i).relative_to(cache_dir).as_posix(),
                  "source": _text(relative_source(dataset, entries[i][0].path)), "repeats": entries[i][0].repeats,
                  "size": list(entries[i][1]), "bucket": bucket_key(cache_dir, i),
                  "key": item_key(dataset, *entries[i])} for i in done]
        try:
            write_manifest(cache_dir, fp, dataset, items, latent_shape, cond_keys, identity)
        except OSError as e:
            raise _write_error(dataset, e) from e
        log.info("PipeTrain CacheLatents: %d item(s) reused, %d linked from the previous cache, %d encoded (%d distinct "
                 "caption(s)) in %.1fs -> %s", reused, linked, encoded, len(caption_item), time.monotonic() - start,
                 cache_dir)
        return (CacheSpec(str(cache_dir), fp, len(items), tuple(latent_shape)),)
