"""The dataset scan's messages: DatasetError, the grouped warnings (kind, template) in the order
they are shown, what one usable image adds to them (`note_image`), and the error for a folder
without usable images.

Templates take {n} (how many files), {examples} (the first few names) and the fill values
engine/data/scan.py passes ({ext}, {res}, {limit}, {need}, {fps}, {vfr_effect}, {uncaptioned}). Each says what happened and the fix.
"""
from __future__ import annotations

import os
import re

from .buckets import bucket_sizes, kept_fraction, upscale_factor
from .images import IMAGE_EXTENSIONS, UNSUPPORTED_IMAGE_FORMATS, FolderListing

EXAMPLES_SHOWN = 5  # how many file names an error or warning lists before "... and N more"


class DatasetError(ValueError):
    """A dataset problem the user can fix. The message names the folder/file and the fix."""

# Grouped warnings, in this order: (kind, template with {n} and {examples}).
WARNINGS = (
    ("unreadable", "{n} file(s) cannot be read and are skipped: {examples}"),
    ("videos", "{n} video file(s) are skipped: set LoadDataset's 'video_frames' (e.g. 17 for Wan) to train on "
               "them: {examples}"),
    ("short", "{n} video(s) are shorter than one clip ({need}) and are skipped: lower video_frames "
              "(or the shortest of frame_buckets) or frame_stride, or remove them: {examples}"),
    # frame rates (engine/data/frame_rates.py)
    ("fps_far", "{n} video(s) run at a frame rate far from target_fps {fps} (more than twice or less than half of "
                "it); their frames are picked by timestamp, which skips most frames of a fast clip and repeats "
                "frames of a slow one: check they are the clips you mean, or convert them near {fps}: {examples}"),
    ("fps_variable", "{n} video(s) have a variable frame rate (phone and screen recordings often do); "
                     "{vfr_effect}: {examples}"),
    ("unsupported", "{n} file(s) are in a format PipeTrain cannot read and are skipped: {examples}"),
    ("unlisted", "{n} file(s) hold an image or a video but their name lacks a known extension, so they are "
                 "skipped: rename them: {examples}"),
    ("hidden", "{n} hidden file(s) (names starting with '.') are skipped; rename them without the leading dot to "
               "train on them: {examples}"),
    ("outside_link", "{n} file(s) are links to a file outside their folder and are skipped (a linked mask or "
                     "control image skips its image): copy the files into the folder, or turn on LoadDataset's "
                     "follow_links if you trust where they point: {examples}"),
    ("caption_link", "{n} caption file(s) are links to a file outside their folder and are not read; their images "
                     "train with the empty caption: copy the captions into the folder, or turn on LoadDataset's "
                     "follow_links if you trust where they point: {examples}"),
    ("missing", "{n} {uncaptioned} have no caption file ({ext}); they train with the empty caption: {examples}"),
    ("caption_unreadable", "{n} caption file(s) cannot be read; their images train with the empty caption: "
                           "{examples}"),
    ("caption_binary", "{n} caption file(s) hold binary data, not text (a picture or document saved under the "
                       "caption's name?); their images train with the empty caption: replace them with UTF-8 text "
                       "files: {examples}"),
    ("caption_long", "{n} caption file(s) are longer than {max_caption} characters (a log or document saved under "
                     "an image's name?); only their first {max_caption} characters are used, which is far more than "
                     "any text encoder reads: shorten them: {examples}"),
    ("caption_other_ext", "{n} image(s) have no {ext} caption but a text file with their name and another "
                          "extension, which is not read: rename those to {ext} (the caption of a.png is a{ext}): "
                          "{examples}"),
    ("empty_caption", "{n} caption file(s) are empty; their images train with the empty caption: {examples}"),
    ("not_utf8", "{n} caption file(s) are not UTF-8 and were read as Windows-1252/Latin-1; check that accents look "
                 "right, then save them as UTF-8: {examples}"),
    ("utf16_no_bom", "{n} caption file(s) look like UTF-16 without a byte-order mark and were read as such; save "
                     "them as UTF-8: {examples}"),
    ("caption_unused", "{n} caption file(s) ({ext}) match no image and are unused (the caption of a.png is a{ext}); "
                       "check the names: {examples}"),
    ("caption_case", "{n} caption file(s) match their image only when ignoring upper/lower case (or accents stored "
                     "differently, as macOS does) and are used: "
                     "{examples}"),
    ("shared_caption", "{n} caption file(s) are shared by images with the same name and different extensions; every "
                       "one of those images trains with it (give each its own name and caption if they differ): "
                       "{examples}"),
    ("animated", "{n} animated image(s): only the first frame is trained (save them as MP4/WebM and set "
                 "video_frames to train on motion): "
                 "{examples}"),
    ("animated_video", "{n} animated image(s) are skipped because video_frames is set: PipeTrain reads motion only "
                       "from video files (MP4, WebM, MOV, MKV...). Convert them (e.g. ffmpeg -i a.gif a.mp4), or set "
                       "video_frames to 0 to train their first frame as a still image: {examples}"),
    ("small", "{n} file(s) are smaller than the resolution ({res}) on their shorter side and are upscaled, which "
              "looks blurry to the model; use larger images or a lower resolution: {examples}"),
    ("aspect", "{n} file(s) are more than 3 times wider than tall (or taller than wide) for their bucket; only the "
               "center part of that shape is trained, so crop them yourself to choose what is kept, or {aspect_fix}: "
               "{examples}"),
    # mask_folder / control_folder (engine/data/pairs.py)
    ("mask_missing", "{n} image(s) have no mask in mask_folder (the mask of a.png is a.<any image extension>); they "
                     "train unmasked: {examples}"),
    ("mask_video", "{n} mask(s) are video files, which are not read as masks, so their items are skipped: a video's "
                   "mask is one still image (PNG) applied to every frame; replace the video mask by an image with the "
                   "same name, or delete it to train unmasked: {examples}"),
    ("mask_resized", "{n} mask(s) differ in size from their image and are stretched to the image's size before its "
                     "crop; check that they still line up: {examples}"),
    ("mask_unreadable", "{n} mask(s) cannot be read, so their images are skipped (training them unmasked would train "
                        "what the mask hides): re-export the mask as PNG, or delete it to train unmasked: {examples}"),
    ("control_missing", "{n} image(s) have no control image in control_folder and are skipped (an edit pair needs "
                        "both): add a control image with the same name (any image extension), or remove the image: "
                        "{examples}"),
    ("control_unreadable", "{n} control image(s) cannot be read, so their images are skipped: re-export them as PNG "
                           "or JPEG: {examples}"),
    ("control_aspect", "{n} control image(s) have another aspect ratio than their image; they are cropped to the "
                       "image's training size, so their edges are cut: crop them like the image: {examples}"),
    ("pair_ambiguous", "{n} image(s) have several masks or control images with their name; the first is used, "
                       "delete the others: {examples}"),
    ("pair_unused", "{n} file(s) in mask_folder / control_folder match no dataset image and are unused (the mask or "
                    "control image of a.jpg is named a, with any image extension): {examples}"),
    ("huge", "{n} image(s) are over Pillow's decompression-bomb warning limit ({limit} megapixels); they load, but "
             "slowly and with a lot of memory: downscale them to speed up caching: {examples}"),
)


