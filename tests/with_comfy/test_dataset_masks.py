"""Loss masks (LoadDataset's mask_folder) from the folder to the loss.

Real files, the pack's LoadDataset/CacheLatents node functions with the tiny ComfyUI VAE + CLIP,
the tiny SD1.5-class UNet loaded by ComfyUI, and the engine's own collate/objective: the masked
loss is exactly the hand-computed masked mean, black cells get no gradient, every bad mask is
listed by name and counted, and editing a mask re-caches.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from pack import load_pack
from PIL import Image

load_pack()
import PipeTrain.nodes.load_dataset as load_node
from PipeTrain.engine.train.sample_order import SampleStream, collate
from PipeTrain.engine.data.pairs import load_mask
from PipeTrain.engine.train.objective import (
    DiffusionObjective,
    native_loss,
    transformer_options,
)
from side_folders import RES, cache, image_folders, info_log, load_spec, tiny_encoders


@pytest.fixture(scope="module")
def encoders(demo_base):
    yield from tiny_encoders(demo_base)


@pytest.fixture(scope="module")
def unet(demo_base):
    import comfy.sd

    return comfy.sd.load_diffusion_model(str(Path(demo_base["base_dir"]) / "models" / "diffusion_models" /
                                             demo_base["unet"])).model


@pytest.fixture
def logs(caplog):
    return info_log(caplog)


def half_black(path, size=(RES, RES), mode="L"):
    """Left half black (weight 0), right half white (weight 1)."""
    arr = np.zeros((size[1], size[0]), dtype=np.uint8)
    arr[:, size[0] // 2:] = 255
    Image.fromarray(arr).convert(mode).save(path)


def dataset(tmp_path, names=("a", "b")) -> tuple[Path, Path]:
    return image_folders(tmp_path, "masks", names, "picture {name}")


def load(data, masks, **kw):
    return load_spec(data, mask_folder=str(masks), **kw)


def test_mask_modes_become_grey_weights_at_latent_size(tmp_path):
    half_black(tmp_path / "l.png")
    half_black(tmp_path / "rgb.jpg", mode="RGB")  # JPEG: nearly 0/1, ringing at the edge
    half_black(tmp_path / "one.png", mode="1")
    arr = np.zeros((RES, RES), dtype=np.uint16)
    arr[:, RES // 2:] = 65535
    Image.fromarray(arr).save(tmp_path / "deep.png")  # 16-bit grey
    rgba = np.full((RES, RES, 4), 255, dtype=np.uint8)
    rgba[:, : RES // 2, 3] = 0  # white everywhere, but the left half is transparent: counts as black
    Image.fromarray(rgba, "RGBA").save(tmp_path / "alpha.png")
    Image.new("L", (RES, RES), 128).save(tmp_path / "grey.png")
    want = np.zeros((8, 8), dtype=np.float32)
    want[:, 4:] = 1.0
    for name in ("l.png", "one.png", "deep.png", "alpha.png"):
        np.testing.assert_array_equal(load_mask(str(tmp_path / name), (RES, RES), (RES, RES), (8, 8)), want,
                                      err_msg=name)
    np.testing.assert_allclose(load_mask(str(tmp_path / "rgb.jpg"), (RES, RES), (RES, RES), (8, 8)), want, atol=0.05)
    np.testing.assert_allclose(load_mask(str(tmp_path / "grey.png"), (RES, RES), (RES, RES), (8, 8)), 128 / 255)
    # a 32x16 mask of a 128x64 image is stretched to it, then center-cropped like the image (to 64x64)
    small = np.zeros((16, 32), dtype=np.uint8)
    small[:, 16:] = 255  # the image's right half
    Image.fromarray(small).save(tmp_path / "small.png")
    got = load_mask(str(tmp_path / "small.png"), (128, 64), (RES, RES), (8, 8))
    # the crop keeps image x 32..96, white from x 64: the right half of the latent (edge cells blurred by the stretch)
    assert got[:, :3].max() < 0.05 and got[:, 5:].min() > 0.95 and 0.3 < got[0, 3:5].mean() < 0.7


def test_masked_loss_is_the_hand_computed_masked_mean_and_black_gets_no_gradient(tmp_path, encoders, unet, logs):
    data, masks = dataset(tmp_path)
    half_black(masks / "a.png")  # b has no mask: trains unmasked
    ds = cache(load(data, masks), encoders)
    assert "masks: 1 image(s) with one, 1 without (trained unmasked), 0 skipped" in logs()
    assert "have no mask in mask_folder" in logs() and str(data / "b.png") in logs()
    items = {it["source"]: it for it in ds}
    want = torch.zeros(1, 8, 8)
    want[..., 4:] = 1.0
    assert torch.equal(items["a.png"]["loss_mask"], want) and "loss_mask" not in items["b.png"]
    assert ds.buckets()[0] == ds.buckets()[1]  # masked and unmasked items may share a batch

    order = [s for s in (ds[i]["source"] for i in range(len(ds)))]
    latents, conds, _ = collate(ds, SampleStream([1, 1], seed=0), [0, 1], torch.device("cpu"))
    stream = SampleStream([1, 1], seed=0)
    sources = [order[stream.item_at(p)] for p in (0, 1)]
    objective = DiffusionObjective(unet, seed=0)
    prepared = objective.prepare(latents, conds, [0, 1])
    with torch.no_grad():
        denoised = unet.apply_model(prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma),
                                    **prepared.kwargs)
    denoised.requires_grad_(True)
    loss = native_loss(denoised, prepared.x0, prepared.scale, prepared.weight)
    sq = ((denoised.detach() - prepared.x0) / prepared.scale) ** 2  # [2, 4, 8, 8]
    a = sources.index("a.png")
    by_hand = (sq[a][..., 4:].sum() + sq[1 - a].sum()) / (sq[a][..., 4:].numel() + sq[1 - a].numel())
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)
    assert loss.item() != pytest.approx(sq.mean().item(), rel=1e-3)  # the mask changed it
    loss.backward()
    assert torch.all(denoised.grad[a][..., :4] == 0)  # black: no gradient at all
    assert torch.all(denoised.grad[a][..., 4:] != 0) and torch.all(denoised.grad[1 - a] != 0)

    # alone, the masked item's loss is the mean over its white half
    only_a = [conds[a]]
    prep_a = objective.prepare(latents[a:a + 1], only_a, [0])
    with torch.no_grad():
        out = unet.apply_model(prep_a.xt, prep_a.sigma, transformer_options=transformer_options(prep_a.sigma),
                               **prep_a.kwargs)
    err = ((out - prep_a.x0) / prep_a.scale) ** 2
    assert native_loss(out, prep_a.x0, prep_a.scale, prep_a.weight).item() == \
        pytest.approx(err[..., 4:].mean().item(), rel=1e-6)


def test_bad_masks_are_listed_counted_and_never_crash(tmp_path, encoders, logs):
    data, masks = dataset(tmp_path, names=("a", "b", "c", "d", "e"))
    half_black(masks / "a.png", size=(32, 48))  # another size and aspect: stretched, listed
    (masks / "b.png").write_bytes(b"")  # zero bytes: b is skipped
    (masks / "c.jpg").write_bytes(b"not a jpeg at all")  # unreadable: c is skipped
    half_black(masks / "D.webp")  # name differs only in case: used
    half_black(masks / "a_mask.png")  # matches no image: listed as unused
    spec = load(data, masks)
    text = logs()
    assert "masks: 2 image(s) with one, 1 without (trained unmasked), 2 skipped (unreadable mask)" in text
    assert f"{masks / 'a.png'} (32x48 for an image of 64x64)" in text and "stretched" in text
    assert f"{masks / 'b.png'} is empty (0 bytes)" in text and str(masks / "c.jpg") in text
    assert "2 mask(s) cannot be read, so their images are skipped" in text
    assert "1 image(s) have no mask" in text and str(data / "e.png") in text
    assert "match no dataset image and are unused" in text and str(masks / "a_mask.png") in text
    ds = cache(spec, encoders)
    assert sorted(it["source"] for it in ds) == ["a.png", "d.png", "e.png"]
    assert sorted(it["source"] for it in ds if "loss_mask" in it) == ["a.png", "d.png"]


def test_editing_a_mask_recaches_and_masks_are_in_the_signature(tmp_path, encoders):
    data, masks = dataset(tmp_path, names=("a",))
    half_black(masks / "a.png")
    spec = load(data, masks)
    signature = load_node.files_signature(spec)
    first = cache(spec, encoders)
    plain = cache(load_node.build_spec(str(data), RES, 1), encoders)  # no mask folder: its own cache
    assert plain.fingerprint != first.fingerprint and "loss_mask" not in plain[0]

    arr = np.full((RES, RES), 255, dtype=np.uint8)
    arr[:, : RES // 4] = 0
    Image.fromarray(arr).save(masks / "a.png")
    os.utime(masks / "a.png", ns=(1, 1_000_000_000))  # a clearly different mtime, even on coarse clocks
    spec = load(data, masks)
    assert load_node.files_signature(spec) != signature  # IS_CHANGED: ComfyUI runs the node again
    second = cache(spec, encoders)
    assert second.fingerprint != first.fingerprint
    assert second[0]["loss_mask"][..., :2].max() == 0 and second[0]["loss_mask"][..., 2:].min() == 1


def test_mask_folder_errors_name_the_setting(tmp_path):
    data, _ = dataset(tmp_path, names=("a",))
    with pytest.raises(load_node.DatasetError, match="mask_folder .*nope does not exist.*fix LoadDataset's 'mask_folder'"):
        load(data, tmp_path / "nope")
    with pytest.raises(load_node.DatasetError, match="mask_folder .* is also a dataset folder"):
        load(data, data)
