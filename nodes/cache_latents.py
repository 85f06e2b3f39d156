"""PipeTrainCacheLatents: encode the dataset once with the graph's VAE and CLIP, keep it on disk.

Training then never loads an encoder. The cache lives under the first dataset folder, keyed by
a fingerprint of the files, captions, resolution and encoder identity (engine/cache/format.py),
so re-running is free, a cancelled run resumes, and a different VAE/CLIP gets its own folder.
The per-item loop is the engine's (engine/cache/writer.py): here it runs as rank 0 of 1, and the
engine's headless cache mode (`python -m engine cache`) runs it on N ranks.
"""
from __future__ import annotations

import dataclasses
import logging
import time

from ..engine.cache.audio_latents import audio_conflict
from ..engine.cache.encoders import cache_identity, identity_text
from ..engine.cache.first_frame import DEFAULT_STYLE, STYLES
from ..engine.cache.format import CacheError, remove_cache

# the per-item encoding lives in the engine (engine/cache/items.py), shared with its cache mode
from ..engine.cache.items import CONTROL_STYLES, ItemOptions, control_style_conflict
from ..engine.cache.vae_frame_rate import check_clip_lengths, resolve_target_fps
from ..engine.cache.writer import (
    encode_shard,
    find_trusted_cache,
    finish_cache,
    plan_cache,
    write_item,
)
from ..engine.data.dataset_chain import part_name
from ..engine.data.scan import DatasetSpec
from . import compat
from .cache_on_ranks import cache_on_ranks
from .cache_sources import encoder_files
from .load_dataset import report_rows
from .types import CACHE, DATASET

log = logging.getLogger("PipeTrain")


