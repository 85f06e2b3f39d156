"""A non-LoRA adapter kind (DoRA: its file is made against the base weights) through the real engine:
resuming from a mid-run checkpoint repeats the uninterrupted run, and the file holds DoRA's keys. The plain
backend (one process, no DeepSpeed launch) keeps it quick; DeepSpeed resume itself is test_engine_training's."""
from __future__ import annotations

import dataclasses

import pytest

from PipeTrain.engine.config.sections import LoraSpec
from engine_runs import assert_same_lora, build_cache, make_config, rewound_copy, run_to_end

pytestmark = pytest.mark.slow


def test_dora_resume_equals_uninterrupted(tmp_path, comfy_root, demo_base):
    cache_dir = build_cache(comfy_root, demo_base)
    lora = LoraSpec(rank=4, alpha=8.0, targets="attention_mlp", kind="dora")
    cfg = make_config(tmp_path / "full", comfy_root, demo_base, cache_dir, lora=lora, steps=6, checkpoint_every=3,
                      learning_rate=2e-3)
    full = run_to_end(dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, backend="plain")))
    resumed_dir = rewound_copy(full.cfg.run_dir, tmp_path / "resumed", "step000006", "step000003")
    resumed = run_to_end(dataclasses.replace(full.cfg, run_dir=str(resumed_dir), resume=True))
    assert [e["step"] for e in resumed.of("step")] == [4, 5, 6]
    assert resumed.losses() == pytest.approx(full.losses()[3:], rel=1e-5, abs=1e-7)
    saved = assert_same_lora(full.cfg.run_dir, resumed_dir, rtol=1e-5, atol=1e-7)
    scales = [k for k in saved if k.endswith(".dora_scale")]
    assert scales and len(scales) == len([k for k in saved if k.endswith(".lora_A.weight")])
    assert all(saved[k].dim() == 2 and saved[k].shape[1] == 1 for k in scales)
