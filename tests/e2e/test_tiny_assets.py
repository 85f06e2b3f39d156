"""The tiny random-init files load through ComfyUI's own loaders, in-process and in a real server.

Everything else (cache, training, the demo graph) builds on these files, so this pins down what
they promise: SD15 detection, a TAESD that round-trips colours, finite CLIP conditioning, and a
stock txt2img graph that renders a non-constant PNG.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from PIL import Image

from tools.comfy_server import ComfyError, ComfyInterrupted
from tools import tiny_assets


def _model_file(demo_base, folder, key):
    return os.path.join(demo_base["base_dir"], "models", folder, demo_base[key])


def _dataset_pixels(demo_base) -> torch.Tensor:
    """The demo images as ComfyUI's IMAGE: [B, H, W, 3] floats in [0, 1]."""
    stems = sorted(f[:-4] for f in os.listdir(demo_base["dataset"]) if f.endswith(".png"))
    images = [np.asarray(Image.open(os.path.join(demo_base["dataset"], s + ".png")).convert("RGB")) for s in stems]
    return torch.from_numpy(np.stack(images).astype(np.float32) / 255.0)


# ---------------------------------------------------------------- in-process, ComfyUI's own loaders

@torch.no_grad()
def test_unet_detected_as_sd15_and_well_behaved(demo_base):
    import comfy.sd
    import comfy.supported_models

    patcher = comfy.sd.load_diffusion_model(_model_file(demo_base, "diffusion_models", "unet"))
    assert type(patcher.model.model_config) is comfy.supported_models.SD15
    model = patcher.model
    gen = torch.Generator().manual_seed(0)
    context = torch.randn(2, 77, 768, generator=gen)
    clean = torch.randn(2, 4, 8, 8, generator=gen)
    for sigma in (14.6, 1.0, 0.05):
        noisy = clean + sigma * torch.randn(2, 4, 8, 8, generator=gen)
        s = torch.full((2,), sigma)
        eps = (noisy - model.apply_model(noisy, s, c_crossattn=context)) / sigma
        eps_other = (noisy - model.apply_model(noisy.flip(-1), s, c_crossattn=context)) / sigma
        assert torch.isfinite(eps).all()
        assert 0.3 < eps.std().item() < 3.0, f"prediction scale at sigma {sigma}"
        # The output layer is not zero-initialised: the prediction depends on the input.
        assert (eps - eps_other).std().item() > 0.1


@torch.no_grad()
def test_taesd_encodes_to_sd1_latents_and_decodes_back(demo_base):
    import comfy.latent_formats
    import comfy.sd
    import comfy.taesd.taesd
    import comfy.utils

    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(_model_file(demo_base, "vae", "vae")))
    assert isinstance(vae.first_stage_model, comfy.taesd.taesd.TAESD)
    pixels = _dataset_pixels(demo_base)
    latent = vae.encode(pixels[:1])
    assert latent.shape == (1, 4, 8, 8) and torch.isfinite(latent).all()
    # In the model's space (what training sees) the latents are of order 1, as for real SD.
    model_space = comfy.latent_formats.SD15().process_in(vae.encode(pixels))
    assert 0.3 < model_space.std().item() < 3.0
    decoded = vae.decode(latent)
    assert decoded.shape == (1, 64, 64, 3) and torch.isfinite(decoded).all()
    # The colour path makes decode(encode(x)) the 8x8 block average of x, nothing saturated.
    blocks = torch.nn.functional.avg_pool2d(pixels[:1].movedim(-1, 1), 8)
    expected = blocks.repeat_interleave(8, 2).repeat_interleave(8, 3).movedim(1, -1)
    assert (decoded - expected).abs().mean().item() < 0.05


@torch.no_grad()
def test_clip_gives_finite_prompt_dependent_conditioning(demo_base):
    import comfy.sd

    clip = comfy.sd.load_clip([_model_file(demo_base, "text_encoders", "clip")],
                              clip_type=comfy.sd.CLIPType.STABLE_DIFFUSION)
    conds = [clip.encode_from_tokens_scheduled(clip.tokenize(text))[0][0] for text in ("a red square", "a blue circle")]
    for cond in conds:
        assert cond.shape == (1, 77, 768) and torch.isfinite(cond).all()
    assert (conds[0] - conds[1]).abs().mean().item() > 0.05


