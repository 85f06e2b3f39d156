"""Loss masks and control (reference) images, paired with the dataset's images by file name.

LoadDataset's optional `mask_folder` and `control_folder` each name one folder. The mask or
control image of `cats/a.png` is the image in that folder whose name without extension is `a`
(any image extension; the exact name first, else the one equal ignoring case). One folder
serves every dataset folder, so images of different dataset folders with the same name share it.

Policies (every case is listed by file name in the scan's warnings, engine/data/messages.py):
- no mask for an image: it trains unmasked.
- a mask whose size differs from its image: stretched to the image's size, then cropped and
  resized exactly like the image, so a mask of the same shape always lines up.
- a video's mask is one still image, applied to every frame of the clip (cached as [1, 1, h, w]
  and broadcast over the latent frames); a video file in mask_folder is not a mask: its item is
  skipped and listed, like an unreadable mask.
- an unreadable or empty mask: the image is skipped. Training it unmasked would train exactly
  what the mask was meant to hide; deleting the mask file is the way to train it unmasked.
- with a control folder, an image without a readable control image is skipped (an edit pair
  needs both). A control image is cropped and resized to its image's training size (bucket);
  one with another aspect ratio is listed, because its edges are cut.
- files in either folder that match no image are listed: usually a naming mistake.
- a mask or control image that is a link leaving its folder is not read (unless follow_links):
  its image is skipped and listed, as for an unreadable one.

Mask values: the grey level is the loss weight, white 1 and black 0. Transparent pixels count as
black (the image is composited over black first); colour is converted to grey with Pillow's
'L' (ITU-R 601 luma); 16-bit and float masks keep their precision (image_io's scaling rule).
The mask is cropped like the image and then averaged down to the latent's size (box filter),
so a latent cell's weight is the mean weight of the pixels it covers.

Pure Pillow + numpy, like engine/data/scan.py, which calls this module from its scan.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from .folders import outside_link
from .images import (
    _HIGH_BIT_MODES,
    ImageReadError,
    _check_file,
    _high_bit_to_float,
    _resize_crop,
    describe_error,
    list_folder,
    name_key,
    open_image,
    probe_image,
)
from .messages import DatasetError

# Bump when load_mask's output for the same file changes: it is part of the cache fingerprint.
MASK_VERSION = 1
_ASPECT_TOLERANCE = 0.01  # control images within 1 % of their image's aspect ratio are not listed


@dataclass(frozen=True)
class PairedFile:
    """A mask or control image of one dataset item; size and mtime go into the cache fingerprint."""
    path: str
    size_bytes: int
    mtime_ns: int

    def stamp(self) -> list:
        return [os.path.basename(self.path), self.size_bytes, self.mtime_ns]


class _Folder:
    """One mask/control folder's images by name without extension (case-folded)."""

    def __init__(self, folder: str, setting: str):
        self.folder, self.setting = folder, setting
        try:
            listing = list_folder(folder)
        except OSError as e:
            raise DatasetError(f"cannot list {setting} {folder} ({e.strerror}): make it readable for the user "
                               f"running ComfyUI, or fix LoadDataset's '{setting}'.") from None
        self.by_stem: dict[str, list[str]] = {}
        for name in listing.images:
            self.by_stem.setdefault(name_key(os.path.splitext(name)[0]), []).append(name)
        # videos are never masks or control images; kept to say so instead of "no mask"
        self.videos = {name_key(os.path.splitext(n)[0]): os.path.join(folder, n) for n in listing.videos}
        self.used: set[str] = set()

    def find(self, image_path: str) -> tuple[str | None, int]:
        """(path of the paired file or None, how many candidates had the name)."""
        stem = os.path.splitext(os.path.basename(image_path))[0]
        names = self.by_stem.get(name_key(stem), [])
        exact = [n for n in names if os.path.splitext(n)[0] == stem]
        chosen = (exact or names or [None])[0]
        if chosen is None:
            return None, 0
        self.used.add(name_key(stem))
        return os.path.join(self.folder, chosen), len(exact or names)

    def video_for(self, image_path: str) -> str | None:
        """A video in this folder named like the item (which cannot serve as its mask), or None."""
        return self.videos.get(name_key(os.path.splitext(os.path.basename(image_path))[0]))

    def unused(self) -> list[str]:
        return [os.path.join(self.folder, n) for stem, names in self.by_stem.items() if stem not in self.used
                for n in names]


def _stat(path: str) -> PairedFile:
    st = os.stat(path)
    return PairedFile(path, st.st_size, st.st_mtime_ns)


