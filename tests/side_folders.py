"""Helpers the tests of LoadDataset's side folders share (control_folder: tests/with_comfy/test_dataset_control.py,
mask_folder: tests/with_comfy/test_dataset_masks.py): the demo's tiny VAE + CLIP, PipeTrain's log, random
pictures, and the node calls LoadDataset -> CacheLatents."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from pack import load_pack
from PIL import Image

load_pack()
import PipeTrain.nodes.cache_latents as cache_node
import PipeTrain.nodes.load_dataset as load_node
from PipeTrain.engine.cache.reader import CachedDataset

RES = 64  # the tiny VAE's latent is 8x8


def tiny_encoders(demo_base):
    """(VAE, CLIP) of the demo base, for a module fixture to yield from: one intra-op thread meanwhile."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny encodes are fastest single-threaded on a busy machine (tests/conftest.py)
    from tools.tiny_assets import load_tiny_encoders

    models = Path(demo_base["base_dir"]) / "models"
    yield load_tiny_encoders(str(models / "vae" / demo_base["vae"]), str(models / "text_encoders" / demo_base["clip"]))
    torch.set_num_threads(threads)


def info_log(caplog):
    """Captures PipeTrain's INFO log; returns a function giving all of it so far as one string."""
    caplog.set_level(logging.INFO, logger="PipeTrain")
    return lambda: "\n".join(r.getMessage() for r in caplog.records if r.name == "PipeTrain")


def picture(path, seed: int, size=(RES, RES)):
    """A picture of random pixels (width, height = size), the same for the same seed."""
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)


def image_folders(tmp_path, side: str, names, caption: str, size=(RES, RES)) -> tuple[Path, Path]:
    """(tmp_path/data, tmp_path/<side>, empty): data holds <name>.png (picture seed: its index) and <name>.txt
    (caption with {name} filled in) for each of names."""
    data, folder = tmp_path / "data", tmp_path / side
    data.mkdir()
    folder.mkdir()
    for i, name in enumerate(names):
        picture(data / f"{name}.png", i, size)
        (data / f"{name}.txt").write_text(caption.format(name=name))
    return data, folder


def load_spec(data, **settings):
    """LoadDataset's spec of folder data at RES, 1 repeat; settings: its other inputs (the side folder)."""
    (spec,) = load_node.PipeTrainLoadDataset().load(folders=str(data), resolution=RES, repeats=1, **settings)
    return spec


def cache(spec, encoders):
    """CacheLatents of spec with encoders (VAE, CLIP), read back as the engine's CachedDataset."""
    (out,) = cache_node.PipeTrainCacheLatents().cache(dataset=spec, vae=encoders[0], clip=encoders[1],
                                                      regenerate=False)
    return CachedDataset(out.cache_dir)
