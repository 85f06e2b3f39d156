"""PipeTrainLoadDataset: folders of images + captions -> PIPETRAIN_DATASET (a DatasetSpec).

The node only describes and checks the dataset (no pixels are decoded beyond Pillow's
integrity check); CacheLatents does the encoding.
"""
from __future__ import annotations

import logging

from ..engine.data.batch_sizes import parse_batch_sizes
from ..engine.data.buckets import BucketError, parse_aspect_ratios, parse_resolutions
from ..engine.data.caption_variants import MAX_KEEP_TOKENS, MAX_TAG_SHUFFLES, options_summary
from ..engine.data.dataset_chain import join, part_name
from ..engine.data.folders import resolve_extra_folder
from ..engine.data.frame_buckets import parse_frame_buckets
from ..engine.data.frame_picks import BEGINNING, CLIP_MODES
from ..engine.data.frame_rates import AUTO, fps_text, parse_target_fps, rates_summary
from ..engine.data.messages import EXAMPLES_SHOWN, DatasetError, skipped_text
from ..engine.data.scan import (
    DatasetSpec,
    cache_entries,
    files_signature,
    folder_line_notes,
    parse_folder_lines,
)
from ..engine.data.scan_memo import (
    scan,  # validate(), with the result kept for CacheLatents while no file changes
)
from . import compat
from .types import DATASET

log = logging.getLogger("PipeTrain")

_FOLDERS_TOOLTIP = (
    "Image folders, one per line. Relative paths are looked up in ComfyUI's input folder ('..' may leave it); "
    "absolute paths work too, quoted or not. Add ' | repeats=N' after a folder to show its images N times per "
    "epoch (e.g. 'cats | repeats=3'); lines without it use the 'repeats' input. Each image's caption is the .txt "
    "file with the same name (a.png -> a.txt; a.png and a.jpg would share it); images without one train with an "
    "empty caption. Reads PNG, JPEG, WebP, BMP, TIFF, GIF (animated: first frame), AVIF, and videos (MP4, WebM, "
    "MOV, MKV, AVI...) when video_frames is set. Hidden files (.name) and subfolders are skipped, with a warning "
    "on the node and in the console. Lines starting with # are ignored (and listed); quote a folder whose name "
    "starts with # or holds ' | ', e.g. '\"#1 cats\" | repeats=2'."
)
_LINKS_TOOLTIP = (
    "Off: a file that is a link to somewhere outside its folder (an image, caption, mask or control image) is not "
    "read; it is skipped and listed, so a link cannot pull in files from elsewhere on this machine. On: links are "
    "followed wherever they point. Links that stay inside the folder always work.")


_ADD_TO_TOOLTIP = (
    "Optional: another LoadDataset's dataset output. This node's dataset joins it, so one run trains several "
    "datasets, each with all of its own settings here (resolution, aspect_ratios, repeats, video_frames, caption "
    "options...): chain the nodes A -> add_to of B -> add_to of C and connect the last to Cache Latents. Each dataset "
    "is cached on its own; training draws from all of them in one shuffled order, each image as often as its repeats "
    "say, and a batch never mixes datasets. A folder may be in one dataset only. Leave unconnected for one dataset.")


_BATCH_SIZES_TOOLTIP = (
    "Batch size per resolution, e.g. '512:4, 1024:1' (diffusion-pipe's micro_batch_size_per_gpu list): batches of "
    "this dataset's 512 px samples hold 4, its 1024 px samples 1, so large sizes fit in memory and small ones train "
    "fast. Resolutions not listed use Train Pipeline's batch_size. Each must be the resolution or one of the "
    "extra_resolutions. Changes no cached tensor (nothing is encoded again). Not with pipeline_stages above 1. "
    "Empty: batch_size everywhere.")


def _input_dir() -> str | None:
    """ComfyUI's input folder, or None outside ComfyUI (then only absolute folders work)."""
    try:
        return compat.input_directory()
    except ImportError:  # folder_paths is ComfyUI's; absent when the pack is imported elsewhere
        return None


_ASPECT_TOOLTIP = (
    "Aspect-ratio buckets. Empty: every image is center-cropped to a square (resolution x resolution). 'auto': 9 "
    "shapes from 1:2 to 2:1 with about resolution x resolution pixels each; or list ratios, e.g. '1:1, 4:3, 3:4, "
    "16:9, 9:16'. Each image goes to the shape nearest its own, is resized to cover it and center-cropped; a batch "
    "only ever holds one shape (and one caption length), so batch_size > 1 works.")