class Pairing:
    """Attach masks and control images to scanned items; collects the report lists by warning kind."""

    def __init__(self, mask_folder: str, control_folder: str, report: dict[str, list[str]],
                 follow_links: bool = False):
        self.masks = _Folder(mask_folder, "mask_folder") if mask_folder else None
        self.controls = _Folder(control_folder, "control_folder") if control_folder else None
        self.report, self.follow_links = report, follow_links
        self.counts = {"masked": 0, "unmasked": 0, "mask_skipped": 0, "controlled": 0, "control_skipped": 0}

    def attach(self, item):
        """The item with its mask/control (dataclasses.replace), or None when it must be skipped."""
        mask = control = None
        if self.controls is not None:
            control = self._control(item)
            if control is None:
                self.counts["control_skipped"] += 1
                return None
        if self.masks is not None:
            path, found = self.masks.find(item.path)
            if path is None and self.masks.video_for(item.path):
                self.report["mask_video"].append(f"{self.masks.video_for(item.path)} (for {item.path})")
                self.counts["mask_skipped"] += 1
                return None
            if path is None:
                self.report["mask_missing"].append(item.path)
            elif self._outside(path):  # not read: training it unmasked would train what the mask hides
                self.counts["mask_skipped"] += 1
                return None
            else:
                try:
                    info = probe_image(path)
                    mask = _stat(path)
                except (ImageReadError, OSError) as e:
                    self.report["mask_unreadable"].append(f"{str(e) if isinstance(e, ImageReadError) else path}")
                    self.counts["mask_skipped"] += 1
                    return None
                if found > 1:
                    self.report["pair_ambiguous"].append(f"{item.path} -> {path}")
                if (info.width, info.height) != (item.width, item.height):
                    self.report["mask_resized"].append(f"{path} ({info.width}x{info.height} for an image of "
                                                       f"{item.width}x{item.height})")
        if control is not None:
            self.counts["controlled"] += 1
        if self.masks is not None:
            self.counts["masked" if mask else "unmasked"] += 1
        return dataclasses.replace(item, mask=mask, control=control)

    def _control(self, item) -> PairedFile | None:
        path, found = self.controls.find(item.path)
        if path is None and self.controls.video_for(item.path):
            self.report["control_unreadable"].append(f"{self.controls.video_for(item.path)} is a video (for {item.path}); "
                                                     "a control image must be a still image")
            return None
        if path is None:
            self.report["control_missing"].append(item.path)
            return None
        if self._outside(path):
            return None
        try:
            info = probe_image(path)
            control = _stat(path)
        except (ImageReadError, OSError) as e:
            self.report["control_unreadable"].append(str(e) if isinstance(e, ImageReadError) else path)
            return None
        if found > 1:
            self.report["pair_ambiguous"].append(f"{item.path} -> {path}")
        if item.width and item.height and \
                abs(info.width / info.height / (item.width / item.height) - 1) > _ASPECT_TOLERANCE:
            self.report["control_aspect"].append(f"{path} ({info.width}x{info.height} for an image of "
                                                 f"{item.width}x{item.height})")
        return control

    def _outside(self, path: str) -> bool:
        """Whether `path` is a link leaving its folder that follow_links does not allow (then reported)."""
        target = None if self.follow_links else outside_link(os.path.dirname(path), os.path.basename(path))
        if target:
            self.report["outside_link"].append(f"{path} -> {target}")
        return bool(target)

    def finish(self) -> None:
        for folder in (self.masks, self.controls):
            if folder is not None:
                self.report["pair_unused"] += folder.unused()


def pair_signature(mask_folder: str, control_folder: str) -> str:
    """Names, sizes, mtimes, ctimes and inodes of every file in the mask/control folders (for IS_CHANGED);
    '' when none."""
    h = hashlib.sha256()
    for folder in (mask_folder, control_folder):
        if not folder:
            continue
        h.update(f"\0{folder}".encode("utf-8", "surrogateescape"))
        for name in sorted(os.listdir(folder)):
            try:
                st = os.stat(os.path.join(folder, name))
                h.update(f"\0{name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}".encode(
                    "utf-8", "surrogateescape"))
            except OSError:
                h.update(f"\0{name}\0-".encode("utf-8", "surrogateescape"))
    return h.hexdigest() if (mask_folder or control_folder) else ""


# ---- reading one mask ----------------------------------------------------------------------

def load_mask(path: str, image_size: tuple[int, int], bucket: tuple[int, int],
              latent_size: tuple[int, int]) -> np.ndarray:
    """The loss weights of one item: float32 [latent_h, latent_w] in 0..1 (rules in the module doc).

    image_size: the image's (width, height) as displayed; bucket: the (width, height) it trains at;
    latent_size: (height, width) of its VAE latent. Raises ImageReadError naming the file.
    """
    _check_file(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            warnings.simplefilter("ignore", UserWarning)  # "Corrupt EXIF data": the orientation is kept as stored
            with open_image(path) as im:
                plane = _grey(im)
    except ImageReadError:
        raise
    except Exception as e:  # noqa: BLE001 - Pillow raises many types; the message names the file
        raise ImageReadError(describe_error(path, e)) from None
    if plane.size != tuple(image_size):
        plane = plane.resize(tuple(image_size), Image.Resampling.BILINEAR)
    plane = _resize_crop(plane, tuple(bucket))
    h, w = latent_size
    plane = plane.resize((int(w), int(h)), Image.Resampling.BOX)
    return np.clip(np.asarray(plane, dtype=np.float32), 0.0, 1.0)


def _grey(im: Image.Image) -> Image.Image:
    """Any mode as an 'F' image in 0..1: transparent = black, colour -> luma, 16-bit kept."""
    im.seek(0)
    im.load()
    try:
        im = ImageOps.exif_transpose(im)
    except Exception:  # noqa: BLE001, S110 - damaged EXIF: keep the stored orientation, as load_image does
        pass
    if im.mode in _HIGH_BIT_MODES:
        return _high_bit_to_float(im)
    if im.mode in ("RGBA", "LA", "PA", "P", "RGBa", "La") or "transparency" in im.info:
        rgba = im.convert("RGBA")
        im = Image.alpha_composite(Image.new("RGBA", rgba.size, (0, 0, 0, 255)), rgba)
    grey = np.asarray(im.convert("L"), dtype=np.float32) / 255.0
    return Image.fromarray(grey, mode="F")