def test_dataset_has_distinct_captioned_images(demo_base):
    files = sorted(os.listdir(demo_base["dataset"]))
    pngs = [f for f in files if f.endswith(".png")]
    assert len(pngs) == 8 and all(f[:-4] + ".txt" in files for f in pngs)
    captions = {open(os.path.join(demo_base["dataset"], f[:-4] + ".txt"), encoding="utf-8").read().strip() for f in pngs}
    assert len(captions) == 8
    pixels = _dataset_pixels(demo_base)
    assert pixels.shape == (8, 64, 64, 3) and len({p.numpy().tobytes() for p in pixels}) == 8


def test_same_seed_same_bytes_and_rerun_keeps_files(demo_base, tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        tiny_assets.write_tiny_vae(str(tmp_path / f"{name}.safetensors"), seed=seed)
    data = {n: (tmp_path / f"{n}.safetensors").read_bytes() for n in "abc"}
    assert data["a"] == data["b"] != data["c"]
    unet = _model_file(demo_base, "diffusion_models", "unet")
    before = os.stat(unet).st_mtime_ns
    assert tiny_assets.write_demo_base(demo_base["base_dir"]) == demo_base
    assert os.stat(unet).st_mtime_ns == before  # the stamp says it is current: not rewritten


# ---------------------------------------------------------------- a real server, the stock graph

def _txt2img_prompt(demo_base, unet=None) -> dict:
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet or demo_base["unet"], "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": demo_base["clip"], "type": "stable_diffusion"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red circle on a blue background", "clip": ["2", 0]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "6": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "positive": ["3", 0], "negative": ["4", 0], "latent_image": ["5", 0],
            "seed": 0, "steps": 4, "cfg": 2.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0}},
        "7": {"class_type": "VAELoader", "inputs": {"vae_name": demo_base["vae"]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["7", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "tiny_assets_test"}},
    }


@pytest.mark.slow
def test_stock_txt2img_graph_renders_in_real_server(comfy_server, demo_base):
    assert comfy_server.object_info("KSampler")
    assert comfy_server.object_info("NoSuchNodeClass") == {}
    entry = comfy_server.run(_txt2img_prompt(demo_base), timeout=60)
    paths = comfy_server.image_paths(entry)
    assert len(paths) == 1 and os.path.isfile(paths[0])
    image = np.asarray(Image.open(paths[0]).convert("RGB"))
    assert image.shape == (64, 64, 3) and image.std() > 1.0


@pytest.mark.slow
def test_server_errors_are_reported(comfy_server, demo_base):
    # Rejected at validation: the exception carries the server's node_errors.
    with pytest.raises(ComfyError, match="node_errors.*not in list"):
        comfy_server.queue(_txt2img_prompt(demo_base, unet="missing.safetensors"))
    # Accepted, then failing while running: the exception carries ComfyUI's exception_message.
    bogus = os.path.join(demo_base["base_dir"], "models", "diffusion_models", "not-a-model.safetensors")
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(2)}, bogus)
    try:
        with pytest.raises(ComfyError, match="UNETLoader.*Could not detect model type"):
            comfy_server.run(_txt2img_prompt(demo_base, unet="not-a-model.safetensors"), timeout=60)
    finally:
        os.remove(bogus)


@pytest.mark.slow
def test_interrupt_stops_a_running_prompt(comfy_server, demo_base):
    prompt = _txt2img_prompt(demo_base)
    prompt["6"]["inputs"].update(steps=2000, seed=1)  # minutes of sampling unless interrupted
    prompt_id = comfy_server.queue(prompt)
    deadline = time.monotonic() + 30
    while prompt_id not in comfy_server.running_prompt_ids():
        assert time.monotonic() < deadline, "the prompt never started"
        time.sleep(0.1)
    time.sleep(0.5)  # past the start of execution, which resets the interrupt flag
    start = time.monotonic()
    comfy_server.interrupt()
    with pytest.raises(ComfyInterrupted):
        comfy_server.wait(prompt_id, timeout=30)
    assert time.monotonic() - start < 10
