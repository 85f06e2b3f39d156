"""MiniMax H3 with an audio stream (ComfyUI 0.33+): what the network sees and what the loss measures.

The objective sets model.latent_shapes as ComfyUI's sampler does, so the sampler's carried audio (scaled by
audio_scale) reaches the model, which takes it back to the stream's own scale (engine/train/carried_streams.py).
Checked against the network's own input and output (MiniMaxH3Model._forward, spied on):
- the network's audio input is the cached audio noised on the audio's own schedule, sigma_a =
  time_shift_sigma(sigma, 12, 3) (what diffusion-pipe trains H3 on);
- the loss is each stream's own-schedule velocity error, every element weighted alike, computed here from
  the network's outputs;
- a run with audio frames trains (tests/family_configs_033.py `minimax_h3_t2v_audio` runs the family checks);
- training-time samples of H3 and of LTX 2.3 (the other model on packed video + audio rows) sample the pair
  ComfyUI's nodes make of an empty latent and keep its video.
"""
from __future__ import annotations

import family_configs_033 as f33
import pytest
import torch
from trainable import host_module

pytestmark = pytest.mark.core
_AV = next(f for f in f33.FAMILIES if f.name == "minimax_h3_t2v_audio")


@pytest.fixture(autouse=True)
def _host_has_minimax_h3(comfy):
    host_module("comfy.ldm.minimax.model")


def _spied_model():
    import family_configs as fc

    model = f33._minimax_h3(dict(_AV.config))
    fc.init_weights(model.diffusion_model, seed=0)
    seen, forward = {}, model.diffusion_model._forward

    def spy(x, timestep, *args, **kwargs):
        out = forward(x, timestep, *args, **kwargs)
        seen.update(video_in=x[0].detach(), audio_in=x[1].detach(), video_out=out[0].detach(),
                    audio_out=out[1].detach())
        return out
    model.diffusion_model._forward = spy
    return model, seen


@pytest.mark.parametrize("sample_id", [0, 1, 2])
def test_the_network_sees_the_audio_on_its_own_schedule_and_the_loss_is_each_streams_own(sample_id):
    import family_configs as fc
    from comfy.ldm.minimax.model import time_shift_sigma

    from PipeTrain.engine.train.objective import DiffusionObjective

    model, seen = _spied_model()
    latents, conds = fc.batch(_AV)
    objective = DiffusionObjective(model, seed=3)
    batch = objective.prepare(latents, conds, [sample_id])
    with torch.no_grad():
        loss = objective(latents, conds, [sample_id])
    video_shape, audio_shape = (torch.Size((1, *s[1:])) for s in conds[0]["extras"]["latent_shapes"])
    n = video_shape.numel()
    sigma = float(batch.sigma[0])
    sigma_a = float(time_shift_sigma(torch.tensor(sigma), 12.0, 3.0))
    s = model.audio_scale()
    assert s == pytest.approx(4.0) and 0.0 < sigma_a < sigma
    x0 = batch.x0[..., n:].reshape(audio_shape) / s  # the stream's own latent (the sampler carries s times it)
    noise = (batch.xt[..., n:].reshape(audio_shape) - (1 - sigma) * batch.x0[..., n:].reshape(audio_shape)) / sigma
    torch.testing.assert_close(seen["audio_in"], (1 - sigma_a) * x0 + sigma_a * noise, atol=2e-6, rtol=1e-5)

    # each stream's flow velocity error on its own schedule (denoised = x - sigma * output), elements alike
    video_x0 = batch.x0[..., :n].reshape(video_shape)
    video_err = (seen["video_in"] - sigma * seen["video_out"] - video_x0) / sigma
    audio_err = (seen["audio_in"] - sigma_a * seen["audio_out"] - x0) / sigma_a
    want = torch.cat([video_err.flatten(), audio_err.flatten()]).pow(2).mean()
    torch.testing.assert_close(loss, want, atol=1e-6, rtol=1e-4)


def test_a_run_with_audio_frames_trains_and_its_lora_loads(tmp_path):
    from family_harness import check, run_family

    check(_AV, run_family(_AV, tmp_path))