# The kinds whose files are not trained, in the words of the node's summary ("3 file(s) skipped: ...").
SKIP_LABELS = {
    "unreadable": "unreadable", "videos": "video(s) while video_frames is 0", "short": "video(s) shorter than a clip",
    "unsupported": "in a format PipeTrain cannot read", "unlisted": "without a media extension", "hidden": "hidden",
    "outside_link": "link(s) leaving their folder", "animated_video": "animated image(s) while video_frames is set",
    "mask_video": "with a video as mask", "mask_unreadable": "with an unreadable mask",
    "control_missing": "without a control image", "control_unreadable": "with an unreadable control image",
}
ReportRow = tuple  # (kind, how many, the first EXAMPLES_SHOWN names or notes)


def grouped_report(report: dict[str, list[str]], fill: dict, notes: dict[str, list[str]]
                   ) -> tuple[list[str], tuple[ReportRow, ...]]:
    """(the warnings to show, one row per reason) from the scan's lists by kind, plus `notes`: kinds
    whose entries are whole sentences already (subfolders, merged buckets)."""
    warnings, rows = [], []
    for kind, template in WARNINGS:
        if report[kind]:
            warnings.append(template.format(n=len(report[kind]), examples=examples(report[kind]), **fill))
            rows.append((kind, len(report[kind]), tuple(report[kind][:EXAMPLES_SHOWN])))
    for kind, texts in notes.items():
        if texts:
            warnings += texts
            rows.append((kind, len(texts), tuple(texts[:EXAMPLES_SHOWN])))
    return warnings, tuple(rows)


