"""Control images (LoadDataset's control_folder): edit pairs from the folder to the model.

The pack's LoadDataset/CacheLatents node functions with the tiny ComfyUI VAE + CLIP store each
control image's VAE latent as ComfyUI's ReferenceLatent node gives it (`reference_latents`),
cropped to its target's bucket; a tiny Flux Kontext (ComfyUI's own class) receives it through the
engine's collate/objective and its loss depends on it; bad or missing control images are listed
by name and counted, and their images skipped. With CacheLatents' control_style concat_latent_image
the control latent is what InstructPixToPixConditioning gives (HiDream E1's edit input).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pack import load_pack

load_pack()
import PipeTrain.engine.cache.format as fmt
from PipeTrain.engine.cache.legacy import bucket_key, write_manifest
from PipeTrain.engine.cache.reader import CachedDataset
from PipeTrain.engine.cache.writer import write_item
import PipeTrain.nodes.cache_latents as cache_node
import PipeTrain.nodes.load_dataset as load_node
from PipeTrain.engine.train.conditioning import extra_conds_params
from PipeTrain.engine.train.sample_order import SampleStream, collate
from PipeTrain.engine.data.images import load_image
from PipeTrain.engine.train.objective import DiffusionObjective
from side_folders import RES, cache, image_folders, info_log, load_spec, picture, tiny_encoders


@pytest.fixture(scope="module")
def encoders(demo_base):
    yield from tiny_encoders(demo_base)


@pytest.fixture
def logs(caplog):
    return info_log(caplog)


def pairs(tmp_path, names, size=(RES, RES)) -> tuple[Path, Path]:
    # one caption: its encoding is reused between items
    data, controls = image_folders(tmp_path, "controls", names, "make it red", size)
    for i, name in enumerate(names):
        picture(controls / f"{name}.jpg", 100 + i, size)
    return data, controls


def load(data, controls, **kw):
    return load_spec(data, control_folder=str(controls), **kw)


def test_cached_reference_is_the_vae_encoding_of_the_control_cropped_to_the_bucket(tmp_path, encoders, logs):
    data, controls = pairs(tmp_path, ("a", "b"), size=(128, 64))
    picture(controls / "b.jpg", 7, size=(96, 96))  # another aspect: cropped to b's bucket, listed
    spec = load(data, controls, aspect_ratios="1:1, 2:1", bucket_multiple=16)
    assert "control images: 2 image(s) with one, 0 skipped" in logs()
    assert f"{controls / 'b.jpg'} (96x96 for an image of 128x64)" in logs()
    ds = cache(spec, encoders)
    vae = encoders[0]
    refs = []
    for i, entry in enumerate(ds.items):
        item = ds[i]
        size = tuple(entry["size"])
        assert size[0] > size[1] and size != (RES, RES)  # the 2:1 bucket, not the square
        want = vae.encode(torch.from_numpy(load_image(str(controls / item["source"].replace(".png", ".jpg")),
                                                      size)).unsqueeze(0))[0]
        got = item["extras"]["reference_latents.0"]
        assert got.shape == item["latent"].shape and torch.allclose(got, want, atol=1e-4)
        refs.append(got)
    assert not torch.allclose(refs[0], refs[1])  # the second item did not inherit the first's (shared caption)
    latents, conds, _ = collate(ds, SampleStream([1, 1], seed=0), [0], torch.device("cpu"))
    restored = extra_conds_params(conds[0], latents.ndim)["reference_latents"]  # as ReferenceLatent gives it
    assert isinstance(restored, list) and len(restored) == 1 and restored[0].shape == latents.shape


def test_missing_and_broken_control_images_skip_their_image_by_name(tmp_path, encoders, logs):
    data, controls = pairs(tmp_path, ("a", "b", "c", "d"))
    (controls / "b.jpg").unlink()  # missing: b skipped
    (controls / "c.jpg").write_bytes(b"")  # zero bytes: c skipped
    (controls / "d.jpg").write_bytes(b"<html>oops</html>")  # not an image: d skipped
    picture(controls / "orphan.png", 9)
    spec = load(data, controls)
    text = logs()
    assert "control images: 1 image(s) with one, 3 skipped (control image missing or unreadable)" in text
    assert "1 image(s) have no control image in control_folder and are skipped" in text and str(data / "b.png") in text
    assert "2 control image(s) cannot be read" in text
    assert f"{controls / 'c.jpg'} is empty (0 bytes)" in text and f"{controls / 'd.jpg'} is really a web page" in text
    assert str(controls / "orphan.png") in text and "match no dataset image" in text
    ds = cache(spec, encoders)
    assert [it["source"] for it in ds] == ["a.png"]

    for name in ("a.jpg", "orphan.png"):
        (controls / name).unlink()
    with pytest.raises(load_node.DatasetError, match="no image of the dataset has a usable control image"):
        load(data, controls)
    with pytest.raises(load_node.DatasetError, match="control_folder .* is also a dataset folder"):
        load(data, data)


class _At:
    """A sample stream that always yields one item (collate reads only item_at)."""

    def __init__(self, index: int):
        self.index = index

    def item_at(self, position: int) -> int:
        return self.index


def test_a_tiny_flux_kontext_receives_the_cached_reference_latent(tmp_path, comfy_root):
    """Items written the way CacheLatents writes them (control_extras) reach Kontext's forward as ref_latents."""
    from PipeTrain.engine.cache.items import control_extras

    import family_configs as fc

    family = next(f for f in fc.FAMILIES if f.name == "flux_kontext")
    model = fc.build(family)
    g = torch.Generator().manual_seed(0)
    latent, ref = torch.randn(1, 16, 8, 8, generator=g), torch.randn(1, 16, 8, 8, generator=g)
    cond = torch.randn(1, fc.T, family.text_width, generator=g)
    extras = {"pooled_output": torch.randn(1, 32, generator=g), "guidance": 2.5}

    class Encoder:  # stands in for the VAE: the control image's latent is `ref`
        def encode(self, pixels):
            return ref

    control = torch.zeros(1, RES, RES, 3)
    write_item(tmp_path, 0, latent, cond, {**extras, **control_extras("reference_latents", Encoder(), control)},
                   "a.png", "", 1)
    write_item(tmp_path, 1, latent, cond, extras, "b.png", "", 1)  # the same item without a control image
    write_manifest(tmp_path, "0" * 16, load_node.DatasetSpec(folders=(), resolution=RES),
                       [{"file": f"items/00000{i}.safetensors", "source": "x", "repeats": 1, "size": [RES, RES],
                         "bucket": bucket_key(tmp_path, i)} for i in range(2)], (16, 8, 8), [], {})
    ds = CachedDataset(tmp_path)

    received = []
    forward = model.diffusion_model.forward

    def spy(*args, **kwargs):
        received.append(kwargs.get("ref_latents"))
        return forward(*args, **kwargs)

    model.diffusion_model.forward = spy
    objective = DiffusionObjective(model, seed=0)
    losses = []
    for index in (0, 1):
        latents, conds, _ = collate(ds, _At(index), [0], torch.device("cpu"))
        with torch.no_grad():
            losses.append(objective(latents, conds, [0]).item())
    assert len(received[0]) == 1 and torch.allclose(received[0][0], model.process_latent_in(ref))
    assert received[1] is None
    assert losses[0] != pytest.approx(losses[1], rel=1e-4)  # the reference changes what the model predicts


