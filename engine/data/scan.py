"""Image datasets: the spec the LoadDataset node outputs, the folder scan and its report. The spec's
dataclasses (DatasetSpec, FolderSpec) live in engine/data/dataset_spec.py and are re-exported here.

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

from PIL import Image

from . import frame_rates as fr
from .buckets import merged_buckets_notice
from .captions import MAX_CAPTION_CHARS, read_caption
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

# the spec's dataclasses and their checks: engine/data/dataset_spec.py (re-exported here)
from .dataset_spec import (  # noqa: E402,F401 - names this module has always given
    DATASET_SPEC_VERSION,
    MAX_RESOLUTION,
    MIN_RESOLUTION,
    RESOLUTION_STEP,
    DatasetSpec,
    FolderSpec,
    _known_fields,
)


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
    uncaptioned: set[str] = set()  # "image(s)" / "video(s)": what the missing-caption warning names
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
                uncaptioned.add("video(s)" if frames else "image(s)")
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
            "vfr_effect": fr.variable_effect(spec), "uncaptioned": " and ".join(sorted(uncaptioned)) or "image(s)"}
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
