"""Training on one device without DeepSpeed: same LoRA, same events, resume and Cancel work."""
from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

import pytest

from engine_runs import assert_same_lora, make_config, run_all_to_end, run_to_end, with_train
from no_deepspeed_env import make_env
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from tools.comfy_server import ComfyInterrupted, ComfyServer
from tools.demo import demo_prompt

pytestmark = pytest.mark.slow


def _plain(cfg: RunConfig) -> RunConfig:
    return dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, backend="plain"))


def test_plain_backend_equals_deepspeed_single_process(tmp_path, comfy_root, demo_base, cache_dir):
    cfg = make_config(tmp_path / "ds", comfy_root, demo_base, cache_dir, steps=6, grad_accum=2,
                      scheduler="cosine", warmup_steps=1)
    ds, plain = run_all_to_end(cfg, _plain(dataclasses.replace(cfg, run_dir=str(tmp_path / "plain"))))
    assert plain.losses() == pytest.approx(ds.losses(), rel=1e-5, abs=1e-7)
    assert plain.grad_norms() == pytest.approx(ds.grad_norms(), rel=1e-4)
    assert_same_lora(ds.cfg.run_dir, plain.cfg.run_dir, rtol=1e-4, atol=1e-6)


def test_plain_backend_resume_equals_uninterrupted(tmp_path, comfy_root, demo_base, cache_dir):
    full, first = run_all_to_end(_plain(make_config(tmp_path / "full", comfy_root, demo_base, cache_dir, steps=6)),
                                 _plain(make_config(tmp_path / "part", comfy_root, demo_base, cache_dir, steps=3)))
    resumed = run_to_end(dataclasses.replace(with_train(first.cfg, steps=6), resume=True))
    assert [e["step"] for e in resumed.of("step")] == [4, 5, 6]
    assert first.losses() + resumed.losses() == pytest.approx(full.losses(), rel=1e-5, abs=1e-7)
    with pytest.raises(ConfigError, match="need DeepSpeed"):
        LaunchSpec(num_gpus=2, backend="plain").validate()


def test_the_pack_trains_in_an_environment_without_deepspeed(tmp_path_factory, comfy_root, demo_base):
    python = make_env(tmp_path_factory.mktemp("no-deepspeed"))
    probe = subprocess.run([python, "-c", "import deepspeed"], capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'deepspeed'" in probe.stderr
    with ComfyServer(comfy_root, demo_base["base_dir"], python=python) as server:
        assert not server.import_failed(), server.log_tail()
        # The example workflow, as a user without DeepSpeed runs it: 1 GPU (here: 1 CPU process).
        prompt = demo_prompt(demo_base, steps=8, processes=1, run_name="nods")
        entry = server.run(prompt, timeout=600)
        texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
        assert any("trained 8/8 steps" in t for t in texts), texts
        run_dir = Path(demo_base["base_dir"]) / "output" / "pipetrain" / "nods"
        assert '"backend": "plain"' in (run_dir / "run.json").read_text()
        images = {Path(p).name.split("_0")[0]: Path(p).read_bytes() for p in server.image_paths(entry)}
        assert images["with_lora"] != images["without_lora"]

        # Cancel there too: stops, leaves the plain checkpoint, and a resumed run continues after it.
        train_only = {k: v for k, v in prompt.items() if k in {"1", "2", "3", "4", "5", "6", "7", "8", "23"}}
        train_only["8"]["inputs"].update(steps=100_000, run_name="nods_cancel")
        prompt_id = server.queue(train_only)
        events = run_dir.parent / "nods_cancel" / "events.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline and '"event": "step"' not in (events.read_text() if events.exists() else ""):
            time.sleep(0.2)
        pressed = time.time()
        server.interrupt()
        with pytest.raises(ComfyInterrupted):
            server.wait(prompt_id, timeout=60)
        assert time.time() - pressed < 10
        checkpoints = run_dir.parent / "nods_cancel" / "checkpoints"
        tag = (checkpoints / "latest").read_text().strip()
        assert (checkpoints / tag / "pipetrain_state.pt").is_file()
        train_only["8"]["inputs"].update(steps=int(tag[4:]) + 2, resume="nods_cancel")
        entry = server.run(train_only, timeout=300)
        texts = [o["text"][0] for o in entry["outputs"].values() if o.get("text")]
        assert any(f"trained {int(tag[4:]) + 2}/{int(tag[4:]) + 2} steps" in t for t in texts), texts
