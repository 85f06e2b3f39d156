"""Tiny random-init model files that ComfyUI's stock loaders accept, plus a tiny dataset.

The offline demo and the tests need an SD1.5-shaped UNet, a VAE and a CLIP-L text encoder, and
no real weights can be downloaded. So the architectures are built with ComfyUI's own classes (its
model detection then recognises the files exactly as it would real ones) and every tensor is
given a value here from a seed: ComfyUI's layers allocate with torch.empty and never initialise.
ENVIRONMENT.md ("An offline demo graph with random-init files") records which shapes detection
accepts on ComfyUI 0.3.75.

    python -m tools.tiny_assets BASE_DIR      # a base dir for `main.py --base-directory BASE_DIR`
    python -m tools.tiny_assets BASE_DIR --extras edit video experts   # + the other workflows' files

This file lays the files out under a ComfyUI base directory (and is the CLI); the writers live in
tools/tiny_models.py (UNet, VAE, CLIP), tools/tiny_dataset.py (the images) and tools/tiny_init.py
(seeding, atomic writes), and the edit (Flux Kontext) and video (HunyuanVideo) example workflows'
files in tools/tiny_families.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

# The generators live in files named for what they write; their public names stay importable from here.
from .tiny_dataset import COLOURS, SHAPES, _dataset_stems, write_tiny_dataset
from .tiny_init import CONTENT_VERSION, _write_text
from .tiny_models import (UNET_CONFIG, build_tiny_clip, build_tiny_taesd, build_tiny_unet, load_tiny_encoders,
                          write_tiny_clip, write_tiny_unet, write_tiny_vae)

__all__ = ["CLIP_FILE", "COLOURS", "CONTENT_VERSION", "DATASET_DIR", "EVAL_DIR", "SHAPES", "STAMP_FILE",
           "UNET_CONFIG", "UNET_FILE", "VAE_FILE", "build_tiny_clip", "build_tiny_taesd", "build_tiny_unet", "load_tiny_encoders",
           "main", "write_demo_base", "write_tiny_clip", "write_tiny_dataset", "write_tiny_unet", "write_tiny_vae"]

UNET_FILE = "pipetrain-tiny-unet.safetensors"
VAE_FILE = "pipetrain-tiny-taesd.safetensors"
CLIP_FILE = "pipetrain-tiny-clip-l.safetensors"
DATASET_DIR = "pipetrain-demo-dataset"
EVAL_DIR = "pipetrain-demo-eval"  # held out: none of its images is in DATASET_DIR (the best-step workflow's eval set)
STAMP_FILE = "pipetrain-demo-assets.json"


# ---------------------------------------------------------------- a ComfyUI base directory

def _write_settings(path: str) -> None:
    # Without it the first page load shows a template dialog (browser tests); keep other settings.
    settings = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            settings = json.load(f)
    if settings.get("Comfy.TutorialCompleted") is not True:
        settings["Comfy.TutorialCompleted"] = True
        _write_text(path, json.dumps(settings, indent=2))


def write_demo_base(base_dir: str, seed: int = 0, extras: tuple[str, ...] = ()) -> dict:
    """Lay out models, the demo dataset and UI settings under a ComfyUI base directory.

    Files already written by the same CONTENT_VERSION and seed (per the stamp file) are kept.
    Returns {"unet", "vae", "clip"}: names as ComfyUI lists them; "dataset": the dataset's absolute
    folder; "eval_dataset": the held-out eval set's; "base_dir": the absolute base directory. extras: also
    the files of the "edit" (Flux Kontext, 0.8 GB), "video" (HunyuanVideo) and/or "experts" (Wan 2.2 pair)
    example workflows (tools/tiny_families.py), returned under those keys; files of extras written by an earlier call stay in the stamp.
    """
    from . import tiny_families

    base = os.path.abspath(base_dir)
    dataset = os.path.join(base, "input", DATASET_DIR)
    eval_set = os.path.join(base, "input", EVAL_DIR)
    n_images, n_eval = 8, 4
    models = os.path.join(base, "models")
    groups = [  # (the files a step writes, relative to base; the step)
        ([f"models/diffusion_models/{UNET_FILE}"],
         lambda: write_tiny_unet(os.path.join(models, "diffusion_models", UNET_FILE), seed)),
        ([f"models/vae/{VAE_FILE}"], lambda: write_tiny_vae(os.path.join(models, "vae", VAE_FILE), seed)),
        ([f"models/text_encoders/{CLIP_FILE}"],
         lambda: write_tiny_clip(os.path.join(models, "text_encoders", CLIP_FILE), seed)),
        ([f"input/{DATASET_DIR}/{s}{ext}" for s in _dataset_stems(n_images) for ext in (".png", ".txt")],
         lambda: write_tiny_dataset(dataset, n=n_images, size=64, seed=seed)),
        ([f"input/{EVAL_DIR}/{s}{ext}" for s in _dataset_stems(n_eval) for ext in (".png", ".txt")],
         lambda: write_tiny_dataset(eval_set, n=n_eval, size=64, seed=seed, skip=n_images)),
    ]
    extra_groups = tiny_families.groups(base, seed)
    unknown = sorted(set(extras) - set(extra_groups))
    if unknown:
        raise ValueError(f"write_demo_base extras {unknown}: choose from {sorted(extra_groups)}")
    for name in extras:
        groups += extra_groups[name]
    stamp_path = os.path.join(base, STAMP_FILE)
    want = {"content_version": CONTENT_VERSION, "seed": seed}
    stamp = {}
    if os.path.isfile(stamp_path):
        with open(stamp_path, encoding="utf-8") as f:
            stamp = json.load(f)
    known = stamp.get("files", {}) if all(stamp.get(k) == v for k, v in want.items()) else {}

    def current(rel: str) -> bool:
        path = os.path.join(base, rel)
        return rel in known and os.path.isfile(path) and os.path.getsize(path) == known[rel]

    for rels, write in groups:
        if not all(current(rel) for rel in rels):
            write()
    files = {rel: size for rel, size in known.items() if current(rel)}  # other extras' files, still valid
    files.update({rel: os.path.getsize(os.path.join(base, rel)) for rels, _ in groups for rel in rels})
    _write_text(stamp_path, json.dumps({**want, "files": dict(sorted(files.items()))}, indent=1))
    _write_settings(os.path.join(base, "user", "default", "comfy.settings.json"))
    extra_names = tiny_families.names(base)
    return {"unet": UNET_FILE, "vae": VAE_FILE, "clip": CLIP_FILE, "dataset": dataset, "eval_dataset": eval_set,
            "base_dir": base,
            **{name: extra_names[name] for name in extras}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write PipeTrain's tiny random-init demo assets.")
    parser.add_argument("base_dir", help="ComfyUI base directory to populate (for main.py --base-directory)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extras", nargs="*", default=[], choices=["edit", "video", "experts"],
                        help="also the files of these example workflows (edit: Flux Kontext, 0.8 GB; video: "
                             "HunyuanVideo; experts: the Wan 2.2 pair's low-noise stand-in)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = write_demo_base(args.base_dir, seed=args.seed, extras=tuple(args.extras))
    print(json.dumps(result, indent=2))
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
