"""Dataset files on disk: a folder's entries by kind (`list_folder`), one image (`probe_image` reads
headers only, `load_image` the pixels for the VAE); a caption's text is engine/data/captions.py.

Pure Pillow + numpy. Every failure becomes an ImageReadError whose message names the file, says
what is wrong with it in plain words and what to do, because the user meets these messages in
ComfyUI's console or error box, far from any traceback.

Policies (the dataset scan reports every image they touch, so nothing happens silently):
- Alpha is composited over WHITE. Cut-outs and logos are drawn to be seen on a light page;
  dropping alpha instead keeps whatever colour the hidden pixels have (often black fringes).
- Animated GIF/WebP/PNG: the first frame is trained, like a still image. MPO (a phone photo
  with a depth map or gain map stored after it) is a still: its main picture is the first.
- EXIF orientation is applied (phone photos store rotation in EXIF, not in pixels).
- Non-square: the centered square is cut out, then resized to resolution x resolution. Cropping
  first (as a resize box) keeps a 4000x16 strip from becoming a 128000x512 intermediate.
- Smaller than the resolution: upscaled with LANCZOS (blurry, but kept: dropping it would
  silently shrink the dataset).
- 16-bit gray keeps its precision through the resize. Integer values are read as 0..65535 and
  float ('F') values as 0..1, unless the image's maximum is higher: then it is divided by its
  maximum. Negative values become 0.
- Pillow's decompression-bomb limit stays on: an image over 2x Image.MAX_IMAGE_PIXELS is refused
  with its size and the fix (downscale it); one over 1x loads, and the scan warns.
"""
from __future__ import annotations

import os
import re
import stat
import unicodedata
import warnings
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError, features

from .png_chunks import png_has_exif

# Bump whenever load_image's output for the same file changes (resize filter, alpha policy...):
# it is part of the cache fingerprint, so old latents are not silently reused.
# 2: the center square is cut before resizing (resize box), not after.
# 3: videos with rotation metadata are turned upright (engine/data/video.py); captions cut, NULs removed.
# 4: transparent video frames are composited over white, like images.
PREPROCESS_VERSION = 4
_AVIF = bool(features.check("avif"))
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".jfif", ".webp", ".bmp", ".tif", ".tiff", ".gif") + \
    ((".avif",) if _AVIF else ())
# Listed so they are counted and reported; video training comes later (issue 3).
VIDEO_EXTENSIONS = (".mp4", ".webm", ".mov", ".mkv", ".avi", ".m4v", ".wmv", ".flv", ".mpg", ".mpeg", ".3gp")
# Image formats Pillow cannot read here, with what to do about each.
_CONVERT = "convert it to PNG or JPEG"
UNSUPPORTED_IMAGE_FORMATS = {
    ".svg": "SVG is a vector format: export it as PNG at the training size or larger",
    ".heic": f"HEIC (iPhone photos) needs a plugin this Pillow does not have: {_CONVERT} (iPhone: "
             "Settings > Camera > Formats > Most Compatible)",
    ".heif": f"HEIF needs a plugin this Pillow does not have: {_CONVERT}",
    ".jxl": f"JPEG XL is not supported by this Pillow: {_CONVERT}",
    ".psd": "Photoshop files are not read: export a flattened PNG",
    ".eps": "EPS/PostScript drawings are not read: export it as PNG at the training size or larger",
    ".exr": "OpenEXR (HDR) is not read: tone-map it and save as PNG",
    ".hdr": "Radiance HDR is not read: tone-map it and save as PNG",
    ".dng": f"camera RAW files are not read: develop and {_CONVERT}",
    ".cr2": f"camera RAW files are not read: develop and {_CONVERT}",
    ".nef": f"camera RAW files are not read: develop and {_CONVERT}",
    ".arw": f"camera RAW files are not read: develop and {_CONVERT}",
    **({} if _AVIF else {".avif": f"this Pillow was built without AVIF support: {_CONVERT} or update Pillow"}),
    # image formats Pillow may read but PipeTrain does not list: reported instead of ignored silently
    **{ext: f"{ext} images are not read by PipeTrain: {_CONVERT}" for ext in (
        ".tga", ".ppm", ".pgm", ".pbm", ".pnm", ".jp2", ".j2k", ".jpx", ".ico", ".dds", ".pcx", ".jxr", ".jpe",
        ".xcf", ".raw")},
}
_HIGH_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")  # all single-channel in Pillow
_ROTATED_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that swap width and height
_NEVER_OPEN = ("EPS",)  # Pillow formats not opened (open_image says why)
_JPEG_TAIL = 64 * 1024  # a whole JPEG ends with FFD9 (end of image); metadata trailers may follow


