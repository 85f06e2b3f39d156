"""engine/latent_fit.py on ComfyUI's own latent formats: which cache channel counts each model takes
(the one rule nodes/preflight.py, engine/train/loop.py and engine/train/eval_set.py share)."""
import importlib

import pytest

import family_configs as fc
from PipeTrain.engine.latent_fit import accepted_channels, packed_latent_missing, wanted_latents

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def formats(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    import comfy.latent_formats

    return comfy.latent_formats


def test_hunyuan_image_21_refiner_takes_32_channels_it_packs_into_64(formats):
    refiner = formats.HunyuanImage21Refiner()
    assert refiner.latent_channels == 64
    assert accepted_channels(refiner, (32, 1, 8, 8)) == (32,)  # one image frame, packed with itself
    assert accepted_channels(refiner, (64, 3, 8, 8)) == (32,)  # the channels asked about do not matter
    assert wanted_latents(refiner, (64, 1, 8, 8)) == "32-channel latents (packed into 64)"
    assert accepted_channels(refiner, (32, 2, 8, 8)) == ()  # an even frame count cannot pair with the first


def test_a_cache_of_another_layout_is_told_the_layout_the_model_takes(formats):
    assert accepted_channels(formats.Wan21(), (16, 8, 8)) == ()  # an image cache for a video model
    assert wanted_latents(formats.Wan21(), (16, 8, 8)) == "16-channel latents shaped (channels, frames, height, width)"
    assert wanted_latents(formats.HunyuanImage21Refiner(), (32, 2, 8, 8)) == \
        "32-channel latents (packed into 64) shaped (channels, frames, height, width)"


@pytest.mark.parametrize("name,shape,channels", [
    ("SD15", (4, 8, 8), 4), ("Flux", (16, 8, 8), 16), ("Wan21", (16, 3, 8, 8), 16), ("Wan22", (48, 3, 8, 8), 48),
    ("HunyuanImage21", (64, 8, 8), 64), ("LTXV", (128, 2, 4, 4), 128),
])
def test_families_that_keep_the_channels_take_exactly_their_latent_channels(formats, name, shape, channels):
    """Wan's per-channel mean would broadcast a 1-channel latent to 16: process_out must give the shape back."""
    fmt = getattr(formats, name)()
    assert accepted_channels(fmt, shape) == (channels,)
    assert wanted_latents(fmt, shape) == f"{channels}-channel latents"


@pytest.mark.parametrize("family", fc.FAMILIES, ids=[f.name for f in fc.FAMILIES])
def test_every_familys_cached_latents_fit_its_model(formats, family):
    """The raw VAE latent each family's tests cache (tests/family_configs.py) is one its model takes."""
    import comfy.supported_models

    fmt = getattr(comfy.supported_models, family.supported).latent_format()
    assert family.latent[0] in accepted_channels(fmt, family.latent)


@pytest.mark.parametrize("supported", ["MiniMaxH3", "LTXAV"])
def test_a_cache_without_the_packed_audio_video_latent_is_refused_by_name(formats, supported):
    """CacheLatents caches one VAE's latent per item; MiniMax H3 and LTX 2.x (LTXAV) take the packed video +
    audio row (without `latent_shapes` H3's first forward failed with a bare IndexError, LTXAV's takes the
    batch's first item for the video). The class name is ComfyUI's."""
    import family_configs_033 as f33
    import family_configs_033_more as more

    family = next(f for f in f33.FAMILIES + more.FAMILIES if f.supported == supported)
    if not hasattr(importlib.import_module("comfy.supported_models"), supported):
        pytest.skip(f"this ComfyUI has no comfy.supported_models.{supported}")
    model_class = type(fc.build(family)).__name__
    message = packed_latent_missing(model_class, {"pooled_output": None})
    assert message and supported in message and "Cache Latents" in message
    extras = fc.batch(family)[1][0]["extras"]  # the packed latent's conditioning, as the tests train it
    assert packed_latent_missing(model_class, extras) is None
    assert packed_latent_missing("Flux", {}) is None
    assert "audio_vae" in message  # Cache Latents writes the row: the message says how


def test_packed_rows_reach_only_the_models_that_take_them(formats):
    """A [1, N] row for a video model's format passes the channel check (its streams are checked by name); a
    model that does not unpack is told to cache without audio_vae; MiniMax H3 takes a cached audio stream and an
    empty one."""
    av_shapes = [[1, 128, 2, 4, 4], [1, 8, 7, 16]]
    assert accepted_channels(formats.LTXV(), (1, 128 * 2 * 4 * 4 + 8 * 7 * 16)) == (1,)
    message = packed_latent_missing("Flux", {"latent_shapes": av_shapes})
    assert message and "audio_vae" in message and "Flux" in message
    assert packed_latent_missing("LTXAV", {"latent_shapes": av_shapes}) is None
    assert packed_latent_missing("MiniMaxH3", {"latent_shapes": [[1, 24, 2, 4, 4], [1, 32, 2, 5]]}) is None
    assert packed_latent_missing("MiniMaxH3", {"latent_shapes": [[1, 24, 2, 4, 4], [1, 32, 2, 0]]}) is None
