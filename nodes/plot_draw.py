"""Pillow drawing for the run-dir reader nodes: the loss plot and the labelled sample grid.

Plain Pillow (no plotting library): axes with round ticks, the raw loss, a TensorBoard-style
smoothed curve, and the learning rate scaled onto a right-hand axis.
"""
from __future__ import annotations

import math

from PIL import Image, ImageDraw, ImageFont

BG, AXIS, TEXT = (24, 24, 28), (140, 140, 150), (220, 220, 225)
RAW, SMOOTH, LR = (90, 120, 190), (80, 150, 255), (255, 170, 70)


def smooth(values: list[float], weight: float) -> list[float]:
    """Debiased exponential moving average (same as web/chart.js's smooth)."""
    out, acc = [], 0.0
    for n, v in enumerate(values, start=1):
        acc = acc * weight + (1 - weight) * v
        out.append(v if weight == 0 else acc / (1 - weight ** n))
    return out


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(f * mag for f in (1, 2, 5, 10) if f * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has one fixed-size default font
        return ImageFont.load_default()


def draw_loss_plot(h: dict, title: str, width: int, height: int, smoothing: float) -> Image.Image:
    steps = [r[0] for r in h["steps"]]
    losses = [r[1] for r in h["steps"]]
    lrs = [r[2] for r in h["steps"]]
    img = Image.new("RGB", (width, height), BG)
    d = ImageDraw.Draw(img)
    font = _font(max(10, height // 36))
    left, right, top, bottom = 64, 64, 34, 36
    x0, x1 = 0, max(max(steps), h.get("total") or 0, 1)
    finite = [v for v in losses if math.isfinite(v)]
    y0, y1 = min(finite), max(finite)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5 * abs(y0 or 1), y1 + 0.5 * abs(y1 or 1)
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad
    w, hgt = width - left - right, height - top - bottom

    def sx(s):
        return left + (s - x0) / (x1 - x0) * w

    def sy(v):
        return top + (1 - (v - y0) / (y1 - y0)) * hgt

    d.line([(left, top), (left, top + hgt), (left + w, top + hgt)], fill=AXIS)
    for v in nice_ticks(y0, y1, 5):
        d.line([(left - 4, sy(v)), (left, sy(v))], fill=AXIS)
        d.text((4, sy(v) - 6), f"{v:.3g}", fill=TEXT, font=font)
    for s in nice_ticks(x0, x1, 6):
        d.line([(sx(s), top + hgt), (sx(s), top + hgt + 4)], fill=AXIS)
        d.text((sx(s) - 8, top + hgt + 8), f"{s:g}", fill=TEXT, font=font)
    if max(lrs) > 0:  # learning rate on its own right-hand scale
        lr_hi = max(lrs) * 1.05
        d.line([(sx(s), top + (1 - lr / lr_hi) * hgt) for s, lr in zip(steps, lrs)] if len(steps) > 1 else
               [(sx(steps[0]), top), (sx(steps[0]) + 1, top)], fill=LR, width=1)
        d.text((left + w + 4, top - 4), f"lr {max(lrs):.1e}", fill=LR, font=font)
    pts = [(sx(s), sy(v)) for s, v in zip(steps, losses) if math.isfinite(v)]
    sm = smooth(finite, smoothing)
    spts = [(sx(s), sy(v)) for s, v in zip([s for s, v in zip(steps, losses) if math.isfinite(v)], sm)]
    if len(pts) > 1:
        d.line(pts, fill=RAW, width=1)
        d.line(spts, fill=SMOOTH, width=3)
    else:
        x, y = pts[0]
        d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=SMOOTH)
    status = h.get("status", "")
    d.text((left, 8), f"{title}: step {steps[-1]}/{h.get('total') or '?'}, loss {losses[-1]:.4f} "
                      f"(smoothed {sm[-1]:.4f}), {status}", fill=TEXT, font=font)
    return img


def grid_image(rows: list[tuple[int, list[Image.Image]]], prompts: list[str], cell: int) -> Image.Image:
    """rows: [(step, [image per prompt])]; a label column on the left, prompts on top."""
    font = _font(max(10, cell // 16))
    cols = max(len(images) for _, images in rows)
    thumbs = []
    for step, images in rows:
        row = []
        for im in images:
            scale = cell / max(im.width, im.height)
            size = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
            # small samples are enlarged with hard pixel edges; large ones shrunk smoothly
            row.append(im.resize(size, Image.NEAREST if scale > 1 else Image.LANCZOS))
        thumbs.append((step, row))
    cw = max(im.width for _, row in thumbs for im in row)
    ch = max(im.height for _, row in thumbs for im in row)
    label_w, header_h, gap = max(70, cell // 3), 24, 4
    width = label_w + cols * (cw + gap)
    height = header_h + len(thumbs) * (ch + gap)
    out = Image.new("RGB", (width, height), BG)
    d = ImageDraw.Draw(out)
    for c in range(cols):
        text = prompts[c] if c < len(prompts) else f"prompt {c + 1}"
        max_chars = max(4, cw // 7)
        d.text((label_w + c * (cw + gap) + 2, 4), text if len(text) <= max_chars else text[:max_chars - 1] + "…",
               fill=TEXT, font=font)
    for r, (step, row) in enumerate(thumbs):
        y = header_h + r * (ch + gap)
        d.text((4, y + ch // 2 - 6), f"step {step}", fill=TEXT, font=font)
        for c, im in enumerate(row):
            out.paste(im, (label_w + c * (cw + gap), y))
    return out
