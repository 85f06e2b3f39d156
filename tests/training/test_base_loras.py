"""run.json base_loras (Train Pipeline's `model` input with a LoRA stack): real gloo ranks merge the stack
into the base with ComfyUI's LoRA code, train a new LoRA on top and save only it; ComfyUI's own sampler on
the base with the same stack and the saved LoRA draws what the ranks drew at that step."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from engine_runs import make_config, run_to_end, with_samples, write_test_prompts
from random_lora import write_random_lora
from PipeTrain.engine.config.base_loras import BaseLora
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.sample_files import read_prompts, read_samples

pytestmark = [pytest.mark.slow, pytest.mark.core]  # core: ComfyUI 0.33 merges LoRAs through its own patcher code
PROMPTS = ["a red circle on a blue background"]


def _comfy_sample(model_path: str, loras: list[tuple[str, float]], prompts_file: str) -> torch.Tensor:
    """ComfyUI's own path: load the model, stack the LoRAs as LoRA loaders do, sample as the run does."""
    import comfy.sample
    import comfy.sd
    import comfy.utils

    model = comfy.sd.load_diffusion_model(model_path)
    for path, strength in loras:
        model, _ = comfy.sd.load_lora_for_models(model, None, comfy.utils.load_torch_file(path, safe_load=True),
                                                 strength, 0)
    _, positives, negative = read_prompts(prompts_file)
    latent = torch.zeros(1, 4, 8, 8)
    return comfy.sample.sample(model, comfy.sample.prepare_noise(latent, 7), 4, 1.0, "euler", "simple", positives[0],
                               negative, latent, disable_pbar=True, seed=7).float()


def test_the_new_lora_trains_on_the_stack_and_applies_after_it(tmp_path, comfy_root, demo_base, cache_dir):
    from tools.tiny_assets import load_tiny_encoders

    models = Path(demo_base["base_dir"]) / "models"
    _, clip = load_tiny_encoders(str(models / "vae" / demo_base["vae"]), str(models / "text_encoders" / demo_base["clip"]))
    cfg = make_config(tmp_path / "run", comfy_root, demo_base, cache_dir, processes=2, steps=4, learning_rate=5e-3)
    base_lora = write_random_lora(cfg.model_path, tmp_path / "downloaded_style.safetensors")
    cfg = dataclasses.replace(cfg, base_loras=(BaseLora(str(base_lora), 0.7),))
    cfg = with_samples(cfg, write_test_prompts(tmp_path / "prompts.safetensors", clip, PROMPTS))
    assert json.loads((Path(cfg.run_dir) / "run.json").read_text())["base_loras"] == [
        {"path": str(base_lora), "strength": 0.7}]
    run = run_to_end(cfg)
    (sample,) = run.of("sample")
    drawn, _ = read_samples(sample["path"])
    final = Path(run.of("done")[0]["lora"])

    stacked = _comfy_sample(cfg.model_path, [(str(base_lora), 0.7), (str(final), 1.0)], cfg.sample.prompts_file)
    torch.testing.assert_close(drawn[:1], stacked, rtol=1e-3, atol=1e-4)
    without_stack = _comfy_sample(cfg.model_path, [(str(final), 1.0)], cfg.sample.prompts_file)
    assert (drawn[:1] - without_stack).abs().max() > 100 * 1e-4, "the base LoRA changed nothing"

    from safetensors import safe_open
    with safe_open(str(final), framework="pt") as f:
        keys, metadata = set(f.keys()), f.metadata()
    assert not any(".lora_up." in k or ".lora_down." in k for k in keys)  # only the new LoRA, in PipeTrain's keys
    assert json.loads(metadata["pipetrain_base_loras"]) == [["downloaded_style.safetensors", 0.7]]


def test_bad_base_loras_are_refused_before_launch(tmp_path, comfy_root, demo_base, cache_dir):
    cfg = make_config(tmp_path / "bad", comfy_root, demo_base, cache_dir, steps=1)
    data = json.loads(json.dumps(cfg.to_dict()))
    with pytest.raises(ConfigError, match="strength 0"):
        RunConfig.from_dict({**data, "base_loras": [{"path": "x.safetensors", "strength": 0}]})
    with pytest.raises(ConfigError, match=r"base_loras must be a list"):
        RunConfig.from_dict({**data, "base_loras": "x.safetensors"})
    with pytest.raises(ConfigError, match="the LoRA file .*missing.safetensors does not exist"):
        RunConfig.from_dict({**data, "base_loras": [{"path": str(tmp_path / "missing.safetensors")}]}).check_files()