def test_a_training_time_sample_renders_the_video_and_audio_pair_and_keeps_the_video(tmp_path):
    """A sample during an H3 run: the empty latent becomes the video + audio pair ComfyUI's KSampler makes of it
    (comfy.sample.fix_empty_latent_channels), the sampler runs on it, and the sample file keeps the video the
    graph's VAE decodes; the same latent as KSampler's path gives for the same prompt and seed."""
    import comfy.sample
    import family_configs as fc

    from PipeTrain.engine.config.run import RunConfig
    from PipeTrain.engine.config.sections import SampleSpec
    from PipeTrain.engine.events import EventLog
    from PipeTrain.engine.sample_files import read_samples, write_prompts
    from PipeTrain.engine.train.samples import SampleRenderer, _training_patcher

    model = f33._minimax_h3(dict(_AV.config))
    fc.init_weights(model.diffusion_model, seed=0)
    text = torch.randn(1, 5, f33._MINIMAX_H3_TEXT, generator=torch.Generator().manual_seed(1))
    extras = {"pooled_output": None, "minimax_token_tags": torch.ones(1, 5, dtype=torch.long)}
    prompts = write_prompts(tmp_path / "prompts.safetensors", ["a tone"], [(text, extras)], (text * 0, extras))
    cfg = RunConfig(run_name="h3", run_dir=str(tmp_path), comfyui_root="c", model_path="m", cache_dir="d",
                    sample=SampleSpec(every=1, prompts_file=str(prompts), width=64, height=64, steps=2, seed=3))
    renderer = SampleRenderer(cfg, model, torch.device("cpu"), EventLog(str(tmp_path)))
    empty = renderer.empty_latent()
    assert empty.is_nested and [tuple(t.shape) for t in empty.unbind()] == [(1, 24, 1, 4, 4), (1, 32, 2, 2)]
    latents, texts = read_samples(renderer.render(step=1))
    assert texts == ["a tone"] and tuple(latents.shape) == (1, 24, 1, 4, 4) and torch.isfinite(latents).all()
    patcher = _training_patcher(model, torch.device("cpu"))
    want = comfy.sample.sample(patcher, comfy.sample.prepare_noise(empty, 3), 2, 1.0, "euler", "simple",
                               [[text, extras]], [[text * 0, extras]], empty, disable_pbar=True, seed=3)
    torch.testing.assert_close(latents, want.unbind()[0].float())


def test_a_training_time_sample_of_ltx_23_packs_an_empty_audio_stream_as_ltxs_nodes_do(tmp_path):
    """LTX 2.3 (LTXAV): ComfyUI has no fix for its empty latent, its graphs pack the video with LTXV Empty Latent
    Audio's zeros (LTXV Concat AV Latent). A run on packed rows samples that pair (the rows' audio channels and
    bins, one frame), and the sample file keeps the video: the latent KSampler's path gives for that pair."""
    import comfy.nested_tensor
    import comfy.sample
    import family_configs as fc
    import family_configs_033_more as more

    from PipeTrain.engine.config.run import RunConfig
    from PipeTrain.engine.config.sections import SampleSpec
    from PipeTrain.engine.events import EventLog
    from PipeTrain.engine.sample_files import read_samples, write_prompts
    from PipeTrain.engine.train.samples import SampleRenderer, _training_patcher

    host_module("comfy.ldm.lightricks.av_model")
    model = fc.build(more.LTXAV)
    text = torch.randn(1, 5, 96, generator=torch.Generator().manual_seed(1))
    extras = {"unprocessed_ltxav_embeds": True}
    prompts = write_prompts(tmp_path / "prompts.safetensors", ["a tone"], [(text, extras)], (text * 0, extras))
    cfg = RunConfig(run_name="ltx", run_dir=str(tmp_path), comfyui_root="c", model_path="m", cache_dir="d",
                    sample=SampleSpec(every=1, prompts_file=str(prompts), width=64, height=64, steps=2, seed=3))
    rows = [torch.Size((1, 128, 2, 2, 2)), torch.Size((1, 8, 3, 16))]  # what Cache Latents' audio_vae packs
    renderer = SampleRenderer(cfg, model, torch.device("cpu"), EventLog(str(tmp_path)), streams=rows)
    empty = renderer.empty_latent()
    assert empty.is_nested and [tuple(t.shape) for t in empty.unbind()] == [(1, 128, 1, 2, 2), (1, 8, 1, 16)]
    latents, _ = read_samples(renderer.render(step=1))
    assert tuple(latents.shape) == (1, 128, 1, 2, 2) and torch.isfinite(latents).all()
    pair = comfy.nested_tensor.NestedTensor((torch.zeros(1, 128, 1, 2, 2), torch.zeros(1, 8, 1, 16)))
    patcher = _training_patcher(model, torch.device("cpu"))
    want = comfy.sample.sample(patcher, comfy.sample.prepare_noise(pair, 3), 2, 1.0, "euler", "simple",
                               [[text, extras]], [[text * 0, extras]], pair, disable_pbar=True, seed=3)
    torch.testing.assert_close(latents, want.unbind()[0].float())