class PipeTrainCacheLatents:
    CATEGORY = "PipeTrain"
    RETURN_TYPES = (CACHE,)
    RETURN_NAMES = ("cache",)
    OUTPUT_TOOLTIPS = ("The finished latent + caption cache; connect it to TrainPipeline.",)
    FUNCTION = "cache_and_report"
    DESCRIPTION = ("Encode every image with the VAE and every caption with the text encoder, and store the results "
                   "next to the dataset (.pipetrain_cache). Re-runs reuse it; a cancelled run resumes. What was "
                   "reused, encoded or left out is shown on the node.")

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
                "tooltip": "Image-to-video training: each video clip's first frame is also stored as the start "
                           "image the model continues from, the way first_frame_style says (default: Wan 2.1/2.2 "
                           "I2V's WanImageToVideo). Only affects videos."}),
            "trust_cache": ("BOOLEAN", {
                "default": False,
                "tooltip": "For very large datasets: skip checking every file and reuse the newest complete cache made "
                           "with these encoders and dataset settings, even if files changed since. Turn off (or use "
                           "regenerate) after adding or editing files."}),
            "clip_vision": ("CLIP_VISION", {
                "tooltip": "For image-to-video models that also see the start image through a vision encoder "
                           "(Wan 2.1 I2V: CLIP ViT-H; HunyuanVideo 1.5 I2V: SigLIP). Connect the Load CLIP Vision "
                           "model you would give CLIPVisionEncode: each item's first frame (an image item: the image) "
                           "is encoded with it and cached as clip_vision_output. Leave unconnected for other models."}),
            "clip_vision_crop": (["center", "none"], {
                "default": "center",
                "tooltip": "CLIPVisionEncode's crop setting, used with clip_vision: center crops the frame to a "
                           "square before resizing it to the encoder's input size, none squashes the whole frame. "
                           "Use what your sampling workflow uses."}),
            # new inputs go last: saved UI workflows store widget values by position
            "first_frame_style": (list(STYLES), {
                "default": DEFAULT_STYLE,
                "tooltip": "With first_frame_conditioning on: which image-to-video node's conditioning to store, "
                           "as your model's sampling workflow uses it. " + "; ".join(
                               f"{name}: {what}" for name, what in STYLES.items()) + "."}),
            "control_style": (list(CONTROL_STYLES), {
                "default": CONTROL_STYLES[0],
                "tooltip": "With LoadDataset's control_folder: how each control image reaches the edit model, as "
                           "its sampling workflow passes it. reference_latents: ReferenceLatent (Flux Kontext, "
                           "Qwen-Image-Edit, Flux 2, OmniGen2). concat_latent_image: InstructPixToPixConditioning "
                           "(HiDream E1, InstructPix2Pix models)."}),
            "gpus": ("INT", {
                "default": 1, "min": 1, "max": 64,
                "tooltip": "Encode on this many GPUs at once, one process each (CPU processes where there is no "
                           "GPU), as `python -m engine cache` does from a shell; the cache is the same. Above 1, "
                           "vae, clip, clip_vision and audio_vae must come straight from loader nodes (VAELoader, "
                           "CLIPLoader, DualCLIPLoader, CheckpointLoaderSimple, Load LTXV Audio VAE, ...): each "
                           "process loads those files itself."}),
            "audio_vae": ("VAE", {
                "tooltip": "For models that make sound with the video (LTX 2.3 / 2.0, MiniMax H3; ComfyUI 0.33+): "
                           "connect Load LTXV Audio VAE (LTX) or Load VAE with the H3 audio VAE. Each clip's audio "
                           "track is encoded with it, as LTXV Audio VAE Encode "
                           "does, and cached packed with the video latent, as the model samples them. A clip without "
                           "audio (and an image) is cached as silence; the report lists those, and clips whose "
                           "audio was resampled or mixed down. Leave unconnected for other models."}),
        }, "hidden": {"prompt": "PROMPT", "unique_id": "UNIQUE_ID"}}

    def cache_and_report(self, dataset: DatasetSpec, vae, clip, regenerate: bool, **options):
        """What ComfyUI runs: cache(), with its report on the node (and in /history)."""
        spec, lines, rows = self.encode(dataset, vae, clip, regenerate, **options)
        return {"ui": {"text": lines, "pipetrain_report": report_rows(rows)}, "result": (spec,)}

    def cache(self, dataset: DatasetSpec, vae, clip, regenerate: bool, **options):
        return (self.encode(dataset, vae, clip, regenerate, **options)[0],)

    def encode(self, dataset: DatasetSpec, vae, clip, regenerate: bool, first_frame_conditioning: bool = False,
               trust_cache: bool = False, clip_vision=None, clip_vision_crop: str = "center",
               first_frame_style: str = DEFAULT_STYLE, control_style: str = CONTROL_STYLES[0], gpus: int = 1,
               audio_vae=None, prompt=None, unique_id=None):
        """Plan, encode and finish the cache of each chained dataset (LoadDataset's add_to), one after another
        with the same encoders; returns (CacheSpec listing every part's cache, the report's lines, its rows by
        reason). gpus above 1: the ranks encode first (nodes/cache_on_ranks.py), then this finds every item cached."""
        parts = dataset.parts
        for number, part in enumerate(parts, start=1):  # every part's conflicts before any is encoded
            conflict = control_style_conflict(control_style, first_frame_conditioning, part.control_folder)
            if audio_vae is not None:
                conflict = conflict or audio_conflict(first_frame_style if first_frame_conditioning else "",
                                                      part.mask_folder)
            if conflict:
                raise CacheError(conflict if len(parts) == 1 else f"{part_name(part, number)}: {conflict}")
        options = ItemOptions(first_frame_style if first_frame_conditioning else "", clip_vision,
                              clip_vision_crop != "none", control_style, audio_vae)
        identity = cache_identity(vae, clip, options)
        for part in parts:  # the VAE's clip-length rule: before any part is encoded
            check_clip_lengths(part, vae)
        ranks = dict(first_frame_conditioning=first_frame_conditioning, first_frame_style=first_frame_style,
                     control_style=control_style, clip_vision_crop=clip_vision_crop)
        done = [self._encode_part(part, vae, clip, regenerate, options, identity, trust_cache, gpus, ranks,
                                  encoder_files(prompt, unique_id, clip_vision is not None, audio_vae is not None)
                                  if gpus > 1 else None)
                for part in parts]
        if len(done) == 1:
            return done[0]
        lines, rows = [], ()
        for number, (part, (spec, part_lines, part_rows)) in enumerate(zip(parts, done), start=1):
            lines += [f"{part_name(part, number)}: {line}" for line in part_lines]
            rows += tuple(part_rows)
        first = done[0][0]
        return dataclasses.replace(first, more=tuple(d[0] for d in done[1:])), lines, rows

    @staticmethod
    def _encode_part(dataset: DatasetSpec, vae, clip, regenerate: bool, options: ItemOptions, identity: dict,
                     trust_cache: bool, gpus: int, ranks: dict, files):
        """One dataset's cache, as CacheLatents made it before datasets could be chained."""
        notes: list[str] = []  # what the report says before the warnings
        warnings: list[str] = []

        def note(message: str) -> None:
            notes.append(message)
            log.info("PipeTrain CacheLatents: %s", message)

        def warn(message: str) -> None:
            warnings.append(message)
            log.warning("PipeTrain CacheLatents: %s", message)
        # target_fps "auto" becomes the rate of the VAE's video model (clip lengths were checked against the VAE
        # above): LoadDataset cannot know it
        dataset = resolve_target_fps(dataset, vae, note, warn)
        if trust_cache and not regenerate:
            trusted = find_trusted_cache(dataset, identity)
            if trusted is not None:
                line = (f"trust_cache is on: reusing {trusted.cache_dir} ({trusted.count} item(s)) without "
                        "checking the files.")
                log.info("PipeTrain CacheLatents: %s", line)
                return trusted, [line, *notes, *warnings], ()
            log.info("PipeTrain CacheLatents: trust_cache is on but no complete cache matches; checking every file")
        if gpus > 1:
            ranks_said = cache_on_ranks(dataset, files, gpus, identity_text(identity), regenerate, ranks)
            note(f"encoded on {gpus} processes: {ranks_said}")
            regenerate = False  # the ranks did; what follows reads their cache
        plan = plan_cache(dataset, identity, warn)
        if regenerate and plan.cache_dir.exists():
            log.info("PipeTrain CacheLatents: regenerate is on, deleting %s", plan.cache_dir)
            remove_cache(plan.cache_dir)

        pbar = compat.progress_bar(len(plan.entries))
        start = time.monotonic()
        # write_item looked up here, at call time: tests replace it to simulate a full disk
        result = encode_shard(plan, vae, clip, regenerate=regenerate, options=options, write=write_item,
                              check_cancel=compat.raise_if_interrupted, progress=lambda: pbar.update(1))
        spec = finish_cache(plan, result, warn)
        line = (f"{result.reused} item(s) reused, {result.copied} copied from the previous cache, {result.encoded} "
                f"encoded ({result.captions} distinct caption(s)), {result.failed_count} left out, in "
                f"{time.monotonic() - start:.1f}s -> {plan.cache_dir}")
        log.info("PipeTrain CacheLatents: %s", line)
        failed = (("encode_failed", result.failed_count, tuple(result.failed)),) if result.failed_count else ()
        sound = tuple((kind, count, tuple(names)) for kind, (count, names) in sorted(result.audio_notes.items()))
        return spec, [line, *notes, *warnings], plan.report + failed + sound
