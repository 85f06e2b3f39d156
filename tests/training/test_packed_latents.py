"""A model whose latent format packs the cache's channels: HunyuanImage 2.1's refiner folds 2 frames of
the VAE's 32 channels into the 64 its transformer takes. The node's preflight and the ranks ask the same
function (engine/latent_fit.py) which caches fit, so a 32-channel cache the graph accepts also trains.

The tiny refiner file is detected by ComfyUI itself (hidden size 128: detection reads 1 head of 128, and
rope axes 16+56+56 for a 3-D patch), loaded into ComfyUI's HunyuanImage21Refiner classes, and trained
by the real loop (engine.train.loop.train, the plain backend, in process).
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import memory_runs
import tiny_detected
from PipeTrain.engine.config.eval import EvalSpec
from PipeTrain.engine.config.sections import MemorySpec
from PipeTrain.engine.events import EventLog

pytestmark = pytest.mark.core  # detection and the latent format of the refiner, on each ComfyUI

LATENT = (32, 1, 8, 8)  # one image frame of the refiner's VAE: process_in packs it (with itself) into 64 channels
TEXT_WIDTH = 48


@pytest.fixture(scope="module")
def refiner(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("tiny-refiner")
    model = tiny_detected.write_model(root / "tiny_refiner.safetensors", "hunyuan_image21_refiner", hidden_size=128,
                                      num_heads=1, axes_dim=[16, 56, 56])
    gen = torch.Generator().manual_seed(1)
    extras = {"guidance": 3.5, "noise_augmentation": 0.1,  # as ComfyUI's HunyuanRefinerLatent conditions it
              "concat_latent_image": torch.randn((1, *LATENT), generator=gen)}
    return {"model": str(model), "cache": tiny_detected.write_cache(root / "data", LATENT, TEXT_WIDTH, items=4,
                                                                     extras=extras),
            "wrong": tiny_detected.write_cache(root / "wrong", (64, 1, 8, 8), TEXT_WIDTH, items=2, extras=extras)}


def test_the_refiner_trains_from_a_32_channel_cache(refiner, tmp_path, comfy_root):
    import comfy.sd

    loaded = comfy.sd.load_diffusion_model(refiner["model"]).model
    assert type(loaded).__name__ == "HunyuanImage21Refiner" and loaded.latent_format.latent_channels == 64
    cfg = memory_runs.wan_config(tmp_path / "run", comfy_root, refiner["model"], refiner["cache"], steps=3,
                                 batch_size=2, memory=MemorySpec(base_dtype="float32"))
    cfg = dataclasses.replace(cfg, eval=EvalSpec(cache_dir=refiner["cache"], every=3, before_start=True))
    cfg.validate()
    run = memory_runs.train_in_process(cfg)  # the eval set (engine/train/eval_set.py) takes the 32 channels too
    assert len(run.losses()) == 3 and all(math.isfinite(loss) for loss in run.losses())
    assert [e["step"] for e in run.events if e["event"] == "eval"] == [0, 3]
    assert any(t.abs().sum() > 0 for k, t in run.lora().items() if ".lora_B." in k), "lora_B never moved"


def test_a_cache_with_the_models_own_64_channels_is_refused_naming_the_32_it_takes(refiner, tmp_path, comfy_root):
    from PipeTrain.engine.models.loading import ModelLoadError
    from PipeTrain.engine.train.loop import train

    cfg = memory_runs.wan_config(tmp_path / "run", comfy_root, refiner["model"], refiner["wrong"], steps=1,
                                 batch_size=1, memory=MemorySpec(base_dtype="float32"))
    with pytest.raises(ModelLoadError, match=r"holds 64-channel latents .* expects 32-channel latents \(packed into "
                                             r"64\): cache the dataset with this model's VAE"):
        train(cfg, torch.device("cpu"), EventLog(cfg.run_dir))


def test_the_nodes_preflight_accepts_the_same_cache_and_refuses_the_same_one(refiner):
    """The check before launch (on the file's header) and the ranks (on the loaded model) agree."""
    from PipeTrain.engine.cache.format import CacheSpec
    from PipeTrain.engine.config.checks import ConfigError
    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.nodes import preflight

    def check(cache: str, shape: tuple):
        return preflight.check_model("tiny_refiner", refiner["model"], LoraSpec(),
                                     {"cache": CacheSpec(cache, "f", 2, shape)})

    assert check(refiner["cache"], LATENT).family == "HunyuanImage21Refiner"
    with pytest.raises(ConfigError, match=r"cache holds 64-channel latents.*trains on 32-channel latents "
                                          r"\(packed into 64\)"):
        check(refiner["wrong"], (64, 1, 8, 8))
