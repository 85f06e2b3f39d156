"""Reading one caption file: its text, and the warning kind (engine/data/messages.py) when
something about it was off. Pure Python.

Policies (each reported by the dataset scan, naming the file):
- UTF-8 (with or without BOM) and UTF-16/32 with BOM are read silently; UTF-16 without BOM is
  recognised by its zero bytes; anything else is read as Windows-1252, so 'café' survives.
- Only regular files are opened: a named pipe called a.txt would block the scan forever, and
  a link to a device would never end.
- A file of binary data (a picture or a document saved under the caption's name) is not text: its
  image trains with the empty caption rather than with a string of mojibake.
- Control characters (NUL, escape codes...) are removed, and zero-width characters and BOMs at
  the ends are stripped with the whitespace: they are never meant as text. Line ends are made
  '\n' (Windows '\r\n' and old Mac '\r'), so the same caption saved on any system is one text.
- A caption is read up to _CAPTION_READ_BYTES and cut to MAX_CAPTION_CHARS: text encoders use a
  few hundred tokens at most, and a log or a book saved under an image's name would otherwise be
  tokenized whole (a 1 MB caption took minutes and 10 GB of memory in CacheLatents).
"""
from __future__ import annotations

import codecs
import os
import re
import stat

from .file_kinds import media_kind

MAX_CAPTION_CHARS = 20_000
_CAPTION_READ_BYTES = 4 * MAX_CAPTION_CHARS + 4
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))  # UTF-32 LE first: it starts like UTF-16 LE
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # C0 controls and DEL, except tab, newline, CR
_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff"  # zero-width characters and BOMs: stripped at the ends
_BINARY_SHARE = 0.1  # more control characters than this share of the text: binary data, not a caption
_BINARY_MIN = 4  # ... and at least this many (a stray escape code in a real caption is removed, not refused)


def decode_caption(raw: bytes) -> tuple[str, str | None]:
    """Caption text from a file's bytes (not yet cleaned), and the warning kind when a guess was needed."""
    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            return raw.decode(encoding, errors="replace"), None
    half = len(raw) // 2
    if raw and len(raw) % 2 == 0 and max(raw[1::2].count(0), raw[::2].count(0)) >= 0.75 * half:
        # mostly-Latin UTF-16: one byte of (nearly) every pair is zero; a stray NUL in UTF-8 text is not that
        odd_zeros = raw[1::2].count(0) >= raw[::2].count(0)
        return raw.decode("utf-16-le" if odd_zeros else "utf-16-be", errors="replace"), "utf16_no_bom"
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        pass
    try:
        return raw.decode("cp1252"), "not_utf8"
    except UnicodeDecodeError:  # the five bytes cp1252 leaves undefined
        return raw.decode("latin-1"), "not_utf8"


def read_caption(path: str) -> tuple[str, str | None, str]:
    """A caption file's text, the warning kind when something was off, and the example to list."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            return "", "caption_unreadable", f"{path} is a folder, not a text file: rename or remove it"
        if not stat.S_ISREG(mode):
            return "", "caption_unreadable", (f"{path} is not a regular file (a pipe, socket or device): replace it "
                                              "with a UTF-8 text file")
        with open(path, "rb") as f:
            raw = f.read(_CAPTION_READ_BYTES)
    except OSError as e:
        return "", "caption_unreadable", f"{path} ({e.strerror}): make it a readable UTF-8 text file"
    text, kind = decode_caption(raw)
    controls = len(_CONTROL.findall(text))
    if controls >= _BINARY_MIN and controls > _BINARY_SHARE * len(text):
        found = media_kind(raw[:16])
        what = f"{found[0]} saved under the caption's name" if found else "binary data, not text"
        return "", "caption_binary", f"{path} ({what})"
    text = _clean(text)
    if len(text) > MAX_CAPTION_CHARS or len(raw) == _CAPTION_READ_BYTES:
        return text[:MAX_CAPTION_CHARS], "caption_long", f"{path} ({text[:40]!r}...)"
    return text, kind, f"{path} ({text[:40]!r})"


def _clean(text: str) -> str:
    text = _CONTROL.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    previous = None
    while text != previous:  # "\u200b a cat \ufeff": whitespace and invisible characters in any order
        previous, text = text, text.strip().strip(_INVISIBLE)
    return text
