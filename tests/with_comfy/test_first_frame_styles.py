"""Image-to-video first-frame conditioning in every style CacheLatents offers (engine/cache/first_frame.py):
what the cache stores equals what ComfyUI's own image-to-video node gives the sampler for the same
start frame, and it reaches the model of the family that reads it.

The VAE is ComfyUI's TAEHV with random weights (a 16-channel causal video VAE, as in
test_video_dataset.py); the nodes are called as ComfyUI runs them (their execute methods).
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from media_writers import write_video
from pack import load_pack
from test_video_dataset import encoders  # noqa: F401 - the fixture

load_pack()
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
from PipeTrain.engine.cache.first_frame import STYLES, style_mismatch  # noqa: E402
from PipeTrain.engine.data.video import load_video  # noqa: E402

SIZE, FRAMES = 64, 5  # 5 frames -> 2 latent frames of 8x8


def _cache(tmp_path, encoders, style):  # noqa: F811
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    video_vae, _, clip = encoders
    write_video(tmp_path / "fade.mkv", FRAMES, size=(SIZE, SIZE))
    (spec,) = PipeTrainLoadDataset().load(folders=str(tmp_path), resolution=SIZE, repeats=1, video_frames=FRAMES)
    (cache,) = PipeTrainCacheLatents().cache(dataset=spec, vae=video_vae, clip=clip, regenerate=False,
                                             first_frame_conditioning=True, first_frame_style=style)
    frames = torch.from_numpy(load_video(str(tmp_path / "fade.mkv"), (SIZE, SIZE), FRAMES))
    return cache, CachedDataset(cache.cache_dir)[0], frames


def _node_output(name, **kwargs):
    """A ComfyUI image-to-video node's outputs, called as ComfyUI calls it."""
    import importlib

    module, cls = name.split(".")
    return getattr(importlib.import_module(f"comfy_extras.{module}"), cls).execute(**kwargs).args


def test_wan_concat_is_what_wan_image_to_video_gives(encoders, tmp_path):  # noqa: F811
    video_vae, _, _ = encoders
    _, item, frames = _cache(tmp_path, encoders, "wan_concat")
    cond = [[torch.zeros(1, 4, 8), {}]]
    positive, _, _ = _node_output("nodes_wan.WanImageToVideo", positive=cond, negative=cond, vae=video_vae,
                                  width=SIZE, height=SIZE, length=FRAMES, batch_size=1, start_image=frames[:1])
    want = positive[0][1]
    torch.testing.assert_close(item["extras"]["concat_latent_image"], want["concat_latent_image"][0])
    torch.testing.assert_close(item["extras"]["concat_mask"], want["concat_mask"][0])


def test_start_frame_concat_is_what_hunyuan_image_to_video_v1_gives(encoders, tmp_path):  # noqa: F811
    """HunyuanImageToVideo "v1 (concat)" stores the start frame's one latent frame; the cache stores it
    zero-padded to the clip (as HunyuanVideo15ImageToVideo does). The I2V model pads the short one with
    zeros itself, so both give the model the same input channels."""
    video_vae, _, _ = encoders
    _, item, frames = _cache(tmp_path, encoders, "start_frame_concat")
    cond = [[torch.zeros(1, 4, 8), {}]]
    positive, _ = _node_output("nodes_hunyuan.HunyuanImageToVideo", positive=cond, vae=video_vae, width=SIZE,
                               height=SIZE, length=FRAMES, batch_size=1, guidance_type="v1 (concat)",
                               start_image=frames[:1])
    want = positive[0][1]
    stored = item["extras"]["concat_latent_image"]
    assert stored.shape == item["latent"].shape and want["concat_latent_image"].shape[2] == 1
    torch.testing.assert_close(stored[:, :1], want["concat_latent_image"][0])
    assert stored[:, 1:].abs().max() == 0
    torch.testing.assert_close(item["extras"]["concat_mask"], want["concat_mask"][0])

    family = next(f for f in fc.FAMILIES if f.name == "hunyuan_video")
    import comfy.supported_models

    model = comfy.supported_models.HunyuanVideoI2V(dict(family.config, in_channels=33)).get_model({})
    noise = torch.randn((1, *item["latent"].shape))

    def c_concat(extras):
        return model.concat_cond(noise=noise, device="cpu", **extras)

    ours = c_concat({k: v.unsqueeze(0) for k, v in item["extras"].items()})
    torch.testing.assert_close(ours, c_concat(want))
    assert ours.shape == (1, 17, 2, 8, 8)  # 16 image channels + the inverted mask


