"""The dataset spec: what the LoadDataset node outputs (PIPETRAIN_DATASET) and the engine reads back, as
frozen dataclasses with their JSON form and the checks that need no disk access. The folder scan that reads
the files it names is engine/data/scan.py (which re-exports these names, so imports from there keep working).

Pure Python (no torch, no comfy, no file read).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from . import frame_rates as fr
from .batch_sizes import check_batch_sizes
from .batch_sizes import from_json as batch_pairs
from .buckets import bucket_sizes, nearest_bucket
from .caption_variants import check_caption_options
from .dataset_chain import chained_parts, check_chain
from .frame_buckets import check_clip_settings, clip_lengths, parse_frame_buckets
from .frame_picks import BEGINNING
from .messages import DatasetError

DATASET_SPEC_VERSION = 1
MIN_RESOLUTION, MAX_RESOLUTION, RESOLUTION_STEP = 64, 4096, 64


# ---- the spec (crosses the node -> engine boundary as JSON) -------------------------------
# Growth plan: new options are added as fields WITH defaults that reproduce today's behaviour
# (buckets, video frames, masks, control images, caption options), and per-folder overrides
# as Optional fields on FolderSpec where None means "inherit from DatasetSpec". Old JSON then
# still loads. `version` only changes if a field's meaning changes.

@dataclass(frozen=True)
class FolderSpec:
    path: str  # absolute after parse_folder_lines; the spec never depends on the cwd
    repeats: int = 1  # how often each image of this folder is seen per epoch

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FolderSpec":
        return cls(**_known_fields(cls, data, "dataset.folders[]"))


@dataclass(frozen=True)
class DatasetSpec:
    folders: tuple[FolderSpec, ...]
    resolution: int
    caption_ext: str = ".txt"
    version: int = DATASET_SPEC_VERSION
    # engine/data/buckets.py: () = square only; otherwise width/height ratios, each image to the nearest
    aspect_ratios: tuple[float, ...] = ()
    extra_resolutions: tuple[int, ...] = ()  # every image is also trained at each of these sizes
    bucket_multiple: int = 64  # bucket sides are rounded to this many pixels
    video_frames: int = 0  # frames per video clip (engine/data/video.py); 0 = videos are skipped
    frame_stride: int = 1  # take every N-th source frame
    mask_folder: str = ""  # absolute; loss masks by image name (engine/data/pairs.py); "" = none
    control_folder: str = ""  # absolute; control (reference) images of edit pairs; "" = none
    follow_links: bool = False  # read files linked from outside their folder (off: skipped and listed)
    # clips' frames picked by timestamp at this rate; 0 = every frame_stride-th source frame; "auto" = the
    # video model's rate, which CacheLatents sets from its VAE (engine/data/frame_rates.py)
    target_fps: float | str = 0.0
    # what is encoded of each caption (engine/data/caption_variants.py), and how often training drops it
    caption_prefix: str = ""  # put before every caption (a trigger word), as typed
    caption_lines: bool = False  # each line of a caption file is a caption; one is picked per epoch
    tag_shuffles: int = 0  # shuffled tag orders cached per caption; 0 = tags keep their order
    keep_tokens: int = 0  # leading tags that stay in place when shuffled
    caption_dropout: float = 0.0  # share of samples trained with the empty caption (not in the fingerprint)
    # video clip lengths, ascending (engine/data/frame_buckets.py); () = the single length video_frames
    frame_buckets: tuple[int, ...] = ()
    clip_mode: str = BEGINNING  # which part(s) of each video its clips take: frame_picks.CLIP_MODES
    # the other datasets of the run, each with all its own settings (LoadDataset's add_to;
    # engine/data/dataset_chain.py); flat: a part's own `more` is always ()
    more: tuple["DatasetSpec", ...] = ()
    # (resolution, micro batch) pairs: that resolution's batches hold this many (engine/data/batch_sizes.py);
    # () = the run's batch_size everywhere. Not in the fingerprint: it changes no tensor
    batch_sizes: tuple[tuple[int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        # optional settings only when set: the dicts of older specs stay equal (trust_cache compares them)
        pairs = {k: v for k, v in (("mask_folder", self.mask_folder), ("control_folder", self.control_folder),
                                   ("follow_links", self.follow_links),
                                   ("target_fps", self.clip_lengths and self.target_fps),
                                   ("caption_prefix", self.caption_prefix), ("caption_lines", self.caption_lines),
                                   ("tag_shuffles", self.tag_shuffles), ("keep_tokens", self.keep_tokens),
                                   ("caption_dropout", self.caption_dropout),
                                   ("frame_buckets", list(self.frame_buckets)),
                                   ("clip_mode", self.clip_mode != BEGINNING and self.clip_mode),
                                   ("more", [part.to_dict() for part in self.more]),
                                   ("batch_sizes", [list(p) for p in self.batch_sizes])) if v}
        return {"folders": [f.to_dict() for f in self.folders], "resolution": self.resolution,
                "caption_ext": self.caption_ext, "version": self.version, "aspect_ratios": list(self.aspect_ratios),
                "extra_resolutions": list(self.extra_resolutions), "bucket_multiple": self.bucket_multiple,
                "video_frames": self.video_frames, "frame_stride": self.frame_stride, **pairs}

    @property
    def parts(self) -> tuple["DatasetSpec", ...]:
        """Every dataset of the run, this one first, each on its own (its `more` empty): cached apart."""
        return (dataclasses.replace(self, more=()),) + tuple(self.more)

    @property
    def resolutions(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((self.resolution,) + tuple(self.extra_resolutions)))

    @property
    def clip_lengths(self) -> tuple[int, ...]:
        """The frame buckets videos train at (frame_buckets, else video_frames); () = videos are skipped."""
        return clip_lengths(self)

    @property
    def bucketed(self) -> bool:
        """Whether any setting differs from the square single-resolution default."""
        return bool(self.aspect_ratios or self.extra_resolutions or self.clip_lengths) or \
            self.bucket_multiple != RESOLUTION_STEP

    def sizes_for(self, width: int, height: int) -> tuple[tuple[int, int], ...]:
        """(width, height) this image is trained at: one per resolution."""
        return tuple(nearest_bucket(width, height, bucket_sizes(r, self.aspect_ratios, self.bucket_multiple))
                     for r in self.resolutions)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DatasetSpec":
        kw = _known_fields(cls, data, "dataset")
        if not isinstance(kw.get("version", DATASET_SPEC_VERSION), int):
            raise DatasetError(f"dataset.version must be a whole number, got {kw['version']!r}.")
        if kw.get("version", DATASET_SPEC_VERSION) > DATASET_SPEC_VERSION:
            raise DatasetError(f"dataset spec version {kw['version']} is newer than this PipeTrain understands "
                               f"({DATASET_SPEC_VERSION}): update PipeTrain.")
        kw["folders"] = tuple(FolderSpec.from_dict(f) for f in kw.get("folders", ()))
        try:
            kw["aspect_ratios"] = tuple(float(x) for x in kw.get("aspect_ratios", ()))
            kw["extra_resolutions"] = tuple(int(x) for x in kw.get("extra_resolutions", ()))
        except (TypeError, ValueError) as e:
            raise DatasetError(f"dataset.aspect_ratios / extra_resolutions must be lists of numbers ({e}).") from None
        if "target_fps" in kw:
            kw["target_fps"] = fr.parse_target_fps(kw["target_fps"])
        if "frame_buckets" in kw:
            kw["frame_buckets"] = parse_frame_buckets(kw["frame_buckets"])
        if "more" in kw:
            kw["more"] = chained_parts(kw["more"], cls.from_dict)
        if "batch_sizes" in kw:
            kw["batch_sizes"] = batch_pairs(kw["batch_sizes"])
        return cls(**kw)

    def check(self) -> None:
        """Checks that need no disk access."""
        r = self.resolution
        if not (isinstance(r, int) and MIN_RESOLUTION <= r <= MAX_RESOLUTION and r % RESOLUTION_STEP == 0):
            raise DatasetError(f"resolution is {r}: use a multiple of {RESOLUTION_STEP} between {MIN_RESOLUTION} "
                               f"and {MAX_RESOLUTION} (e.g. 512 or 1024).")
        for x in self.extra_resolutions:
            if not (isinstance(x, int) and MIN_RESOLUTION <= x <= MAX_RESOLUTION and x % RESOLUTION_STEP == 0):
                raise DatasetError(f"extra_resolutions lists {x}: use multiples of {RESOLUTION_STEP} between "
                                   f"{MIN_RESOLUTION} and {MAX_RESOLUTION} (e.g. '768, 1024'), or leave it empty.")
        if self.bucket_multiple not in (8, 16, 32, 64):
            raise DatasetError(f"bucket_multiple is {self.bucket_multiple}: use 8, 16, 32 or 64 (64 suits every "
                               "model; 16 for SD/SDXL/Flux/Wan 2.1, 32 for Wan 2.2 5B and LTXV).")
        check_clip_settings(self.video_frames, self.frame_buckets, self.clip_mode)
        if not (isinstance(self.frame_stride, int) and 1 <= self.frame_stride <= 100):
            raise DatasetError(f"frame_stride is {self.frame_stride}: use a whole number from 1 (every frame) to 100.")
        fr.check_target_fps(self.target_fps)
        check_caption_options(self.caption_prefix, self.caption_lines, self.tag_shuffles, self.keep_tokens,
                              self.caption_dropout)
        if any(not (0 < a < 100) for a in self.aspect_ratios):
            raise DatasetError(f"aspect_ratios {list(self.aspect_ratios)}: every ratio must be a positive width/height.")
        if not isinstance(self.follow_links, bool):
            raise DatasetError(f"follow_links is {self.follow_links!r}: use true or false.")
        if not self.folders:
            raise DatasetError("no dataset folders given: enter at least one folder, one per line.")
        for f in self.folders:
            if not (isinstance(f.repeats, int) and f.repeats >= 1):
                raise DatasetError(f"repeats for folder {f.path} is {f.repeats}: use a whole number of 1 or more.")
        if not self.caption_ext.startswith("."):
            raise DatasetError(f"caption_ext is {self.caption_ext!r}: use an extension starting with '.', like '.txt'.")
        seen: dict[str, str] = {}
        for f in self.folders:
            # realpath: 'cats', 'cats/', './x/../cats' and a link to cats are all the same folder
            key = os.path.normcase(os.path.realpath(f.path))
            if key in seen:
                same = "" if seen[key] == f.path else f" (the same folder as {seen[key]})"
                raise DatasetError(f"folder {f.path} is listed twice{same}: list it once and use '| repeats=N' "
                                   "to show it more often.")
            seen[key] = f.path
        for setting in ("mask_folder", "control_folder"):
            folder = getattr(self, setting)
            key = os.path.normcase(os.path.realpath(folder)) if folder else None
            if key in seen:
                raise DatasetError(f"{setting} {folder} is also a dataset folder ({seen[key]}): keep masks and "
                                   "control images in a folder of their own, or they are trained as images.")
            if key:
                seen[key] = setting
        check_batch_sizes(self.batch_sizes, self.resolutions)
        check_chain(self)


def _known_fields(cls, data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise DatasetError(f"{where} must be a JSON object, got {type(data).__name__}.")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise DatasetError(f"unknown setting(s) in {where}: {', '.join(unknown)}. This cache/spec was written by a "
                           "newer PipeTrain, or the spelling is wrong.")
    return dict(data)