def skipped_text(rows: tuple[ReportRow, ...]) -> str:
    """'1 video(s) shorter than a clip, 1 animated image(s) while video_frames is set' for the summary."""
    return ", ".join(f"{n} {SKIP_LABELS[kind]}" for kind, n, _ in rows if kind in SKIP_LABELS)


def aspect_advice(spec) -> str:
    """The end of the crop warning: what would keep more of such images with these bucket settings."""
    if not spec.aspect_ratios:
        return "set aspect_ratios (e.g. 'auto', or ratios as wide as theirs such as '3:1, 1:3')"
    if len(bucket_sizes(spec.resolution, spec.aspect_ratios, spec.bucket_multiple)) < len(spec.aspect_ratios):
        return ("give the aspect ratios room: at this resolution and bucket_multiple they round to fewer shapes "
                "(see the notice on merged buckets), so lower bucket_multiple or raise the resolution")
    return "add ratios as wide as theirs to aspect_ratios (e.g. '3:1, 1:3')"


def examples(names: list[str]) -> str:
    shown = "; ".join(names[:EXAMPLES_SHOWN])
    more = len(names) - EXAMPLES_SHOWN
    return shown + (f" ... and {more} more" if more > 0 else "")


def no_images_message(folder: str, listing: FolderListing, subfolders: list[str] = (),
                      unlisted: list[str] = ()) -> str:
    """Why `folder` trains nothing; `subfolders` hold images, `unlisted` are media named without an
    image extension (engine/data/folders.py finds both)."""
    join = lambda names: examples([os.path.join(folder, n) for n in names])  # noqa: E731
    if listing.videos:
        return (f"dataset folder {folder} holds only videos ({len(listing.videos)}: {join(listing.videos)}), and "
                "video_frames is 0 so videos are skipped: set LoadDataset's 'video_frames' to the clip length your "
                "model needs (e.g. 17 for Wan), or extract frames as PNG/JPEG.")
    if listing.unsupported:
        found = examples([f"{os.path.join(folder, n)} ({UNSUPPORTED_IMAGE_FORMATS[os.path.splitext(n)[1].lower()]})"
                          for n in listing.unsupported])
        return f"dataset folder {folder} has no images PipeTrain can read: {found}."
    if listing.hidden:
        return (f"dataset folder {folder} has only hidden images (names starting with '.', which are skipped): "
                f"{join(listing.hidden)}. Rename them without the leading dot.")
    if unlisted:
        return (f"dataset folder {folder} has no file with an image extension, but {len(unlisted)} file(s) hold "
                f"images or videos: {examples(list(unlisted))}.")
    if subfolders:
        return (f"dataset folder {folder} has no images of its own, but {len(subfolders)} subfolder(s) do, and "
                "subfolders are not scanned: list each one as its own line in LoadDataset's 'folders', e.g. "
                f"{folder_lines(list(subfolders))}.")
    return (f"dataset folder {folder} has no images: add files with one of the extensions "
            f"{', '.join(IMAGE_EXTENSIONS)}, or remove the folder from 'folders'.")


def folder_lines(subfolders: list[str]) -> str:
    """'folders' lines for subfolders; kohya-style names (10_cat) keep their repeats as ' | repeats=10'."""
    lines = []
    for sub in subfolders[:3]:
        m = re.match(r"^(\d+)_", os.path.basename(sub))
        lines.append(sub + (f" | repeats={int(m.group(1))}" if m and int(m.group(1)) >= 1 else ""))
    return "; ".join(lines) + (" ..." if len(subfolders) > 3 else "")


def note_image(report: dict[str, list[str]], path: str, info, spec) -> None:
    """Add what the scan says about one usable image or video (`spec`: its DatasetSpec) to `report`."""
    w, h = info.width, info.height
    if getattr(info, "animated", False):
        report["animated"].append(path)
    sizes = spec.sizes_for(w, h)
    if upscale_factor(w, h, sizes[0]) > 1:  # sizes[0]: the main resolution
        report["small"].append(f"{path} ({w}x{h})")
    kept = kept_fraction(w, h, sizes[0])
    if kept < 1 / 3:
        into = f" into {sizes[0][0]}x{sizes[0][1]}" if spec.aspect_ratios else ""
        report["aspect"].append(f"{path} ({w}x{h}{into}, {100 * kept:.1f}% of the picture kept)")
    if getattr(info, "huge", False):
        report["huge"].append(f"{path} ({w}x{h})")