_RESOLUTIONS_TOOLTIP = (
    "More training sizes, e.g. '768, 1024' (multiples of 64): every image is also cached and trained at each of them "
    "(multi-resolution training), so an epoch has that many more samples. Empty: only 'resolution'.")
_MULTIPLE_TOOLTIP = (
    "Bucket sides are rounded to this many pixels. 64 suits every model; 16 is enough for SD1.5/SDXL/Flux/Wan 2.1, "
    "32 for Wan 2.2 5B and LTXV. Only matters with aspect_ratios.")


_FRAMES_TOOLTIP = (
    "Frames per video clip; 0 skips videos. Use the count your video model needs: 4k+1 (17, 33, 49, 81) for Wan and "
    "HunyuanVideo, 8k+1 (25, 49, 97) for LTXV. Each video trains on one clip from its start (clip_mode picks "
    "others; frame_buckets gives several lengths); videos shorter than a clip are skipped and listed. A phone video's rotation is applied; animated GIF/WebP files are skipped (convert them "
    "to MP4). Needs the video model's VAE in CacheLatents.")
_STRIDE_TOOLTIP = ("Take every N-th frame: of the video resampled at target_fps (16 fps with stride 2 gives 8 fps, "
                   "so a clip spans twice the time), or of the source frames when target_fps is 'source' (2 halves a "
                   "30 fps video to 15 fps). Only matters with video_frames.")
_FPS_TOOLTIP = (
    "The frame rate clips are sampled at: frame i of a clip is the source frame nearest to i / target_fps seconds "
    "after its first frame, so a 60 fps, 24 fps or variable-frame-rate video moves at the speed the model knows. "
    "'auto' (or empty): the rate of the video model whose VAE CacheLatents gets (16 for Wan 2.1/2.2 14B, 24 for HunyuanVideo "
    "and Wan 2.2 5B, 25 for LTX-Video, 30 for Mochi); a VAE that names no model (e.g. a light TAE) keeps the source "
    "frames, with a warning. Or a rate: 16, 24, 23.976, 30000/1001. 'source' (or 0): every frame_stride-th frame of "
    "the file, as it is. Clips more than 2x faster or slower than the rate, and variable-rate clips, are listed. "
    "Only matters with video_frames.")


_BUCKETS_TOOLTIP = (
    "Several clip lengths in frames, e.g. '17, 33, 65' (instead of the one video_frames): each video trains at the "
    "longest one it is long enough for (at target_fps and frame_stride), so long videos give long clips and short "
    "ones still train; a batch only holds clips of one length. Videos shorter than the shortest are skipped and "
    "listed. Use counts your model's VAE takes: 4k+1 for Wan and HunyuanVideo, 8k+1 for LTXV (CacheLatents checks). "
    "Empty: video_frames alone. Leave video_frames at 0 when you use this (or make it one of the lengths).")
_CLIP_MODE_TOOLTIP = (
    "Which part of each video its clip takes. single_beginning: one clip from the first frame. single_middle: one "
    "clip from the middle (as much cut off the start as off the end). multiple_overlapping: enough clips to cover "
    "the whole video, spread evenly from its first frame to its last (they overlap where the length does not divide "
    "evenly); each clip is a training sample of its own. For image-to-video training single_beginning is usually "
    "what you want. Only matters with video_frames or frame_buckets.")


_MASK_TOOLTIP = (
    "Optional folder of loss masks (relative to ComfyUI's input folder, or absolute). The mask of a.png is the image "
    "named a (any extension) in this folder; its grey level is the loss weight: white trains, black is ignored, grey "
    "in between. Transparent pixels count as black. A mask is cropped and resized with its image; one of another size "
    "is stretched to the image first. Images without a mask train unmasked; an unreadable mask skips its image. "
    "All of them are listed in the console. Leave empty for no masks.")
_CONTROL_TOOLTIP = (
    "Optional folder of control (reference) images for edit models such as Flux Kontext and Qwen-Image-Edit "
    "(relative to ComfyUI's input folder, or absolute). The control image of a.png is the image named a (any "
    "extension) in this folder; the dataset image is the edit result the model learns to produce from it. Control "
    "images are cropped and resized to their image's training size and cached as the reference latent ComfyUI's "
    "ReferenceLatent node gives the model (Cache Latents' control_style picks another way, e.g. for HiDream E1). "
    "Images without a readable control image are skipped and listed. "
    "Leave empty for ordinary (non-edit) training.")


_PREFIX_TOOLTIP = (
    "Text put before every caption, e.g. a trigger word: 'ohwx, ' (type the separator you want; it is kept as "
    "typed). It comes first in every shuffled order and every caption line, and is not counted in keep_tokens. "
    "Images without a caption train with the prefix alone. Changing it encodes the captions again.")
