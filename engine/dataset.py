"""Image datasets: the spec the LoadDataset node outputs, the folder scan, and image loading.

Pure Python + Pillow (no torch, no comfy), so the ComfyUI node validates a dataset without
touching the GPU and the engine can read the same spec in its own process.

Folder line syntax (the LoadDataset node's `folders` box, parsed by `parse_folder_lines`):
    one folder per line, optionally followed by `| repeats=N`:
        cats
        /data/dogs | repeats=3
        # a comment; blank lines are ignored too
    Relative folders are resolved against a base folder (ComfyUI's input folder). Surrounding
    quotes are removed, because "Copy as path" on Windows adds them.

Alpha: transparent images are composited over WHITE. Cut-outs, logos and illustrations are
usually drawn to be seen on a light page; dropping alpha instead keeps whatever colour the
hidden pixels happen to have (often black fringes or garbage), which the model would learn.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

DATASET_SPEC_VERSION = 1
# Bump whenever load_image's output for the same file changes (resize filter, alpha policy...):
# it is part of the cache fingerprint, so old latents are not silently reused.
PREPROCESS_VERSION = 1
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".jfif", ".webp", ".bmp", ".tif", ".tiff", ".gif")
MIN_RESOLUTION, MAX_RESOLUTION, RESOLUTION_STEP = 64, 4096, 64
EXAMPLES_SHOWN = 5  # how many file names an error or warning lists before "... and N more"


class DatasetError(ValueError):
    """A dataset problem the user can fix. The message names the folder/file and the fix."""


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

    def to_dict(self) -> dict[str, Any]:
        return {"folders": [f.to_dict() for f in self.folders], "resolution": self.resolution,
                "caption_ext": self.caption_ext, "version": self.version}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DatasetSpec":
        kw = _known_fields(cls, data, "dataset")
        if not isinstance(kw.get("version", DATASET_SPEC_VERSION), int):
            raise DatasetError(f"dataset.version must be a whole number, got {kw['version']!r}.")
        if kw.get("version", DATASET_SPEC_VERSION) > DATASET_SPEC_VERSION:
            raise DatasetError(f"dataset spec version {kw['version']} is newer than this PipeTrain understands "
                               f"({DATASET_SPEC_VERSION}): update PipeTrain.")
        kw["folders"] = tuple(FolderSpec.from_dict(f) for f in kw.get("folders", ()))
        return cls(**kw)

    def check(self) -> None:
        """Checks that need no disk access."""
        r = self.resolution
        if not (isinstance(r, int) and MIN_RESOLUTION <= r <= MAX_RESOLUTION and r % RESOLUTION_STEP == 0):
            raise DatasetError(f"resolution is {r}: use a multiple of {RESOLUTION_STEP} between {MIN_RESOLUTION} "
                               f"and {MAX_RESOLUTION} (e.g. 512 or 1024).")
        if not self.folders:
            raise DatasetError("no dataset folders given: enter at least one folder, one per line.")
        for f in self.folders:
            if not (isinstance(f.repeats, int) and f.repeats >= 1):
                raise DatasetError(f"repeats for folder {f.path} is {f.repeats}: use a whole number of 1 or more.")
        if not self.caption_ext.startswith("."):
            raise DatasetError(f"caption_ext is {self.caption_ext!r}: use an extension starting with '.', like '.txt'.")
        seen = set()
        for f in self.folders:
            key = os.path.normcase(os.path.abspath(f.path))
            if key in seen:
                raise DatasetError(f"folder {f.path} is listed twice: list it once and use '| repeats=N' "
                                   "to show it more often.")
            seen.add(key)


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
    """
    folders = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        repeats = default_repeats
        if "|" in line:
            # rpartition: the option part is after the LAST '|', so a '|' in a folder name still works
            path_part, _, opt = line.rpartition("|")
            opt = opt.strip().replace(" ", "")
            key, eq, value = opt.partition("=")
            if key.lower() != "repeats" or not eq or not value.isdigit() or int(value) < 1:
                raise DatasetError(f"folders line {lineno} ({line!r}): after '|' write 'repeats=N' with N a whole "
                                   "number of 1 or more, e.g. 'cats | repeats=3'.")
            repeats = int(value)
            line = path_part.strip()
        typed = line.strip().strip('"').strip("'")
        expanded = os.path.expanduser(typed)
        if os.path.isabs(expanded):
            path = expanded
            where = ""
        elif base_dir is None:
            raise DatasetError(f"folders line {lineno}: {typed!r} is a relative path but ComfyUI's input folder is "
                               "not known here: use an absolute path.")
        else:
            path = os.path.join(base_dir, expanded)
            where = f" (relative paths are looked up in ComfyUI's input folder {base_dir})"
        path = os.path.normpath(path)
        if not os.path.isdir(path):
            what = "is a file, not a folder" if os.path.exists(path) else "does not exist"
            raise DatasetError(f"dataset folder {path} {what}{where}: fix line {lineno} of 'folders', "
                               "or use an absolute path.")
        folders.append(FolderSpec(path=path, repeats=repeats))
    if not folders:
        raise DatasetError("no dataset folders given: enter at least one folder, one per line "
                           "(relative to ComfyUI's input folder, or absolute).")
    return tuple(folders)


