"""Whether a PNG file carries EXIF, read from its chunk headers without decoding any pixel.

Pillow's PngImageFile.getexif() decodes the whole image when the EXIF chunk is not before the
image data (an eXIf chunk may follow it), just to look for one: 45 ms for a 1024 px PNG, which made
the dataset scan (image_io.probe_image) of large PNG sets take minutes. Walking the chunk headers
(8 bytes each, the data skipped) answers the same question in well under a millisecond.
"""
from __future__ import annotations

import os
import struct

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_CHUNKS = 1_000_000  # a damaged file must not loop for ever


def png_has_exif(path: str) -> bool:
    """True when the PNG has an eXIf chunk anywhere, or when its chunks cannot be walked (the caller
    then asks Pillow, which reads the whole file). False only for a cleanly walked file without one."""
    try:
        with open(path, "rb") as f:
            if f.read(8) != PNG_SIGNATURE:
                return True
            for _ in range(MAX_CHUNKS):
                head = f.read(8)
                if len(head) < 8:
                    return True  # cut off before IEND: let Pillow judge it
                length, kind = struct.unpack(">I4s", head)
                if kind == b"eXIf":
                    return True
                if kind == b"IEND":
                    return False
                f.seek(length + 4, os.SEEK_CUR)  # the data and its CRC
    except OSError:
        return True
    return True
