"""CacheLatents' clip_vision input: each item's first frame (an image item: the image) encoded with
ComfyUI's own CLIP-vision model, cached, and fed to a Wan 2.1 i2v model as clip_fea (what
CLIPVisionEncode -> WanImageToVideo give it when sampling), in-process and through the engine.

The CLIP-vision model is ComfyUI's own comfy.clip_vision.ClipVisionModel built from a tiny config
json (2 layers, 28 px input): ComfyUI's loader (comfy.clip_vision.load) cannot load a tiny file,
because it picks a bundled full-size config json by the number of layers it finds (23, 31 or 48),
so widths of a small file never match. Width 1280 is kept: Wan's img_emb takes ViT-H's 1280.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import family_configs as fc
import tiny_wan
from engine_runs import final_lora, run_to_end
from media_writers import write_video
from PipeTrain.engine.cache.reader import CachedDataset
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, TrainSpec

PENULTIMATE = "clip_vision_output.penultimate_hidden_states"
LAST = "clip_vision_output.last_hidden_state"
TINY_CLIP_VISION = {"model_type": "clip_vision_model", "hidden_size": 1280, "intermediate_size": 64,
                    "num_hidden_layers": 2, "num_attention_heads": 2, "num_channels": 3, "image_size": 28,
                    "patch_size": 14, "projection_dim": 16, "hidden_act": "gelu", "layer_norm_eps": 1e-5}


def tiny_clip_vision(folder: Path, seed: int = 0, **config_changes):
    """A ComfyUI CLIP_VISION object (what Load CLIP Vision gives) with seeded random weights."""
    import comfy.clip_vision

    config = folder / "tiny_clip_vision.json"
    config.write_text(json.dumps({**TINY_CLIP_VISION, **config_changes}), encoding="utf-8")
    model = comfy.clip_vision.ClipVisionModel(str(config))
    fc.init_weights(model.model, seed)
    return model


@pytest.fixture(scope="module")
def encoders(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    from tiny_encoders import random_video_vae, tiny_image_encoders

    d = tmp_path_factory.mktemp("enc")
    _, clip = tiny_image_encoders(d)
    return random_video_vae(), clip, tiny_clip_vision(d)


def _dataset(folder: Path):
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    write_video(folder / "fade.mkv", 5, size=(64, 64))
    arr = np.zeros((48, 64, 3), np.uint8)
    arr[:, :32] = (200, 30, 30)  # left half red, right half blue: center crop and squash differ
    arr[:, 32:] = (30, 30, 200)
    Image.fromarray(arr).save(folder / "still.png")
    (spec,) = PipeTrainLoadDataset().load(folders=str(folder), resolution=64, repeats=1, aspect_ratios="1:1, 4:3",
                                          bucket_multiple=16, video_frames=5, frame_stride=1)
    return spec


def _first_frames(folder: Path, ds: CachedDataset) -> dict[str, torch.Tensor]:
    """Each cached item's first frame [1, H, W, 3], read at its bucket size (8x its latent) as the cache
    writer read it."""
    from PipeTrain.engine.data.images import load_image
    from PipeTrain.engine.data.video import load_video

    out = {}
    for i in range(len(ds)):
        item = ds[i]
        size = (item["latent"].shape[-1] * 8, item["latent"].shape[-2] * 8)
        path = str(folder / item["source"])
        pixels = load_video(path, size, 5) if path.endswith(".mkv") else load_image(path, size)[None]
        out[item["source"]] = torch.from_numpy(np.ascontiguousarray(pixels[:1]))
    return out


def _index(ds: CachedDataset, source: str) -> int:
    return next(i for i in range(len(ds)) if ds[i]["source"] == source)


def _wan_i2v(text_dim: int):
    family = next(f for f in fc.FAMILIES if f.name == "wan21_i2v")
    return fc.build(fc.Family(family.name, family.supported, dict(family.config, text_dim=text_dim), family.latent,
                              text_dim, family.mode))


def test_cached_clip_vision_equals_comfyui_encoding_and_feeds_wan_i2v(encoders, tmp_path):
    from PipeTrain.engine.train.objective import DiffusionObjective, transformer_options
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents

    vae, clip, clip_vision = encoders
    spec = _dataset(tmp_path)
    node = PipeTrainCacheLatents()
    (cache,) = node.cache(dataset=spec, vae=vae, clip=clip, regenerate=False, first_frame_conditioning=True,
                          clip_vision=clip_vision)
    ds = CachedDataset(cache.cache_dir)
    assert sorted(ds[i]["source"] for i in range(len(ds))) == ["fade.mkv", "still.png"]
    frames = _first_frames(tmp_path, ds)
    # both items have the empty caption: the second reuses the first's text cond, never its CLIP vision
    for i in range(len(ds)):
        expected = clip_vision.encode_image(frames[ds[i]["source"]], crop=True)
        torch.testing.assert_close(ds[i]["extras"][PENULTIMATE], expected.penultimate_hidden_states[0])
        torch.testing.assert_close(ds[i]["extras"][LAST], expected.last_hidden_state[0])
    assert ds[0]["extras"][PENULTIMATE].shape == (5, 1280)  # class token + 2x2 patches of 14 px
    assert not torch.allclose(ds[0]["extras"][PENULTIMATE], ds[1]["extras"][PENULTIMATE])

    # the vision model and its crop are part of the cache key; crop "none" squashes the frame instead
    (squashed,) = node.cache(dataset=spec, vae=vae, clip=clip, regenerate=False, first_frame_conditioning=True,
                             clip_vision=clip_vision, clip_vision_crop="none")
    (plain,) = node.cache(dataset=spec, vae=vae, clip=clip, regenerate=False, first_frame_conditioning=True)
    assert len({cache.cache_dir, squashed.cache_dir, plain.cache_dir}) == 3
    still = _index(ds, "still.png")
    wide = CachedDataset(squashed.cache_dir)[still]["extras"][PENULTIMATE]
    squashed_expected = clip_vision.encode_image(frames["still.png"], crop=False).penultimate_hidden_states[0]
    torch.testing.assert_close(wide, squashed_expected)
    assert not torch.allclose(wide, ds[still]["extras"][PENULTIMATE])
    assert not any(k.startswith("clip_vision_output") for k in CachedDataset(plain.cache_dir)[0]["extras"])

    # a Wan 2.1 i2v model gets the cached tensor as clip_fea, and its output depends on it
    item = ds[_index(ds, "fade.mkv")]
    model = _wan_i2v(item["cross_attn"].shape[-1])
    objective = DiffusionObjective(model, seed=0)
    latents = item["latent"].unsqueeze(0)

    def denoised(extras):
        p = objective.prepare(latents, [{"cross_attn": item["cross_attn"], "extras": extras}], [0])
        with torch.no_grad():
            return p, model.apply_model(p.xt, p.sigma, transformer_options=transformer_options(p.sigma), **p.kwargs)

    prepared, out = denoised(item["extras"])
    assert torch.equal(prepared.kwargs["clip_fea"], item["extras"][PENULTIMATE].unsqueeze(0))
    assert prepared.kwargs["c_concat"].shape == (1, 20, 2, 8, 8)
    # (random, not a constant shift: Wan's img_emb starts with a LayerNorm, which removes that)
    _, other = denoised({**item["extras"], PENULTIMATE: torch.randn_like(item["extras"][PENULTIMATE])})
    assert (out - other).abs().max() > 1e-3, "the cached CLIP vision tokens do not reach the model"


def test_siglip_encoding_reaches_hunyuan_video15_as_last_hidden_state(encoders, tmp_path):
    """HunyuanVideo 1.5 reads last_hidden_state of a SigLIP encoder (all hidden states, post-norm):
    the extras the cache writer stores give it exactly that as clip_fea."""
    from PipeTrain.engine.cache.items import clip_vision_extras
    from PipeTrain.engine.train.objective import DiffusionObjective

    encoder = tiny_clip_vision(tmp_path, model_type="siglip_vision_model", hidden_size=1152, image_mean=[0.5] * 3,
                               image_std=[0.5] * 3)
    image = torch.rand((1, 48, 64, 3), generator=torch.Generator().manual_seed(0))
    stored = {k: v[0] for k, v in clip_vision_extras(encoder, image).items()}  # as the cache holds them
    expected = encoder.encode_image(image, crop=True)
    assert stored[LAST].shape == (4, 1152)  # SigLIP: no class token
    assert not torch.allclose(stored[LAST], stored[PENULTIMATE])

    family = next(f for f in fc.FAMILIES if f.name == "hunyuan_video15_i2v")
    latents, conds = fc.batch(family)
    extras = {k: v for k, v in conds[0]["extras"].items() if k != "clip_vision_output"}
    prepared = DiffusionObjective(fc.build(family), seed=0).prepare(
        latents, [{**conds[0], "extras": {**extras, **stored}}], [0])
    torch.testing.assert_close(prepared.kwargs["clip_fea"], expected.last_hidden_state)


def _engine_files(root: Path, encoders) -> tuple[str, str]:
    """(tiny Wan 2.1 i2v file, a one-clip cache for it). The cache holds a real video latent and the
    cache writer's own first-frame and CLIP-vision extras, plus a random caption embedding at umT5's
    4096 width (the tiny Wan file needs it for ComfyUI's detection; no tiny ComfyUI text encoder has it)."""
    from PipeTrain.engine.cache.legacy import write_manifest
    from PipeTrain.engine.cache.writer import write_item
    from PipeTrain.engine.cache.items import clip_vision_extras
    from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec
    from PipeTrain.engine.cache.first_frame import first_frame_extras
    from PipeTrain.engine.data.video import load_video
    from safetensors.torch import save_file

    vae, _, clip_vision = encoders
    model = tiny_wan.build_base_model(i2v=True)
    state = {k: v.contiguous() for k, v in model.diffusion_model.state_dict().items()}
    for k in ("img_emb.proj.0.weight", "img_emb.proj.4.weight"):  # img_emb's LayerNorms: tiny_wan zeroes
        state[k] = torch.ones_like(state[k])  # them, which would make every CLIP vision input look alike
    save_file(state, str(root / "tiny_wan_i2v.safetensors"))

    video = write_video(root / "fade.mkv", 5, size=(64, 64))
    frames = torch.from_numpy(load_video(str(video), (64, 64), 5))
    with torch.inference_mode():
        latent = vae.encode(frames)
        extras = {**first_frame_extras("wan_concat", vae, frames, latent), **clip_vision_extras(clip_vision, frames)}
    text = torch.randn((1, *tiny_wan.TEXT), generator=torch.Generator().manual_seed(0))
    cache = root / "cache"
    write_item(cache, 0, latent, text, extras, "fade.mkv", "a fade", 1)
    write_manifest(cache, "0" * 16, DatasetSpec(folders=(FolderSpec(str(root)),), resolution=64),
                   [{"file": "items/000000.safetensors", "source": "fade.mkv", "repeats": 1}], list(latent.shape[1:]),
                   ["cross_attn"], {"test": "tiny wan i2v"})
    return str(root / "tiny_wan_i2v.safetensors"), str(cache)


@pytest.mark.slow
def test_engine_trains_wan_i2v_on_cached_clip_vision(encoders, tmp_path, comfy_root):
    import comfy.sd
    from PipeTrain.engine.train.objective import DiffusionObjective

    model_path, cache = _engine_files(tmp_path, encoders)
    run_dir = tmp_path / "run"
    cfg = RunConfig(run_name=run_dir.name, run_dir=str(run_dir), comfyui_root=comfy_root, model_path=model_path,
                    cache_dir=cache, lora=LoraSpec(rank=4, targets="attention_mlp"),
                    train=TrainSpec(steps=2, learning_rate=1e-3, batch_size=1, seed=1), launch=LaunchSpec(num_gpus=1))
    cfg.validate()
    run = run_to_end(cfg)
    losses = run.losses()
    assert len(losses) == 2 and all(np.isfinite(losses)), run.log()
    assert final_lora(run_dir), "no LoRA saved"

    # The first step's loss (LoRA still zero) is the base model's loss on the one cached item, sample 0,
    # with these CLIP vision tokens and not with others: the engine fed the cached ones to the model.
    item = CachedDataset(cache)[0]
    objective = DiffusionObjective(comfy.sd.load_diffusion_model(model_path).model, seed=cfg.train.seed,
                                   timestep_sampling=cfg.train.timestep_sampling)

    def loss(extras):
        with torch.no_grad():
            return float(objective(item["latent"].unsqueeze(0), [{"cross_attn": item["cross_attn"], "extras": extras}],
                                   [0]))

    other = torch.randn(item["extras"][PENULTIMATE].shape, generator=torch.Generator().manual_seed(1))
    assert losses[0] == pytest.approx(loss(item["extras"]), rel=1e-4)
    assert losses[0] != pytest.approx(loss({**item["extras"], PENULTIMATE: other}), rel=1e-3)