class ImageReadError(ValueError):
    """An image file that cannot be used; the message names it and says what to do."""


@dataclass(frozen=True)
class ImageInfo:
    width: int  # as displayed: EXIF rotation applied
    height: int
    mode: str
    format: str
    animated: bool
    huge: bool  # over Pillow's decompression-bomb warning limit: loads, but slowly and with much memory


def _megapixels(pixels: float) -> str:
    return f"{pixels / 1e6:.0f} megapixels"


def _sniff(path: str) -> str | None:
    """What a file that Pillow does not recognise really is, from its first bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    low = head.lower().lstrip()
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"heic", b"heix", b"mif1", b"msf1", b"hevc"):
            return "a HEIC/HEIF photo"
        if brand in (b"avif", b"avis"):
            return "an AVIF image"
        return "a video (MP4/MOV); rename it with its video extension and set video_frames"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "a video (WebM/MKV); rename it with its video extension and set video_frames"
    if head.startswith(b"RIFF") and head[8:12] == b"AVI ":
        return "a video (AVI); rename it with its video extension and set video_frames"
    if low.startswith((b"<!doctype html", b"<html")):
        return "a web page (HTML), probably a failed download"
    if low.startswith(b"<svg") or (low.startswith(b"<?xml") and b"<svg" in low):
        return "an SVG drawing"
    if head.startswith(b"%PDF"):
        return "a PDF document"
    if head.startswith((b"%!PS", b"\xc5\xd0\xd3\xc6")):
        return "a PostScript/EPS drawing"
    return None


def _riff_cut_off(path: str) -> bool:
    """A WebP (RIFF) file shorter than its header says: Pillow only reports a decoder failure."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    return head[:4] == b"RIFF" and head[8:12] == b"WEBP" and int.from_bytes(head[4:8], "little") + 8 > size


def describe_error(path: str, exc: BaseException) -> str:
    """Turn whatever Pillow or the OS raised for `path` into a message that says what to do."""
    ext = os.path.splitext(path)[1].lower() or "(no extension)"
    if isinstance(exc, Image.DecompressionBombError):
        m = re.search(r"\((\d+) pixels\)", str(exc))
        size = _megapixels(int(m.group(1))) if m else "too many pixels"
        limit = _megapixels(2 * (Image.MAX_IMAGE_PIXELS or 0))
        return (f"{path} is {size}, over Pillow's decompression-bomb safety limit of {limit}: downscale it "
                "(training only uses the resolution you set) or remove it")
    if isinstance(exc, PermissionError):
        return f"{path} cannot be opened (permission denied): make it readable for the user running ComfyUI"
    if isinstance(exc, UnidentifiedImageError):
        what = _sniff(path)
        if what:
            return f"{path} is really {what}, not a {ext} image: replace it with a PNG or JPEG, or remove it"
        return (f"{path} is not an image Pillow can read (the content does not match the {ext} name, or the format "
                "is unknown): re-export it as PNG or JPEG, or remove it")
    text = str(exc)
    if "truncated" in text.lower() or isinstance(exc, EOFError) or _riff_cut_off(path):
        return (f"{path} is cut off (truncated: {text or type(exc).__name__}): copy it again from the original "
                "or re-export it")
    if isinstance(exc, MemoryError):
        return f"{path} is too large to decode in the memory available: downscale it"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{path} cannot be read ({exc.strerror or text}): check the file and the disk"
    reason = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return f"{path} is damaged or unsupported ({reason}): re-export it as PNG or JPEG, or remove it"


def _check_file(path: str) -> None:
    """Raise ImageReadError for names that are not regular, non-empty files."""
    try:
        st = os.stat(path)
    except OSError as e:
        if os.path.islink(path):
            raise ImageReadError(f"{path} is a broken link (its target {os.readlink(path)!r} cannot be opened: "
                                 f"{e.strerror}): fix the link or delete it") from None
        raise ImageReadError(describe_error(path, e)) from None
    if stat.S_ISDIR(st.st_mode):
        raise ImageReadError(f"{path} is a folder, not an image file (subfolders are not scanned): rename it so it "
                             "does not end in an image extension, or list it as its own folder line")
    if not stat.S_ISREG(st.st_mode):
        raise ImageReadError(f"{path} is not a regular file (a pipe, socket or device): remove it from the folder")
    if st.st_size == 0:
        raise ImageReadError(f"{path} is empty (0 bytes): copy it again from the original, or delete it")