_LINES_TOOLTIP = (
    "On: each line of a caption file is a caption of its own (empty lines are not used); training takes one line "
    "per epoch, so over N epochs an image with N lines trains each once. Off: the whole file is one caption.")
_SHUFFLES_TOOLTIP = (
    "Tag shuffling for comma-separated tag captions ('1girl, red hair, smile'): how many shuffled orders of each "
    "caption CacheLatents encodes (captions are cached as encodings, so the orders are made at cache time); each "
    "training step takes one of them. 0 (default): tags keep their order. 8 is a good start; each order stores one "
    "more text encoding per image on disk.")
_KEEP_TOOLTIP = ("With tag_shuffles: how many leading tags stay in place (1 keeps the first tag, e.g. a character "
                 "name, first in every order). 0 shuffles all tags.")
_DROPOUT_TOOLTIP = (
    "Caption dropout: the share of training samples that train with the empty caption instead of their own (0.1 = "
    "one in ten), which helps the LoRA work without its trigger words and with CFG. Which samples follows from the "
    "training seed, the same on resume and on every GPU. Changing it encodes nothing again (only the empty caption, "
    "once). 0 = off.")


def build_spec(folders: str, resolution: int, repeats: int, aspect_ratios: str = "", extra_resolutions: str = "",
               bucket_multiple: int = 64, video_frames: int = 0, frame_stride: int = 1, mask_folder: str = "",
               control_folder: str = "", follow_links: bool = False, target_fps: str = AUTO,
               caption_prefix: str = "", caption_lines: bool = False, tag_shuffles: int = 0, keep_tokens: int = 0,
               caption_dropout: float = 0.0, frame_buckets: str = "", clip_mode: str = BEGINNING,
               batch_sizes: str = "") -> DatasetSpec:
    if not (isinstance(repeats, int) and repeats >= 1):
        raise DatasetError(f"repeats is {repeats}: use a whole number of 1 or more.")
    try:
        ratios, extra = parse_aspect_ratios(aspect_ratios), parse_resolutions(extra_resolutions)
    except BucketError as e:
        raise DatasetError(str(e)) from None
    spec = DatasetSpec(folders=parse_folder_lines(folders, _input_dir(), repeats), resolution=int(resolution),
                       aspect_ratios=ratios, extra_resolutions=extra, bucket_multiple=int(bucket_multiple),
                       video_frames=int(video_frames), frame_stride=int(frame_stride),
                       mask_folder=resolve_extra_folder(mask_folder, _input_dir(), "mask_folder"),
                       control_folder=resolve_extra_folder(control_folder, _input_dir(), "control_folder"),
                       follow_links=bool(follow_links), target_fps=parse_target_fps(target_fps),
                       caption_prefix=caption_prefix, caption_lines=bool(caption_lines), tag_shuffles=tag_shuffles,
                       keep_tokens=keep_tokens, caption_dropout=float(caption_dropout),
                       frame_buckets=parse_frame_buckets(frame_buckets), clip_mode=clip_mode,
                       batch_sizes=parse_batch_sizes(batch_sizes))
    spec.check()
    return spec


