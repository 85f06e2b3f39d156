"""What text the text encoder encodes for one caption file: LoadDataset's caption options. Pure Python.

- caption_lines: each non-empty line of the file is a caption of its own (training picks one line
  per epoch); off, the file is one caption, line breaks included, as before these options.
- tag_shuffles N (0 = off): tags are the comma-separated parts of a caption; N shuffled orders of
  each caption are encoded at cache time (captions are cached as embeddings, so an order has to exist
  before training), the first keep_tokens tags staying in place. The orders come from a generator
  seeded by the caption text and the order's number, so the same caption always gives the same
  orders (a re-run reuses them, two files with one caption share them). Orders that come out the
  same (a caption of 2 tags has 2 orders at most) are encoded once.
- caption_prefix (a trigger word) is put before every caption and every order, as typed (include the
  separator: 'ohwx, '); it is never shuffled and not counted in keep_tokens. An empty caption gets
  the prefix alone, without the trailing separator.

caption_texts() gives, per caption (line), its orders; the cache stores them in that order, the first
order of the first line as the item's main conditioning. engine/train/caption_picks.py picks among them.
"""
from __future__ import annotations

import hashlib
import random

from .messages import DatasetError

MAX_TAG_SHUFFLES = 32  # each order is one more stored conditioning per item (T5/LLM conds are megabytes)
MAX_KEEP_TOKENS = 100
MAX_CAPTION_LINES = 32  # lines of one caption file used as captions; later lines are not used


def check_caption_options(prefix: str, lines: bool, shuffles: int, keep_tokens: int, dropout: float) -> None:
    """Refuse values that cannot work, saying what to set instead."""
    if not isinstance(prefix, str):
        raise DatasetError(f"caption_prefix is {prefix!r}: use text, e.g. 'ohwx, ', or leave it empty.")
    if "\n" in prefix or "\r" in prefix:
        raise DatasetError("caption_prefix holds a line break: put the trigger word on one line (e.g. 'ohwx, ').")
    if not isinstance(lines, bool):
        raise DatasetError(f"caption_lines is {lines!r}: use true or false.")
    if not (isinstance(shuffles, int) and not isinstance(shuffles, bool) and
            (shuffles == 0 or 2 <= shuffles <= MAX_TAG_SHUFFLES)):
        raise DatasetError(f"tag_shuffles is {shuffles!r}: use 0 (tags keep their order) or 2 to {MAX_TAG_SHUFFLES} "
                           "shuffled orders per caption (one order would always be the same order).")
    if not (isinstance(keep_tokens, int) and not isinstance(keep_tokens, bool) and
            0 <= keep_tokens <= MAX_KEEP_TOKENS):
        raise DatasetError(f"keep_tokens is {keep_tokens!r}: use a whole number from 0 to {MAX_KEEP_TOKENS} (how many "
                           "leading tags stay in place when tags are shuffled).")
    if keep_tokens and not shuffles:
        raise DatasetError(f"keep_tokens is {keep_tokens} but tag_shuffles is 0, so no tag moves: set tag_shuffles "
                           "(e.g. 8) to shuffle the tags after the first keep_tokens, or set keep_tokens to 0.")
    if not (isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and 0.0 <= dropout < 1.0):
        raise DatasetError(f"caption_dropout is {dropout!r}: use a fraction from 0 (off) to below 1, e.g. 0.1 trains "
                           "one sample in ten with the empty caption.")


def split_tags(caption: str) -> list[str]:
    """The comma-separated tags of a caption, stripped, empty ones left out."""
    return [t.strip() for t in caption.split(",") if t.strip()]


def tag_orders(caption: str, shuffles: int, keep_tokens: int) -> list[str]:
    """Up to `shuffles` distinct shuffled orders of the caption's tags (its first keep_tokens tags in place)."""
    tags = split_tags(caption)
    kept, moved = tags[:keep_tokens], tags[keep_tokens:]
    orders: dict[str, None] = {}
    for n in range(shuffles):
        seed = hashlib.blake2b(f"{n}\0{caption}".encode("utf-8", "surrogateescape"), digest_size=8).digest()
        order = list(moved)
        random.Random(int.from_bytes(seed, "big")).shuffle(order)
        orders[", ".join(kept + order)] = None
    return list(orders) or [caption]


def _with_prefix(prefix: str, text: str) -> str:
    return prefix + text if text else prefix.rstrip(" ,;")


def caption_texts(caption: str | None, prefix: str = "", lines: bool = False, shuffles: int = 0,
                  keep_tokens: int = 0) -> list[list[str]]:
    """Per caption of the file (one, or one per line), the texts to encode (module doc). Never empty."""
    text = caption or ""
    parts = [line.strip() for line in text.split("\n") if line.strip()][:MAX_CAPTION_LINES] if lines else [text]
    out = []
    for part in parts or [""]:
        orders = tag_orders(part, shuffles, keep_tokens) if shuffles else [part]
        out.append(list(dict.fromkeys(_with_prefix(prefix, o) for o in orders)))
    return out


def spec_caption_texts(spec, caption: str | None) -> list[list[str]]:
    """caption_texts with a DatasetSpec's options."""
    return caption_texts(caption, spec.caption_prefix, spec.caption_lines, spec.tag_shuffles, spec.keep_tokens)


def caption_options(spec) -> dict:
    """The options that change encoded text, when any is set ({} otherwise: the fingerprint of caches made
    before these options, and with them at their defaults, stays as it was)."""
    values = {"caption_prefix": spec.caption_prefix, "caption_lines": spec.caption_lines,
              "tag_shuffles": spec.tag_shuffles, "keep_tokens": spec.keep_tokens}
    if not any(values.values()):
        return {}
    return {**values, "captions_version": 1}


def options_summary(spec) -> str:
    """One report line of the caption options set ('' when none is)."""
    parts = [f"prefix {spec.caption_prefix!r}"] if spec.caption_prefix else []
    if spec.caption_lines:
        parts.append("one caption per line, one line per epoch")
    if spec.tag_shuffles:
        kept = f", the first {spec.keep_tokens} tag(s) in place" if spec.keep_tokens else ""
        parts.append(f"{spec.tag_shuffles} shuffled tag orders per caption{kept}")
    if spec.caption_dropout:
        parts.append(f"{spec.caption_dropout:g} of the samples train with the empty caption")
    return f"captions: {'; '.join(parts)}." if parts else ""