def _jpeg_complete(path: str) -> bool:
    """Whether the tail holds an end marker (FFD9) after the last start of scan (FFDA): in a small
    file cut off mid-picture the tail also holds the EXIF thumbnail's end marker, before the scan."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - _JPEG_TAIL))
        tail = f.read()
    return tail.rfind(b"\xff\xd9") > max(-1, tail.rfind(b"\xff\xda"))


def open_image(path: str) -> Image.Image:
    """Image.open for dataset files, without Pillow's EPS reader: it runs Ghostscript (an external
    program) on the file, which a training dataset never needs; such files are described instead."""
    Image.init()  # every plugin registered, so Image.ID lists them all
    return Image.open(path, formats=[f for f in Image.ID if f not in _NEVER_OPEN])


def _displayed_size(im: Image.Image) -> tuple[int, int]:
    """(width, height) as load_image shows it: EXIF orientations 5-8 swap the sides."""
    if im.format == "PNG" and "exif" not in im.info and not png_has_exif(im.filename):
        return (im.width, im.height)  # no EXIF: getexif() would decode every pixel to look for it
    try:
        turned = im.getexif().get(0x0112) in _ROTATED_ORIENTATIONS
    except Exception:  # noqa: BLE001 - damaged EXIF: load_image keeps the stored orientation too
        turned = False
    return (im.height, im.width) if turned else (im.width, im.height)


def probe_image(path: str) -> ImageInfo:
    """Check that `path` is a readable image without decoding its pixels (the cheap dataset scan).

    Pillow's verify() walks PNG chunks and CRCs. For a JPEG (whose verify checks nothing) a
    missing end marker means a cut-off download, so only such files are decoded, at 1/8 scale.
    Other formats (TIFF, BMP, GIF, WebP) have no cheap check and are decoded (the first frame).
    """
    _check_file(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", Image.DecompressionBombWarning)
        try:
            with open_image(path) as im:
                mode, fmt = im.mode, im.format or "?"
                # MPO: a phone photo with extra pictures (depth map, HDR gain map), not an animation
                animated = bool(getattr(im, "is_animated", False)) and fmt != "MPO"
                width, height = _displayed_size(im)
            with open_image(path) as im:  # verify() leaves the image unusable: open it again
                im.verify()
            if fmt in ("JPEG", "MPO"):
                if not _jpeg_complete(path):
                    with open_image(path) as im:
                        im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
                        im.load()
            elif fmt != "PNG":
                with open_image(path) as im:
                    im.load()
                    width, height = _displayed_size(im)  # TIFF: Pillow turns it upright while loading
        except ImageReadError:
            raise
        except Exception as e:  # Pillow raises many types (OSError, SyntaxError, ValueError, struct.error...)
            raise ImageReadError(describe_error(path, e)) from None
    huge = any(issubclass(w.category, Image.DecompressionBombWarning) for w in caught)
    return ImageInfo(width, height, mode, fmt, animated, huge)


# ---- folders ------------------------------------------------------------------------------

@dataclass
class FolderListing:
    """One folder's entries by kind, names sorted the same on case-(in)sensitive file systems."""
    images: list[str] = field(default_factory=list)  # any entry with an image extension; the probe judges it
    videos: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)  # hidden images/videos (macOS '._' companions excluded)
    subfolders: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # any other name (captions, notes, 'photo', 'a.jpg_large'...)
    by_casefold: dict[str, list[str]] = field(default_factory=dict)  # every name by name_key, for caption lookup


def list_folder(folder: str) -> FolderListing:
    """Sort one folder's names by kind (not recursive). OSError from listing it propagates."""
    # casefold first so the order is the same on case-(in)sensitive file systems; name breaks ties
    names = sorted(os.listdir(folder), key=lambda n: (n.casefold(), n))
    out = FolderListing()
    for name in names:
        out.by_casefold.setdefault(name_key(name), []).append(name)
        ext = os.path.splitext(name)[1].lower()
        if name.startswith("."):
            if ext in IMAGE_EXTENSIONS + VIDEO_EXTENSIONS and not name.startswith("._"):
                out.hidden.append(name)
        elif ext in IMAGE_EXTENSIONS:
            out.images.append(name)
        elif ext in VIDEO_EXTENSIONS:
            out.videos.append(name)
        elif ext in UNSUPPORTED_IMAGE_FORMATS:
            out.unsupported.append(name)
        elif os.path.isdir(os.path.join(folder, name)):
            out.subfolders.append(name)
        else:
            out.other.append(name)
    return out


def name_key(name: str) -> str:
    """A file name for matching: case-folded and in Unicode NFC, so 'café' typed on macOS (NFD,
    decomposed accents) finds 'café' written on Linux or Windows (NFC)."""
    return unicodedata.normalize("NFC", name).casefold()


