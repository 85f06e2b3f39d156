"""The EMA of the LoRA weights in real engine runs on the tiny UNet (engine/train/ema.py): the saved EMA
files equal the average of the saved per-step LoRAs, a resume continues it exactly (DeepSpeed and plain
backends), turning it on at a resume is a change, and ComfyUI's LoRA loader places every key of the file."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine_runs import assert_same_lora, final_lora, make_config, rewound_copy, run_to_end, with_train
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.revisions import check_resume

pytestmark = pytest.mark.slow


@pytest.mark.core  # ComfyUI's own LoRA loader, on each supported ComfyUI
def test_the_ema_files_average_the_per_step_weights_and_load_in_comfyui(tmp_path, comfy_root, demo_base, cache_dir):
    cfg = make_config(tmp_path / "ema", comfy_root, demo_base, cache_dir, steps=3, save_every=1, ema_decay=0.5,
                      ema_start_step=1)
    run = run_to_end(cfg)
    d = run.cfg.run_dir
    w1, w2, w3 = (final_lora(d, n) for n in ("lora_step000001.safetensors", "lora_step000002.safetensors",
                                             "lora_final.safetensors"))
    e1, e2, e3 = (final_lora(d, n) for n in ("lora_step000001_ema.safetensors", "lora_step000002_ema.safetensors",
                                             "lora_final_ema.safetensors"))
    assert e3.keys() == w3.keys() and len(e3) > 0
    for k in w3:  # start step 1: the copy is step 1's weights, then ema = 0.5 * ema + 0.5 * weights
        torch.testing.assert_close(e1[k], w1[k], rtol=0, atol=0)
        torch.testing.assert_close(e2[k], 0.5 * w1[k] + 0.5 * w2[k], rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(e3[k], 0.5 * e2[k] + 0.5 * w3[k], rtol=1e-6, atol=1e-8)
    assert any(not torch.equal(e3[k], w3[k]) for k in w3), "the EMA is the last weights"
    final = Path(d) / "lora" / "lora_final_ema.safetensors"
    assert run.of("done")[0]["lora_ema"] == str(final)
    assert [e.get("ema_path", "").endswith("_ema.safetensors") for e in run.of("saved")] == [True] * 3
    with safe_open(str(final), framework="pt") as f:
        meta = f.metadata()
    assert (meta["pipetrain_ema_decay"], meta["pipetrain_ema_start_step"], meta["pipetrain_steps"]) == ("0.5", "1", "3")
    _assert_comfyui_loads_every_key(demo_base, e3)


def _assert_comfyui_loads_every_key(demo_base, lora: dict) -> None:
    """comfy.sd.load_lora_for_models on the demo UNet: every module patched, no 'lora key not loaded'."""
    import comfy.lora
    import comfy.sd

    patcher = comfy.sd.load_diffusion_model(str(Path(demo_base["base_dir"]) / "models" / "diffusion_models" /
                                                 demo_base["unet"]))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger().addHandler(handler)
    try:
        patched, _ = comfy.sd.load_lora_for_models(patcher, None, lora, 1.0, 0.0)
        patches = comfy.lora.load_lora(lora, comfy.lora.model_lora_keys_unet(patcher.model, {}))
    finally:
        logging.getLogger().removeHandler(handler)
    assert not [r.getMessage() for r in records if "not loaded" in r.getMessage()]
    assert len(patches) == sum(1 for k in lora if k.endswith(".lora_A.weight"))
    assert len(patched.patches) == len(patches)


@pytest.mark.parametrize("backend", ["deepspeed", "plain"])
def test_resume_continues_the_ema_exactly(tmp_path, comfy_root, demo_base, cache_dir, backend):
    cfg = make_config(tmp_path / "full", comfy_root, demo_base, cache_dir, steps=6, checkpoint_every=3,
                      ema_decay=0.7, ema_start_step=2)
    full = run_to_end(dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, backend=backend)))
    assert (Path(full.cfg.run_dir) / "checkpoints" / "step000003" / "pipetrain_ema.safetensors").is_file()
    resumed_dir = rewound_copy(full.cfg.run_dir, tmp_path / "resumed", "step000006", "step000003")
    resumed = run_to_end(dataclasses.replace(full.cfg, run_dir=str(resumed_dir), resume=True))
    assert [e["step"] for e in resumed.of("step")] == [4, 5, 6]
    assert resumed.grad_norms() == pytest.approx(full.grad_norms()[3:], rel=1e-5)
    assert_same_lora(full.cfg.run_dir, resumed_dir, rtol=1e-5, atol=1e-7)
    assert_same_lora(full.cfg.run_dir, resumed_dir, rtol=1e-5, atol=1e-7, name="lora_final_ema.safetensors")


def test_ema_turned_on_at_a_resume_is_a_change_and_starts_from_the_weights(tmp_path, comfy_root, demo_base,
                                                                           cache_dir):
    first = run_to_end(make_config(tmp_path / "run", comfy_root, demo_base, cache_dir, steps=2))
    on = dataclasses.replace(with_train(first.cfg, steps=4, save_every=1, ema_decay=0.5, ema_start_step=3),
                             resume=True)
    with pytest.raises(ConfigError, match=r"train.ema_decay: 0.0 -> 0.5; train.ema_start_step: 0 -> 3.*accept_changes"):
        check_resume(first.cfg.run_dir, on.to_dict())  # what the node and the engine refuse
    resumed = run_to_end(dataclasses.replace(on, accept_changes=True))
    warned = [e["message"] for e in resumed.of("warning")]
    assert any("holds no EMA" in m and "weights of step 2" in m for m in warned), warned
    changes = resumed.of("config_changed")[0]["changes"]
    assert {c["setting"] for c in changes} == {"train.ema_decay", "train.ema_start_step"}
    # Start step 3: the copy is the weights of step 3, then step 4 is averaged in.
    d = resumed.cfg.run_dir
    w3, w4, ema = (final_lora(d, n) for n in ("lora_step000003.safetensors", "lora_final.safetensors",
                                              "lora_final_ema.safetensors"))
    assert ema.keys() == w4.keys()
    for k in w4:
        torch.testing.assert_close(ema[k], 0.5 * w3[k] + 0.5 * w4[k], rtol=1e-6, atol=1e-8)