def bucket_report(spec: DatasetSpec, items) -> str:
    """'512x512: 10, 640x384: 3' - how many cached samples each training size gets (without repeats)."""
    counts: dict[tuple[int, int], int] = {}
    for _, size in cache_entries(spec, items):
        counts[size] = counts.get(size, 0) + 1
    return ", ".join(f"{w}x{h}: {n}" for (w, h), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def pair_report(spec: DatasetSpec, counts: dict[str, int]) -> str:
    """'masks: 3 image(s) with one, 2 without (unmasked), 1 skipped (unreadable mask); control images: ...'."""
    parts = []
    if spec.mask_folder:
        parts.append(f"masks: {counts['masked']} image(s) with one, {counts['unmasked']} without (trained unmasked), "
                     f"{counts['mask_skipped']} skipped (unreadable mask)")
    if spec.control_folder:
        parts.append(f"control images: {counts['controlled']} image(s) with one, {counts['control_skipped']} skipped "
                     "(control image missing or unreadable)")
    return "; ".join(parts) + "."


class PipeTrainLoadDataset:
    CATEGORY = "PipeTrain"
    RETURN_TYPES = (DATASET,)
    RETURN_NAMES = ("dataset",)
    OUTPUT_TOOLTIPS = ("The dataset description (folders, captions, resolution); connect it to CacheLatents.",)
    FUNCTION = "load_and_report"
    DESCRIPTION = ("Describe a training dataset: folders of images with same-named .txt captions, optionally with "
                   "loss masks and control images (edit pairs) from folders of their own. "
                   "Checks every image can be read; unreadable files, videos, missing captions and images that "
                   "will be upscaled or heavily cropped are listed by name on the node and in the console.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "folders": ("STRING", {"multiline": True, "default": "", "placeholder": "my_dataset\n/abs/path/extra | repeats=2",
                                   "tooltip": _FOLDERS_TOOLTIP}),
            "resolution": ("INT", {"default": 512, "min": 64, "max": 4096, "step": 64,
                                   "tooltip": "Training size in pixels: each image's shorter side is resized to this, "
                                              "then the center is cropped to a square. Multiple of 64 (512 for SD1.5, "
                                              "1024 for SDXL/Flux)."}),
            "repeats": ("INT", {"default": 1, "min": 1, "max": 10000,
                                "tooltip": "How many times each image is seen per epoch, for folder lines that do not "
                                           "set their own ' | repeats=N'. Use it to balance small folders against "
                                           "large ones."}),
        }, "optional": {
            # a link, not a widget: saved workflows' widget values keep their positions
            "add_to": (DATASET, {"tooltip": _ADD_TO_TOOLTIP}),
            "aspect_ratios": ("STRING", {"default": "", "tooltip": _ASPECT_TOOLTIP}),
            "extra_resolutions": ("STRING", {"default": "", "tooltip": _RESOLUTIONS_TOOLTIP}),
            "bucket_multiple": ("INT", {"default": 64, "min": 8, "max": 64, "step": 8, "tooltip": _MULTIPLE_TOOLTIP}),
            "video_frames": ("INT", {"default": 0, "min": 0, "max": 1025, "tooltip": _FRAMES_TOOLTIP}),
            "frame_stride": ("INT", {"default": 1, "min": 1, "max": 100, "tooltip": _STRIDE_TOOLTIP}),
            "mask_folder": ("STRING", {"default": "", "tooltip": _MASK_TOOLTIP}),
            "control_folder": ("STRING", {"default": "", "tooltip": _CONTROL_TOOLTIP}),
            # new inputs go last: saved UI workflows store widget values by position
            "follow_links": ("BOOLEAN", {"default": False, "tooltip": _LINKS_TOOLTIP}),
            "target_fps": ("STRING", {"default": AUTO, "tooltip": _FPS_TOOLTIP}),
            "caption_prefix": ("STRING", {"default": "", "tooltip": _PREFIX_TOOLTIP}),
            "caption_lines": ("BOOLEAN", {"default": False, "tooltip": _LINES_TOOLTIP}),
            "tag_shuffles": ("INT", {"default": 0, "min": 0, "max": MAX_TAG_SHUFFLES, "tooltip": _SHUFFLES_TOOLTIP}),
            "keep_tokens": ("INT", {"default": 0, "min": 0, "max": MAX_KEEP_TOKENS, "tooltip": _KEEP_TOOLTIP}),
            "caption_dropout": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 0.99, "step": 0.01,
                                          "tooltip": _DROPOUT_TOOLTIP}),
            "frame_buckets": ("STRING", {"default": "", "placeholder": "17, 33, 65", "tooltip": _BUCKETS_TOOLTIP}),
            "clip_mode": (list(CLIP_MODES), {"default": BEGINNING, "tooltip": _CLIP_MODE_TOOLTIP}),
            "batch_sizes": ("STRING", {"default": "", "placeholder": "512:4, 1024:1", "tooltip": _BATCH_SIZES_TOOLTIP}),
        }}

    @classmethod
    def IS_CHANGED(cls, folders, resolution, repeats, aspect_ratios="", extra_resolutions="", bucket_multiple=64,
                   video_frames=0, frame_stride=1, mask_folder="", control_folder="", follow_links=False,
                   target_fps=AUTO, *captions, add_to=None, **caption_options):
        # Names, sizes, mtimes and status-change times only (no file is read): cheap enough to run on every
        # queue, and any added, edited or re-captioned file makes ComfyUI run the node (and CacheLatents) again.
        try:
            return files_signature(build_spec(folders, resolution, repeats, aspect_ratios, extra_resolutions,
                                              bucket_multiple, video_frames, frame_stride, mask_folder,
                                              control_folder, follow_links, target_fps, *captions,
                                              **caption_options))
        except (DatasetError, OSError):
            return float("nan")  # never equal to itself: run the node, which reports the error

    def load_and_report(self, folders, resolution, repeats, *options, add_to=None, **named):
        """What ComfyUI runs: load(), with the dataset report on the node (and in /history). options: the
        optional inputs, as build_spec takes them; add_to: the datasets this one joins."""
        spec, lines, rows = describe(folders, resolution, repeats, *options, **named)
        spec, lines = joined(add_to, spec, lines)
        return {"ui": {"text": lines, "pipetrain_report": report_rows(rows)}, "result": (spec,)}

    def load(self, folders, resolution, repeats, *options, add_to=None, **named):
        spec, lines, _ = describe(folders, resolution, repeats, *options, **named)
        return (joined(add_to, spec, lines)[0],)


