"""Image datasets: the spec the LoadDataset node outputs, the folder scan and its report.

Pure Python + Pillow (no torch, no comfy), so the ComfyUI node validates a dataset without
touching the GPU and the engine can read the same spec in its own process. Reading one image
(probing, decoding, the alpha/crop/upscale policies) is engine/data/images.py.

Folder line syntax (the LoadDataset node's `folders` box, parsed by `parse_folder_lines`):
    one folder per line, optionally followed by `| repeats=N`:
        cats
        /data/dogs | repeats=3
        "/data/a | b" | repeats=2     (quoted: '|' and a leading '#' are part of the name)
        # a comment: not used, and listed in the report; blank lines are ignored too
    Relative folders are resolved against ComfyUI's input folder (engine/data/folders.py).
Loss masks and control images (`mask_folder`, `control_folder`) are paired with the scanned
images in engine/data/pairs.py.

The scan never raises for a bad file: every skipped or altered file goes into grouped warnings
naming the files and the fix; `validate` raises DatasetError only when nothing trainable is
left. Videos are scanned only when `video_frames` or `frame_buckets` is set (engine/data/video.py), each
goes to the longest frame bucket it fills and gives one clip or several by `clip_mode`
(engine/data/frame_buckets.py), and their frames are sampled at `target_fps` (engine/data/frame_rates.py); the size each
file trains at comes from engine/data/buckets.py (`DatasetSpec.sizes_for`, `cache_entries`). Captions: `<image stem><caption_ext>` (ignoring case if the exact name is missing); a.png
and a.jpg share a.txt, and the scan says so. Hidden files (names starting with '.') are skipped, and
so are links that leave their folder unless `follow_links` (engine/data/folders.py: outside_link).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from . import frame_rates as fr
from .frame_buckets import check_clip_settings, clip_lengths, parse_frame_buckets
from .frame_picks import BEGINNING
from .batch_sizes import check_batch_sizes
from .batch_sizes import from_json as batch_pairs
from .buckets import bucket_sizes, merged_buckets_notice, nearest_bucket
from .caption_variants import check_caption_options
from .captions import MAX_CAPTION_CHARS, read_caption
from .dataset_chain import chained_parts, check_chain
from .folders import (
    caption_lookalikes,
    media_subfolders,
    outside_link,
    read_folder_lines,
    subfolder_warnings,
    unlisted_media,
)
from .folders import list_dataset_folder as _list_folder
from .images import UNSUPPORTED_IMAGE_FORMATS, ImageReadError, caption_name, name_key, probe_image
from .messages import (
    EXAMPLES_SHOWN,
    DatasetError,
    ReportRow,
    aspect_advice,
    grouped_report,
    note_image,
)
from .messages import WARNINGS as _WARNINGS
from .messages import examples as _examples
from .messages import no_images_message as _no_images_message
from .pairs import PairedFile, Pairing, pair_signature
from .video import VideoReadError, probe_video

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


def parse_folder_lines(text: str, base_dir: str | None, default_repeats: int = 1) -> tuple[FolderSpec, ...]:
    """Parse the node's multi-line folder box into absolute FolderSpecs (syntax in the module doc).

    `base_dir` is where relative folders live (ComfyUI's input folder); None means only absolute
    folders are allowed. Missing folders are reported here, where we still know what was typed.
    The lines not used are folder_line_notes' (engine/data/folders.py: read_folder_lines).
    """
    return tuple(FolderSpec(path, repeats) for path, repeats in read_folder_lines(text, base_dir, default_repeats)[0])


def folder_line_notes(text: str, base_dir: str | None) -> list[str]:
    """One note per line of the folder box that is not used (a '#' comment), for the dataset report."""
    return read_folder_lines(text, base_dir)[1]


# ---- scanning ------------------------------------------------------------------------------

@dataclass(frozen=True)
class DatasetItem:
    path: str
    caption: str | None  # None = no caption file (training uses the empty caption)
    repeats: int
    size_bytes: int
    mtime_ns: int
    width: int = 0  # as displayed (EXIF rotation applied); picks the aspect-ratio bucket
    height: int = 0
    frames: int = 0  # a video's frame count; 0 for an image
    mask: PairedFile | None = None  # its loss mask (engine/data/pairs.py); None = unmasked
    control: PairedFile | None = None  # its control (reference) image; set for every item when control_folder is
    clip_frames: int = 0  # a video's frame bucket: the frames each of its clips has (engine/data/frame_buckets.py)
    clip_starts: tuple[float, ...] = ()  # where its clips begin (s), by clip_mode; cache_entries makes one entry each


@dataclass(frozen=True)
class MissingCaptions:
    count: int
    examples: tuple[str, ...]  # the first few image paths without a caption file


@dataclass(frozen=True)
class UnreadableFile:
    path: str
    reason: str  # a whole sentence: names the file, says what is wrong and what to do


@dataclass(frozen=True)
class ScanResult:
    items: tuple[DatasetItem, ...]
    missing_captions: MissingCaptions
    unreadable: tuple[UnreadableFile, ...]
    warnings: tuple[str, ...]
    videos: tuple[str, ...] = ()  # skipped because video_frames is 0
    pair_counts: dict[str, int] = dataclasses.field(default_factory=dict)  # Pairing.counts; empty without folders
    report: tuple[ReportRow, ...] = ()  # per reason: (kind, how many, the first names), in the order shown
    skipped: int = 0  # media files found that are not trained, for any reason (the rows say which)
    frame_rates: dict[str, int] = dataclasses.field(default_factory=dict)  # '24 fps' -> how many usable videos


def files_signature(spec: DatasetSpec) -> str:
    """Hash of names, sizes, mtimes, ctimes and inodes of images and captions; no file is opened (for
    IS_CHANGED). ctime and inode: an edit that restores size and mtime (cp -p, rsync -t) still counts."""
    h = hashlib.sha256(repr((spec.resolution, spec.caption_ext, spec.follow_links)).encode())
    if spec.bucketed:
        h.update(json.dumps(spec.to_dict(), sort_keys=True).encode("utf-8", "surrogateescape"))
    for folder in spec.folders:
        h.update(f"\0{folder.path}\0{folder.repeats}".encode("utf-8", "surrogateescape"))
        listing = _list_folder(folder.path)
        for name in listing.images + (listing.videos if spec.clip_lengths else []):
            caption = caption_name(listing, name, spec.caption_ext) or "-"
            for p in (os.path.join(folder.path, name), os.path.join(folder.path, caption)):
                try:
                    st = os.stat(p)
                    h.update(f"\0{p}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}".encode(
                        "utf-8", "surrogateescape"))
                except OSError:
                    h.update(f"\0{p}\0-".encode("utf-8", "surrogateescape"))
    h.update(pair_signature(spec.mask_folder, spec.control_folder).encode())
    for part in spec.more:  # chained datasets: any change to one of them runs the nodes again
        h.update(files_signature(part).encode())
    return h.hexdigest()


def scan_dataset(spec: DatasetSpec) -> ScanResult:
    """List every image of the dataset in a stable order; bad files are collected, not raised."""
    items: list[DatasetItem] = []
    report: dict[str, list[str]] = {kind: [] for kind, _ in _WARNINGS}
    unreadable: list[UnreadableFile] = []
    videos: list[str] = []
    subfolder_notes: list[str] = []
    candidates = 0  # media files found; those that are no item were skipped
    rates: dict[str, int] = {}  # the usable videos' frame rates, for the summary
    pairing = Pairing(spec.mask_folder, spec.control_folder, report, spec.follow_links)
    for folder in spec.folders:
        listing = _list_folder(folder.path)
        join = lambda name: os.path.join(folder.path, name)  # noqa: E731
        candidates += len(listing.images) + len(listing.videos) + len(listing.unsupported) + len(listing.hidden)
        if not spec.clip_lengths:
            videos += [join(n) for n in listing.videos]
        report["unsupported"] += [f"{join(n)} ({UNSUPPORTED_IMAGE_FORMATS[os.path.splitext(n)[1].lower()]})"
                                  for n in listing.unsupported]
        report["hidden"] += [join(n) for n in listing.hidden]
        users: dict[str, list[str]] = {}  # caption name -> image names using it
        lookalikes = caption_lookalikes(listing, spec.caption_ext)
        for name in listing.images + (listing.videos if spec.clip_lengths else []):
            path = join(name)
            if not spec.follow_links and (target := outside_link(folder.path, name)):
                report["outside_link"].append(f"{path} -> {target}")
                continue
            try:
                info = probe_video(path) if name in listing.videos else probe_image(path)
                st = os.stat(path)
            except (ImageReadError, VideoReadError) as e:
                unreadable.append(UnreadableFile(path, str(e)))
                continue
            except OSError as e:  # vanished or became unreadable between the probe and stat
                unreadable.append(UnreadableFile(path, f"{path} cannot be read ({e.strerror}): check the file"))
                continue
            frames = getattr(info, "frames", 0)  # VideoInfo only
            if spec.clip_lengths and getattr(info, "animated", False):
                # with video_frames set its motion is expected to train; only video files give it
                report["animated_video"].append(path)
                continue
            bucket = fr.clip_bucket(spec, info.times) if frames else 0
            if bucket is None:  # shorter than the shortest frame bucket
                report["short"].append(fr.short_note(spec, path, info.times))
                continue
            clips = fr.clips_of(spec, info.times, bucket) if frames else ()
            item = pairing.attach(DatasetItem(path, None, folder.repeats, st.st_size, st.st_mtime_ns, info.width,
                                              info.height, frames, clip_frames=bucket, clip_starts=clips))
            if item is None:  # its control image or mask is missing/unreadable: listed by the pairing
                continue
            note_image(report, path, info, spec)
            if frames:
                fr.note_frame_rate(report, rates, path, info.times, spec)
            cap_name = caption_name(listing, name, spec.caption_ext)
            caption = None
            if cap_name is not None:
                users.setdefault(cap_name, []).append(name)
                if cap_name != os.path.splitext(name)[0] + spec.caption_ext:
                    report["caption_case"].append(f"{path} -> {cap_name}")
                target = None if spec.follow_links else outside_link(folder.path, cap_name)
                caption, kind, example = ("", "caption_link", f"{join(cap_name)} -> {target}") if target \
                    else read_caption(join(cap_name))
                if kind:
                    report[kind].append(example)
                if not caption and kind not in ("caption_unreadable", "caption_binary", "caption_link"):
                    report["empty_caption"].append(join(cap_name))
            else:
                report["missing"].append(path)
                if other := lookalikes.get(name_key(os.path.splitext(name)[0])):  # a.caption, a.tags: another tool's
                    report["caption_other_ext"].append(f"{path} ({other})")
            items.append(dataclasses.replace(item, caption=caption))
        report["shared_caption"] += [f"{join(c)} <- {', '.join(names)}" for c, names in users.items() if len(names) > 1]
        # a caption no file of the folder claims (skipped files keep theirs): usually a naming mistake
        claimed = {caption_name(listing, n, spec.caption_ext)
                   for n in listing.images + listing.videos + listing.unsupported + listing.hidden}
        report["caption_unused"] += [join(n) for names in listing.by_casefold.values() for n in names
                                     if n.lower().endswith(spec.caption_ext.lower()) and not n.startswith(".")
                                     and n not in claimed]
        listed = (spec.mask_folder, spec.control_folder, *(f.path for f in spec.folders))  # scanned or paired already
        subfolder_notes += subfolder_warnings(folder.path, listing, listed)
        unlisted = unlisted_media(folder.path, listing, spec.caption_ext)
        report["unlisted"] += unlisted
        candidates += len(unlisted)
    pairing.finish()
    report["unreadable"] = [u.reason for u in unreadable]
    report["videos"] = videos
    fill = {"ext": spec.caption_ext, "res": spec.resolution, "limit": (Image.MAX_IMAGE_PIXELS or 0) // 1_000_000,
            "max_caption": MAX_CAPTION_CHARS, "aspect_fix": aspect_advice(spec),
            "need": fr.clip_need(spec), "fps": fr.fps_text(fr.sampling_fps(spec)),
            "vfr_effect": fr.variable_effect(spec)}
    notice = merged_buckets_notice(spec.resolutions, spec.aspect_ratios, spec.bucket_multiple)
    warnings, rows = grouped_report(report, fill, {"buckets_merged": [notice] if notice else [],
                                                   "subfolder": subfolder_notes})
    missing = report["missing"]
    return ScanResult(tuple(items), MissingCaptions(len(missing), tuple(missing[:EXAMPLES_SHOWN])),
                      tuple(unreadable), tuple(warnings), tuple(videos),
                      {k: v for k, v in pairing.counts.items() if spec.mask_folder or spec.control_folder},
                      rows, candidates - len(items), rates)


def validate(spec: DatasetSpec) -> ScanResult:
    """Check the spec and scan it; raise DatasetError for anything that makes training impossible."""
    spec.check()
    for folder in spec.folders:
        listing = _list_folder(folder.path)
        if not listing.images and not (spec.clip_lengths and listing.videos):
            pairs = (spec.mask_folder, spec.control_folder)
            raise DatasetError(_no_images_message(folder.path, listing, media_subfolders(folder.path, listing, pairs),
                                                  unlisted_media(folder.path, listing, spec.caption_ext)))
    result = scan_dataset(spec)
    if not result.items and (result.pair_counts.get("control_skipped") or result.pair_counts.get("mask_skipped")):
        raise DatasetError("no image of the dataset has a usable control image / mask, so there is nothing to train "
                           "on: " + " ".join(w for w in result.warnings if "mask" in w or "control" in w))
    if not result.items:
        # other reasons than unreadable files: short videos, animated images in a video dataset, videos...
        skipped = [w for w in result.warnings if ("skipped" in w or "video" in w) and "cannot be read and are" not in w]
        if skipped:
            unreadable = [f"{len(result.unreadable)} file(s) cannot be read: "
                          f"{_examples([u.reason for u in result.unreadable])}."] if result.unreadable else []
            raise DatasetError("no file of the dataset can be trained on, every one is skipped: " +
                               " ".join(skipped + unreadable))
        raise DatasetError(f"none of the dataset's {len(result.unreadable)} image file(s) can be read, so there is "
                           "nothing to train on: " + _examples([u.reason for u in result.unreadable]) + ".")
    return result


def cache_entries(spec: DatasetSpec, items) -> list[tuple[DatasetItem, tuple[int, int]]]:
    """What the cache holds, in order: each image once per resolution, at its bucket's (width, height); a
    video once per clip (clip_mode) and resolution, the entry's item holding that clip's start only.

    With the default settings this is one square entry per image, so the cache index equals the
    scan index (caches written before buckets existed stay valid).
    """
    return [(clip, size) for item in items for clip in _clips(item) for size in spec.sizes_for(item.width, item.height)]


def _clips(item: DatasetItem) -> list[DatasetItem]:
    """The item once per clip (an image, or a video with one clip: itself)."""
    if len(item.clip_starts) <= 1:
        return [item]
    return [dataclasses.replace(item, clip_starts=(start,)) for start in item.clip_starts]


def relative_source(spec: DatasetSpec, path: str) -> str:
    """Item path relative to the first folder (where the cache lives), with '/' separators.

    Relative, so moving the whole dataset folder keeps its cache valid.
    """
    try:
        rel = os.path.relpath(path, spec.folders[0].path)
    except ValueError:  # Windows: another drive; the absolute path is the only stable name
        rel = path
    return Path(rel).as_posix()
