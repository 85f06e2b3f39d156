"""The demo's tiny image dataset: PNGs of one coloured shape on a gradient, each with a caption
naming the shape and both colours (tools/tiny_families.py draws its edit pairs and clips the same way).
"""
from __future__ import annotations

import os
import random

from .tiny_init import _atomic, _write_text

COLOURS = {
    "red": (215, 40, 40), "green": (40, 170, 60), "blue": (45, 80, 215), "yellow": (240, 210, 50),
    "purple": (140, 60, 170), "orange": (245, 140, 30), "white": (240, 240, 240), "black": (25, 25, 25),
}
SHAPES = ("circle", "square", "triangle", "diamond")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _dataset_stems(n: int) -> list[str]:
    return [f"image_{i:03d}" for i in range(n)]


def _draw(shape: str, fg, bg, size: int, rng: random.Random):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size))
    draw = ImageDraw.Draw(img)
    for y in range(size):  # vertical gradient: the background darkens to 70 % at the bottom
        k = 1.0 - 0.3 * y / max(size - 1, 1)
        draw.line([(0, y), (size, y)], fill=tuple(int(c * k) for c in bg))
    r = size * rng.uniform(0.22, 0.32)
    cx, cy = (size / 2 + rng.uniform(-0.12, 0.12) * size for _ in range(2))
    box = [cx - r, cy - r, cx + r, cy + r]
    if shape == "circle":
        draw.ellipse(box, fill=fg)
    elif shape == "square":
        draw.rectangle(box, fill=fg)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fg)
    else:
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fg)
    return img


def write_tiny_dataset(folder: str, n: int = 8, size: int = 64, seed: int = 0, skip: int = 0) -> list[str]:
    """n PNGs of one coloured shape on a gradient, each with a `.txt` caption naming both colours.
    skip: leave out the shape/colour combinations the first `skip` images of the same seed have (a held-out
    eval set beside a training set of `skip` images: no image of one is in the other)."""
    combos = [(s, fg, bg) for s in SHAPES for fg in COLOURS for bg in COLOURS if fg != bg]
    if skip + n > len(combos):
        raise ValueError(f"write_tiny_dataset makes at most {len(combos)} distinct images, asked for {skip + n}")
    rng = random.Random(seed)
    chosen = rng.sample(combos, skip + n)[skip:]  # random.sample's first picks do not depend on how many
    paths = []
    for stem, (shape, fg, bg) in zip(_dataset_stems(n), chosen):
        base = os.path.join(folder, stem)
        img = _draw(shape, COLOURS[fg], COLOURS[bg], size, rng)
        _atomic(base + ".png", lambda tmp: img.save(tmp, format="PNG"))
        caption = f"{_article(fg)} {fg} {shape} on {_article(bg)} {bg} background"
        _write_text(base + ".txt", caption + "\n")
        paths.append(base + ".png")
    return paths