def joined(add_to: DatasetSpec | None, spec: DatasetSpec, lines: list[str]) -> tuple[DatasetSpec, list[str]]:
    """The chain with this dataset added (add_to unconnected: the dataset alone), and the report's lines with
    a first one saying where it stands in the chain."""
    if add_to is None:
        return spec, lines
    chain = join(add_to, spec)
    line = (f"{part_name(spec, len(chain.parts))} joins {len(chain.parts) - 1} dataset(s) of this run; each is "
            "cached on its own and trained in one sample order, weighted by its repeats.")
    log.info("PipeTrain LoadDataset: %s", line)
    return chain, [line, *lines]


def describe(folders, resolution, repeats, *options, **named) -> tuple[DatasetSpec, list[str], tuple]:
    """Build and scan the dataset; log its report. Returns (spec, the report's lines, its rows by reason)."""
    spec = build_spec(folders, resolution, repeats, *options, **named)
    result = scan(spec)
    notes = folder_line_notes(folders, _input_dir())
    for warning in (*result.warnings, *notes):
        log.warning("PipeTrain LoadDataset: %s", warning)
    images = sum(1 for item in result.items if not item.frames)
    seen = sum(item.repeats for item in result.items)
    reasons = skipped_text(result.report)
    lines = [f"{images} image(s) in {len(spec.folders)} folder(s), {seen} per epoch with repeats, "
             f"{result.missing_captions.count} without caption, {result.skipped} file(s) skipped"
             + (f" ({reasons})." if reasons else ".")]
    if spec.clip_lengths:
        lines.append(f"{len(result.items) - images} video(s){clips_text(spec, result.items)} "
                     f"(stride {spec.frame_stride}), {sampling_text(spec)}"
                     + (f"; their frame rates: {rates_summary(result.frame_rates)}." if result.frame_rates else "."))
    if result.pair_counts:
        lines.append(pair_report(spec, result.pair_counts))
    if spec.bucketed:
        lines.append(f"samples per training size: {bucket_report(spec, result.items)}")
    if options_summary(spec):
        lines.append(options_summary(spec))
    if spec.batch_sizes:
        lines.append("batch size per resolution: " + ", ".join(f"{r} px: {b}" for r, b in spec.batch_sizes) +
                     " (other resolutions: Train Pipeline's batch_size).")
    for line in lines:
        log.info("PipeTrain LoadDataset: %s", line)
    rows = result.report + ((("folder_line", len(notes), tuple(notes[:EXAMPLES_SHOWN])),) if notes else ())
    return spec, lines + list(result.warnings) + notes, rows


def clips_text(spec: DatasetSpec, items) -> str:
    """' of 17 frame(s) per clip', or with frame buckets / another clip mode how many clips each length got:
    ', clips (multiple_overlapping) per frame bucket: 33 frames: 5, 17 frames: 2'."""
    if not spec.frame_buckets and spec.clip_mode == BEGINNING:
        return f" of {spec.video_frames} frame(s) per clip"
    counts = {n: 0 for n in spec.clip_lengths}
    for item in items:
        if item.frames:
            counts[item.clip_frames] += len(item.clip_starts)
    per = ", ".join(f"{n} frames: {c}" for n, c in sorted(counts.items(), reverse=True))
    return f", clips ({spec.clip_mode}) per frame bucket: {per}"


def sampling_text(spec: DatasetSpec) -> str:
    """How clips take their frames, for the summary line."""
    if spec.target_fps == AUTO:
        return "sampled at the video model's frame rate (target_fps auto: CacheLatents reads it from its VAE)"
    return f"sampled at {fps_text(spec.target_fps)}" if spec.target_fps else "source frames (target_fps source)"


def report_rows(rows) -> list[dict]:
    """The report by reason as JSON for /history: [{"reason", "count", "first"}]."""
    return [{"reason": kind, "count": n, "first": list(first)} for kind, n, first in rows]