def test_concat_control_style_is_instruct_pix_to_pix_and_reaches_hidream_e1(tmp_path, encoders):
    """control_style concat_latent_image stores what InstructPixToPixConditioning gives (HiDream E1's
    edit input); a tiny HiDream (ComfyUI's class, 4 latent channels to match the tiny VAE) takes it as
    image_cond, and its loss depends on it."""
    import family_configs as fc
    from comfy_extras.nodes_ip2p import InstructPixToPixConditioning

    data, controls = pairs(tmp_path, ("a",))
    spec = load(data, controls)
    (out,) = cache_node.PipeTrainCacheLatents().cache(dataset=spec, vae=encoders[0], clip=encoders[1],
                                                      regenerate=False, control_style="concat_latent_image")
    assert out.cache_dir != cache(spec, encoders).cache_dir  # the style is part of the cache key
    item = CachedDataset(out.cache_dir)[0]
    pixels = torch.from_numpy(load_image(str(controls / "a.jpg"), (RES, RES))).unsqueeze(0)
    cond = [[torch.zeros(1, 4, 8), {}]]
    positive, _, _ = InstructPixToPixConditioning.execute(positive=cond, negative=cond, pixels=pixels,
                                                          vae=encoders[0]).args
    torch.testing.assert_close(item["extras"]["concat_latent_image"], positive[0][1]["concat_latent_image"][0])
    assert not any(k.startswith("reference_latents") for k in item["extras"])

    family = next(f for f in fc.FAMILIES if f.name == "hidream")
    import comfy.supported_models

    model = comfy.supported_models.HiDream(dict(family.config, in_channels=4, out_channels=4)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    g = torch.Generator().manual_seed(0)
    extras = {**item["extras"], **family.extras(g)}
    text = torch.randn(fc.T, family.text_width, generator=g)
    latents = item["latent"].unsqueeze(0)
    objective = DiffusionObjective(model, seed=0)
    prepared = objective.prepare(latents, [{"cross_attn": text, "extras": extras}], [0])
    torch.testing.assert_close(prepared.kwargs["image_cond"],
                               model.process_latent_in(item["extras"]["concat_latent_image"].unsqueeze(0)))
    loss = objective(latents, [{"cross_attn": text, "extras": extras}], [0])
    other = objective(latents, [{"cross_attn": text, "extras": {**extras, "concat_latent_image": torch.zeros_like(
        item["extras"]["concat_latent_image"])}}], [0])
    assert torch.isfinite(loss) and abs(float(loss) - float(other)) > 1e-6


def test_concat_control_style_and_first_frame_conditioning_are_refused_together(tmp_path, encoders):
    data, controls = pairs(tmp_path, ("a",))
    with pytest.raises(fmt.CacheError, match="would both store concat_latent_image"):
        cache_node.PipeTrainCacheLatents().cache(dataset=load(data, controls), vae=encoders[0], clip=encoders[1],
                                                 regenerate=False, first_frame_conditioning=True,
                                                 control_style="concat_latent_image")