@pytest.mark.parametrize("style,node,kwargs", [
    ("clean_first_frame", "nodes_cosmos.CosmosPredict2ImageToVideoLatent", {}),
    ("hunyuan_video_replace", "nodes_hunyuan.HunyuanImageToVideo", {"guidance_type": "v2 (replace)"}),
])
def test_a_clean_first_frame_is_what_the_latent_nodes_give(encoders, tmp_path, style, node, kwargs):  # noqa: F811
    """These nodes put the start frame's own encoding into the latent and keep it by a noise mask. The
    cache keeps the clip's first latent frame: for a causal video VAE the same tensor."""
    video_vae, _, _ = encoders
    _, item, frames = _cache(tmp_path, encoders, style)
    args = dict(vae=video_vae, width=SIZE, height=SIZE, length=FRAMES, batch_size=1, start_image=frames[:1], **kwargs)
    if style == "hunyuan_video_replace":
        positive, latent = _node_output(node, positive=[[torch.zeros(1, 4, 8), {}]], **args)
        assert positive[0][1] == {"guiding_frame_index": 0}
        assert item["extras"]["guiding_frame_index"] == 0
    else:
        (latent,) = _node_output(node, **args)
    torch.testing.assert_close(item["extras"]["denoise_mask"], latent["noise_mask"][0])
    torch.testing.assert_close(item["latent"][:, :1], latent["samples"][0, :, :1], atol=1e-5, rtol=1e-4)
    assert "concat_latent_image" not in item["extras"]


@pytest.mark.parametrize("style,family,supported,changes", [
    ("clean_first_frame", "cosmos_predict2", "CosmosI2VPredict2", dict(in_channels=17)),
    ("clean_first_frame", "cosmos1", "CosmosI2V", dict(in_channels=17)),
    ("hunyuan_video_replace", "hunyuan_video", "HunyuanVideo", {}),
    ("start_frame_concat", "hunyuan_video", "HunyuanVideoI2V", dict(in_channels=33)),
])
def test_each_style_trains_the_family_that_reads_it(encoders, tmp_path, style, family, supported, changes):  # noqa: F811
    """One training step from the cached item: the start frame stays clean in the noised input where a
    noise mask keeps it, the model takes what the style stores, and the loss backpropagates."""
    import comfy.supported_models
    from PipeTrain.engine.train.objective import DiffusionObjective
    from trainable import make_trainable

    assert style_mismatch(style, supported) is None
    _, item, _ = _cache(tmp_path, encoders, style)
    fam = next(f for f in fc.FAMILIES if f.name == family)
    model = getattr(comfy.supported_models, supported)(dict(fam.config, **changes)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    extras = {**item["extras"], **({"guidance": 6.0, "pooled_output": torch.zeros(32)} if family == "hunyuan_video"
                                   else {})}
    conds = [{"cross_attn": torch.randn(4, fam.text_width), "extras": extras}]
    latents = item["latent"].unsqueeze(0)
    make_trainable(model, latents, conds)  # as engine/train/loop.py does (HunyuanVideo's blocks add in place)
    objective = DiffusionObjective(model, seed=0)
    prepared = objective.prepare(latents, conds, [0])
    if "denoise_mask" in item["extras"]:
        # the start frame carries no noise: it is what the model's scale_latent_inpaint makes of the clean
        # latent (HunyuanVideo: the latent itself; Cosmos: rescaled for its sigma), as in ComfyUI's sampler
        x0 = model.process_latent_in(latents)
        kept = model.scale_latent_inpaint(sigma=prepared.sigma, noise=x0, latent_image=x0)
        torch.testing.assert_close(prepared.xt[:, :, :1], kept[:, :, :1])
        assert not torch.allclose(prepared.xt[:, :, 1:], kept[:, :, 1:])
    if style == "start_frame_concat":
        assert prepared.kwargs["c_concat"].shape == (1, 17, 2, 8, 8)
    if style == "hunyuan_video_replace":
        assert "guiding_frame_index" in prepared.kwargs
    model.diffusion_model.requires_grad_(True)  # newer ComfyUI builds the model frozen; the test backpropagates into it
    loss = objective(latents, conds, [0])
    loss.backward()
    assert torch.isfinite(loss)


def test_every_style_is_offered_keyed_and_the_model_table_names_real_classes(encoders):  # noqa: F811
    import comfy.supported_models
    from PipeTrain.engine.cache.items import ItemOptions
    from PipeTrain.engine.cache.encoders import cache_identity
    from PipeTrain.engine.cache.first_frame import MODEL_STYLES
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents

    offered = PipeTrainCacheLatents.INPUT_TYPES()["optional"]["first_frame_style"][0]
    assert offered == list(STYLES)
    assert all(hasattr(comfy.supported_models, name) for name in MODEL_STYLES)
    assert all(s in STYLES for styles in MODEL_STYLES.values() for s in styles)
    assert "turn first_frame_conditioning off" in style_mismatch("wan_concat", "WAN21_T2V")
    assert "set Cache Latents' first_frame_style to 'clean_first_frame'" in style_mismatch("wan_concat", "LTXV")
    assert style_mismatch("clean_first_frame", "Flux") is None  # classes the table does not know are not checked
    # the style is part of the cache key; the default adds nothing, so caches made before styles existed match
    video_vae, _, clip = encoders
    wan = cache_identity(video_vae, clip, ItemOptions("wan_concat"))
    assert wan == {**cache_identity(video_vae, clip, ItemOptions()), "first_frame_conditioning": True}
    assert cache_identity(video_vae, clip, ItemOptions("clean_first_frame")) == {
        **wan, "first_frame_style": "clean_first_frame"}
