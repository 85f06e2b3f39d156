"""PipeTrainLoadDataset: folders of images + captions -> PIPETRAIN_DATASET (a DatasetSpec).

The node only describes and checks the dataset (no pixels are decoded beyond Pillow's
integrity check); CacheLatents does the encoding.
"""
from __future__ import annotations

import logging

from ..engine.dataset import DatasetError, DatasetSpec, parse_folder_lines, files_signature, validate
from . import compat
from .types import DATASET

log = logging.getLogger("PipeTrain")

_FOLDERS_TOOLTIP = (
    "Image folders, one per line. Relative paths are looked up in ComfyUI's input folder ('..' may leave it); "
    "absolute paths work too, quoted or not. Add ' | repeats=N' after a folder to show its images N times per "
    "epoch (e.g. 'cats | repeats=3'); lines without it use the 'repeats' input. Each image's caption is the .txt "
    "file with the same name (a.png -> a.txt; a.png and a.jpg would share it); images without one train with an "
    "empty caption. Reads PNG, JPEG, WebP, BMP, TIFF, GIF (animated: first frame), AVIF. Videos, hidden files "
    "(.name) and subfolders are skipped, with a warning in the console. Lines starting with # are ignored."
)


def _input_dir() -> str | None:
    """ComfyUI's input folder, or None outside ComfyUI (then only absolute folders work)."""
    try:
        return compat.input_directory()
    except ImportError:  # folder_paths is ComfyUI's; absent when the pack is imported elsewhere
        return None


def build_spec(folders: str, resolution: int, repeats: int) -> DatasetSpec:
    if not (isinstance(repeats, int) and repeats >= 1):
        raise DatasetError(f"repeats is {repeats}: use a whole number of 1 or more.")
    spec = DatasetSpec(folders=parse_folder_lines(folders, _input_dir(), repeats), resolution=int(resolution))
    spec.check()
    return spec


class PipeTrainLoadDataset:
    CATEGORY = "PipeTrain"
    RETURN_TYPES = (DATASET,)
    RETURN_NAMES = ("dataset",)
    OUTPUT_TOOLTIPS = ("The dataset description (folders, captions, resolution); connect it to CacheLatents.",)
    FUNCTION = "load"
    DESCRIPTION = ("Describe a training dataset: folders of images with same-named .txt captions. "
                   "Checks every image can be read; unreadable files, videos, missing captions and images that "
                   "will be upscaled or heavily cropped are listed by name in the console.")

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
        }}

    @classmethod
    def IS_CHANGED(cls, folders, resolution, repeats):
        # Names, sizes and mtimes only (no decoding): cheap enough to run on every queue, and any
        # added, edited or re-captioned file makes ComfyUI run the node (and CacheLatents) again.
        try:
            return files_signature(build_spec(folders, resolution, repeats))
        except (DatasetError, OSError):
            return float("nan")  # never equal to itself: run the node, which reports the error

    def load(self, folders, resolution, repeats):
        spec = build_spec(folders, resolution, repeats)
        result = validate(spec)
        for warning in result.warnings:
            log.warning("PipeTrain LoadDataset: %s", warning)
        images = len(result.items)
        seen = sum(item.repeats for item in result.items)
        log.info("PipeTrain LoadDataset: %d image(s) in %d folder(s), %d per epoch with repeats, %d without caption, "
                 "%d unreadable and %d video(s) skipped.", images, len(spec.folders), seen,
                 result.missing_captions.count, len(result.unreadable), len(result.videos))
        return (spec,)