def caption_name(listing: FolderListing, image_name: str, caption_ext: str) -> str | None:
    """The caption file's name: exact, else the one name equal ignoring case (A.TXT from Windows)
    and Unicode normalization (NFC/NFD)."""
    wanted = os.path.splitext(image_name)[0] + caption_ext
    matches = listing.by_casefold.get(name_key(wanted), [])
    if wanted in matches:
        return wanted
    return matches[0] if len(matches) == 1 else None


# ---- loading one image for the VAE ---------------------------------------------------------

def load_image(path: str, resolution: int | tuple[int, int]) -> np.ndarray:
    """Decode, orient, convert to RGB, cut the center part of the target's shape, resize it.

    `resolution` is a side length (a square) or a (width, height) bucket (engine/data/buckets.py).
    Returns float32 [height, width, 3] in 0..1 (ComfyUI's IMAGE layout without batch).
    Raises ImageReadError (message names the file and the fix) for anything that fails.
    """
    _check_file(path)  # outside the try: its messages already name the file
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the scan already reported it
            warnings.simplefilter("ignore", UserWarning)  # "Corrupt EXIF data": the orientation is kept as stored
            with open_image(path) as im:
                return _decode(im, resolution)
    except ImageReadError as e:  # raised by _decode, which does not know the path
        raise ImageReadError(f"{path} {e}") from None
    except Exception as e:
        raise ImageReadError(describe_error(path, e)) from None


def _decode(im: Image.Image, resolution: int | tuple[int, int]) -> np.ndarray:
    size = (resolution, resolution) if isinstance(resolution, int) else tuple(resolution)
    im.seek(0)  # animated GIF/WebP/PNG: the first frame
    if im.format == "JPEG":
        # decode at a reduced scale (still >= the target on both sides): big photos load fast
        im.draft("RGB", (max(size), max(size)))
    im.load()  # decode errors must surface here, not inside the EXIF step's fallback below
    try:
        im = ImageOps.exif_transpose(im)
    except Exception:  # damaged EXIF: keep the stored orientation rather than fail the image
        pass
    if im.mode in _HIGH_BIT_MODES:
        # float planes keep 16-bit precision through the resize instead of rounding to 8 bits
        plane = _resize_crop(_high_bit_to_float(im), size)
        arr = np.repeat(np.asarray(plane, dtype=np.float32)[..., None], 3, axis=-1)
    else:
        arr = np.asarray(_resize_crop(_to_rgb8(im), size), dtype=np.float32) / 255.0
    # LANCZOS overshoots a little around hard edges; the VAE expects 0..1
    return np.clip(arr, 0.0, 1.0)


def _high_bit_to_float(im: Image.Image) -> Image.Image:
    """16/32-bit integer or float grayscale as an 'F' image in 0..1 (scaling rule: module doc)."""
    arr = np.asarray(im, dtype=np.float64)
    arr = np.nan_to_num(arr, nan=0.0, posinf=0.0, neginf=0.0)
    full = 1.0 if im.mode == "F" else 65535.0
    peak = float(arr.max()) if arr.size else 0.0
    arr = arr / (peak if peak > full else full)
    return Image.fromarray(np.clip(arr, 0.0, 1.0).astype(np.float32), mode="F")


def _to_rgb8(im: Image.Image) -> Image.Image:
    """8-bit RGB from any other mode; transparency is composited over white (see module doc)."""
    try:
        if im.mode == "P" and "transparency" not in im.info:
            return im.convert("RGB")
        if im.mode in ("RGBA", "LA", "PA", "P", "RGBa", "La") or "transparency" in im.info:
            rgba = im.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, rgba).convert("RGB")
        return im if im.mode == "RGB" else im.convert("RGB")  # L, 1, CMYK, YCbCr, LAB, HSV
    except ValueError as e:  # "conversion from X to RGB not supported"
        raise ImageReadError(f"has colour mode {im.mode}, which cannot be converted to RGB ({e}): re-export "
                             "it as 8-bit RGB PNG or JPEG") from None


def _resize_crop(im: Image.Image, size: tuple[int, int]) -> Image.Image:
    w, h = im.size
    tw, th = size
    # the largest centered box of the target's aspect ratio (a square for tw == th)
    if w * th >= h * tw:
        cw, ch = h * tw / th, h
    else:
        cw, ch = w, w * th / tw
    if (cw, ch) == (tw, th):  # already the right size: a plain crop, no resampling
        left, top = (w - tw) // 2, (h - th) // 2
        return im.crop((left, top, left + tw, top + th))
    left, top = (w - cw) / 2, (h - ch) / 2
    # The box selects the center part in source pixels; the filter still reads the pixels just
    # outside it, so the result matches resizing the whole image and cropping afterwards.
    return im.resize((tw, th), Image.Resampling.LANCZOS, box=(left, top, left + cw, top + ch))
