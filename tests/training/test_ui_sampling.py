"""Samples during training: the engine renders the prompts with the current LoRA through ComfyUI's
own sampler, on rank 0 of real DeepSpeed ranks, and the result is what ComfyUI itself samples
with the LoRA file saved at that step."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import MemorySpec
from PipeTrain.engine.events import EventLog, history, read_events
from PipeTrain.engine.sample_files import read_prompts, read_samples
from PipeTrain.engine.train.samples import SampleRenderer
from engine_runs import make_config, run_to_end, with_samples, write_test_prompts

pytestmark = pytest.mark.slow
PROMPTS = ["a red circle on a blue background", "a green square"]


@pytest.fixture(scope="module")
def encoders(comfy_root, demo_base):
    from tools.tiny_assets import load_tiny_encoders

    models = Path(demo_base["base_dir"]) / "models"
    return load_tiny_encoders(str(models / "vae" / demo_base["vae"]), str(models / "text_encoders" / demo_base["clip"]))


def _prompts_file(path: Path, clip) -> Path:
    return write_test_prompts(path, clip, PROMPTS)


def test_prompts_file_round_trips_comfyui_conditioning(tmp_path, encoders):
    _, clip = encoders
    path = _prompts_file(tmp_path / "prompts.safetensors", clip)
    texts, positives, negative = read_prompts(path)
    assert texts == PROMPTS
    cond, extras = clip.encode_from_tokens_scheduled(clip.tokenize(PROMPTS[1]))[0]
    assert torch.equal(positives[1][0][0], cond)
    assert torch.equal(positives[1][0][1]["pooled_output"], extras["pooled_output"])
    assert negative[0][0].shape == cond.shape


def test_samples_use_the_current_lora_and_match_comfyui_sampling(tmp_path, comfy_root, demo_base, cache_dir,
                                                                 encoders):
    vae, clip = encoders
    cfg = make_config(tmp_path / "run", comfy_root, demo_base, cache_dir, processes=2, steps=8, save_every=4,
                      learning_rate=5e-3)
    cfg = with_samples(cfg, _prompts_file(tmp_path / "prompts.safetensors", clip))
    run = run_to_end(cfg)
    samples = run.of("sample")
    assert [e["step"] for e in samples] == [4, 8], run.log()
    assert samples[0]["prompts"] == PROMPTS
    early, texts = read_samples(samples[0]["path"])
    late, _ = read_samples(samples[1]["path"])
    assert texts == PROMPTS and early.shape == (2, 4, 8, 8)
    assert not torch.allclose(early, late, atol=1e-4), "samples did not change while the LoRA trained"
    assert early.std() > 0.01
    images = vae.decode(early)
    assert images.shape[-3:] == (64, 64, 3)

    # ComfyUI's own path: load the model, apply the LoRA saved at step 4, sample with the same settings.
    import comfy.sample
    import comfy.sd
    import comfy.utils

    model = comfy.sd.load_diffusion_model(cfg.model_path)
    lora = comfy.utils.load_torch_file(str(Path(cfg.run_dir) / "lora" / "lora_step000004.safetensors"),
                                       safe_load=True)
    patched, _ = comfy.sd.load_lora_for_models(model, None, lora, 1.0, 0)
    _, positives, negative = read_prompts(cfg.sample.prompts_file)
    latent = torch.zeros(1, 4, 8, 8)
    expected = comfy.sample.sample(patched, comfy.sample.prepare_noise(latent, 7), 4, 1.0, "euler", "simple",
                                   positives[0], negative, latent, disable_pbar=True, seed=7)
    torch.testing.assert_close(early[:1], expected.float(), rtol=1e-3, atol=1e-4)

    h = history(read_events(cfg.run_dir))
    assert h["status"] == "done" and len(h["steps"]) == 8 and [s["step"] for s in h["samples"]] == [4, 8]


def test_pipeline_stages_skip_samples_with_a_warning(tmp_path, comfy_root, demo_base, cache_dir, encoders):
    _, clip = encoders
    cfg = make_config(tmp_path / "pp", comfy_root, demo_base, cache_dir, processes=2,
                      memory=MemorySpec(pipeline_stages=2))
    cfg = with_samples(cfg, _prompts_file(tmp_path / "prompts.safetensors", clip))
    events = EventLog(cfg.run_dir)
    assert SampleRenderer.create(cfg, model=None, device=torch.device("cpu"), events=events, rank=0) is None
    (warning,) = [e for e in read_events(cfg.run_dir) if e["event"] == "warning"]
    assert "pipeline_stages 2" in warning["message"] and "training continues" in warning["message"]


def test_bad_sample_settings_name_the_setting(tmp_path, comfy_root, demo_base, cache_dir, encoders):
    _, clip = encoders
    cfg = make_config(tmp_path / "bad", comfy_root, demo_base, cache_dir)
    missing = RunConfig.from_dict({**cfg.to_dict(), "sample": {"every": 5, "prompts_file": str(tmp_path / "none")}})
    with pytest.raises(ConfigError, match="sample.prompts_file"):
        missing.check_files()  # at each boundary (validation reads no file)
    cfg = with_samples(cfg, _prompts_file(tmp_path / "prompts.safetensors", clip), sampler="no_such_sampler")
    with pytest.raises(ConfigError, match="sample.sampler 'no_such_sampler'.*euler"):
        SampleRenderer(cfg, model=None, device=torch.device("cpu"), events=EventLog(cfg.run_dir))