# ---- scanning ------------------------------------------------------------------------------

@dataclass(frozen=True)
class DatasetItem:
    path: str
    caption: str | None  # None = no caption file (training uses the empty caption)
    repeats: int
    size_bytes: int
    mtime_ns: int


@dataclass(frozen=True)
class MissingCaptions:
    count: int
    examples: tuple[str, ...]  # the first few image paths without a caption file


@dataclass(frozen=True)
class UnreadableFile:
    path: str
    reason: str


@dataclass(frozen=True)
class ScanResult:
    items: tuple[DatasetItem, ...]
    missing_captions: MissingCaptions
    unreadable: tuple[UnreadableFile, ...]
    warnings: tuple[str, ...]


def _media_files(folder: str) -> list[str]:
    """Image files of one folder (not recursive), hidden files excluded, in a stable order."""
    names = [n for n in os.listdir(folder)
             if not n.startswith(".") and n.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(os.path.join(folder, n))]
    # casefold first so the order is the same on case-(in)sensitive file systems; name breaks ties
    return sorted(names, key=lambda n: (n.casefold(), n))


def _caption_path(image_path: str, caption_ext: str) -> str:
    return os.path.splitext(image_path)[0] + caption_ext


def _check_folder_exists(folder: str) -> None:
    if not os.path.isdir(folder):
        raise DatasetError(f"dataset folder {folder} does not exist (or is not a folder): fix the path in LoadDataset's "
                           "'folders' (relative paths are looked up in ComfyUI's input folder).")


def files_signature(spec: DatasetSpec) -> str:
    """Hash of names, sizes and mtimes of images and captions; no file is opened (for IS_CHANGED)."""
    h = hashlib.sha256(repr((spec.resolution, spec.caption_ext)).encode())
    for folder in spec.folders:
        h.update(f"\0{folder.path}\0{folder.repeats}".encode())
        for name in _media_files(folder.path):
            for p in (os.path.join(folder.path, name), _caption_path(os.path.join(folder.path, name), spec.caption_ext)):
                try:
                    st = os.stat(p)
                    h.update(f"\0{p}\0{st.st_size}\0{st.st_mtime_ns}".encode())
                except OSError:
                    h.update(f"\0{p}\0-".encode())
    return h.hexdigest()


def _verify_image(path: str) -> str | None:
    """None if Pillow can decode the file's structure, else the reason.

    verify() walks the whole file (PNG chunk CRCs, truncation), which is cheap next to the VAE
    encode that follows; a file that fails here would otherwise crash the cache run halfway.
    """
    try:
        with Image.open(path) as im:
            im.verify()
    except Exception as e:  # Pillow raises many types (OSError, SyntaxError, ValueError, DecompressionBomb...)
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return None


def _read_caption(path: str, warnings: list[str]) -> str | None:
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: Notepad writes a BOM
            return f.read().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        warnings.append(f"caption {path} could not be read ({e}); the empty caption is used. Save it as UTF-8 text.")
        return ""


def scan_dataset(spec: DatasetSpec) -> ScanResult:
    """List every image of the dataset in a stable order; broken files are collected, not raised."""
    items: list[DatasetItem] = []
    unreadable: list[UnreadableFile] = []
    missing: list[str] = []
    warnings: list[str] = []
    for folder in spec.folders:
        _check_folder_exists(folder.path)
        for name in _media_files(folder.path):
            path = os.path.join(folder.path, name)
            reason = _verify_image(path)
            if reason is not None:
                unreadable.append(UnreadableFile(path, reason))
                continue
            caption = _read_caption(_caption_path(path, spec.caption_ext), warnings)
            if caption is None:
                missing.append(path)
            st = os.stat(path)
            items.append(DatasetItem(path, caption, folder.repeats, st.st_size, st.st_mtime_ns))
        warnings.extend(_subfolder_warnings(folder.path))
    if missing:
        warnings.append(f"{len(missing)} image(s) have no caption file ({spec.caption_ext}); the empty caption is used "
                        f"for them: {_examples(missing)}")
    if unreadable:
        warnings.append(f"{len(unreadable)} image(s) cannot be read and are skipped: "
                        + _examples([f"{u.path} ({u.reason})" for u in unreadable]))
    return ScanResult(tuple(items), MissingCaptions(len(missing), tuple(missing[:EXAMPLES_SHOWN])),
                      tuple(unreadable), tuple(warnings))


