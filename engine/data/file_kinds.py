"""What a file really holds, from its first bytes: for files whose name does not say it (no or an
unknown extension, a picture saved as a caption). Pure Python; used by the dataset scan's reports.
"""
from __future__ import annotations

import os
import stat

HEAD_BYTES = 16  # enough for every signature below


def media_kind(head: bytes) -> tuple[str, str] | None:
    """(what it is in words, the extension to give it) for an image or video signature, else None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "a PNG image", ".png"
    if head.startswith(b"\xff\xd8\xff"):
        return "a JPEG image", ".jpg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "a GIF image", ".gif"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "a WebP image", ".webp"
    if head.startswith(b"RIFF") and head[8:12] == b"AVI ":
        return "an AVI video", ".avi"
    if head.startswith((b"II*\x00", b"MM\x00*")):
        return "a TIFF image", ".tif"
    if head.startswith(b"BM") and len(head) >= 14 and head[6:10] == b"\x00\x00\x00\x00":
        return "a BMP image", ".bmp"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"avif", b"avis"):
            return "an AVIF image", ".avif"
        if brand in (b"heic", b"heix", b"mif1", b"msf1", b"hevc"):
            return "a HEIC photo", ".heic"
        return "an MP4/MOV video", ".mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "a WebM/MKV video", ".mkv"
    return None


def read_head(path: str) -> bytes:
    """The first HEAD_BYTES of a regular file; b'' for anything that cannot or should not be opened
    (a pipe would block, a device never ends)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return b""
        with open(path, "rb") as f:
            return f.read(HEAD_BYTES)
    except OSError:
        return b""