def _subfolder_warnings(folder: str) -> list[str]:
    """Subfolders are not scanned; say so when one holds images, so nothing is dropped silently."""
    out = []
    for name in sorted(os.listdir(folder)):
        sub = os.path.join(folder, name)
        if name.startswith(".") or not os.path.isdir(sub):
            continue
        try:
            has_media = bool(_media_files(sub))
        except OSError:
            continue
        if has_media:
            out.append(f"subfolder {sub} holds images but subfolders are not scanned: add it as its own line "
                       "in 'folders' if you want it.")
    return out


def _examples(names: list[str]) -> str:
    shown = ", ".join(names[:EXAMPLES_SHOWN])
    more = len(names) - EXAMPLES_SHOWN
    return shown + (f" ... and {more} more" if more > 0 else "")


def validate(spec: DatasetSpec) -> ScanResult:
    """Check the spec and scan it; raise DatasetError for anything that makes training impossible."""
    spec.check()
    for folder in spec.folders:
        _check_folder_exists(folder.path)
        if not _media_files(folder.path):
            raise DatasetError(f"dataset folder {folder.path} has no images: add files with one of the extensions "
                               f"{', '.join(IMAGE_EXTENSIONS)}, or remove the folder from 'folders'.")
    result = scan_dataset(spec)
    if not result.items:
        raise DatasetError("none of the dataset's images can be read: "
                           + _examples([f"{u.path} ({u.reason})" for u in result.unreadable])
                           + ". Re-export them as PNG or JPEG.")
    return result


# ---- loading one image for the VAE ---------------------------------------------------------

def load_image(path: str, resolution: int) -> np.ndarray:
    """Decode, orient, convert to RGB, resize shorter side to `resolution`, center crop square.

    Returns float32 [resolution, resolution, 3] in 0..1 (ComfyUI's IMAGE layout without batch).
    """
    with Image.open(path) as im:
        im.seek(0)  # animated GIF/WebP: the first frame
        if im.format == "JPEG":
            # decode at a reduced scale (still >= resolution on both sides): big photos load fast
            im.draft("RGB", (resolution, resolution))
        im = ImageOps.exif_transpose(im)  # phone photos store rotation in EXIF, not in pixels
        if im.mode in _HIGH_BIT_MODES:
            # float planes keep 16-bit precision through the resize instead of rounding to 8 bits
            plane = _resize_crop(_high_bit_to_float(im), resolution)
            arr = np.repeat(np.asarray(plane, dtype=np.float32)[..., None], 3, axis=-1)
        else:
            arr = np.asarray(_resize_crop(_to_rgb8(im), resolution), dtype=np.float32) / 255.0
    # LANCZOS overshoots a little around hard edges; the VAE expects 0..1
    return np.clip(arr, 0.0, 1.0)


_HIGH_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")  # all single-channel in Pillow


def _high_bit_to_float(im: Image.Image) -> Image.Image:
    """16-bit / 32-bit grayscale as an 'F' image in 0..1. 'I' from a 16-bit PNG holds 0..65535."""
    if im.mode == "F":
        return Image.fromarray(np.clip(np.asarray(im, dtype=np.float32), 0.0, 1.0), mode="F")
    arr = np.clip(np.asarray(im, dtype=np.float64) / 65535.0, 0.0, 1.0).astype(np.float32)
    return Image.fromarray(arr, mode="F")


def _to_rgb8(im: Image.Image) -> Image.Image:
    """8-bit RGB from any other mode; transparency is composited over white (see module doc)."""
    if im.mode == "P" and "transparency" not in im.info:
        return im.convert("RGB")
    if im.mode in ("RGBA", "LA", "PA", "P", "RGBa", "La") or "transparency" in im.info:
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return im if im.mode == "RGB" else im.convert("RGB")  # L, 1, CMYK, YCbCr, LAB, HSV


def _resize_crop(im: Image.Image, resolution: int) -> Image.Image:
    w, h = im.size
    scale = resolution / min(w, h)
    nw, nh = max(resolution, round(w * scale)), max(resolution, round(h * scale))
    if (nw, nh) != (w, h):
        im = im.resize((nw, nh), Image.Resampling.LANCZOS)
    left, top = (nw - resolution) // 2, (nh - resolution) // 2
    return im.crop((left, top, left + resolution, top + resolution))


def relative_source(spec: DatasetSpec, path: str) -> str:
    """Item path relative to the first folder (where the cache lives), with '/' separators.

    Relative, so moving the whole dataset folder keeps its cache valid.
    """
    try:
        rel = os.path.relpath(path, spec.folders[0].path)
    except ValueError:  # Windows: another drive; the absolute path is the only stable name
        rel = path
    return Path(rel).as_posix()
