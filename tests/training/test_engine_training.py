"""The engine with real DeepSpeed ranks (gloo on CPU) on the tiny UNet: it learns, its data
parallelism is exact, resume repeats an uninterrupted run, Cancel and crashes end every rank."""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from PipeTrain.engine.config.sections import MemorySpec
from engine_runs import EngineRun, engine_processes, rewound_copy, run_all_to_end, run_to_end, with_train

pytestmark = pytest.mark.slow


def _lora(run: EngineRun, name: str = "lora_final.safetensors") -> dict[str, torch.Tensor]:
    return load_file(str(Path(run.cfg.run_dir) / "lora" / name))


def test_loss_falls_and_lora_is_written(config):
    run = run_to_end(config(steps=40, batch_size=4, learning_rate=2e-3))
    losses = run.losses()
    assert len(losses) == 40
    first, last = sum(losses[:8]) / 8, sum(losses[-8:]) / 8
    assert last < 0.8 * first, f"loss did not fall: first 8 steps {first:.3f}, last 8 {last:.3f}"
    lora = _lora(run)
    assert lora and all(k.startswith("diffusion_model.") for k in lora)
    # Where the time to the first step went: every setup phase, in order, within launch -> 'started'.
    phases = run.of("started")[0]["setup_phases"]
    assert list(phases) == ["python_imports", "comfyui_import", "distributed_init", "node_checks", "model_load",
                            "block_probe", "lora", "memory_options", "engine", "resume"]
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) <= run.of("started")[0]["time"] - run.launched + 0.05
    # ... each also announced as it ended, once the event log existed (the node's "loading" detail)
    assert [e["phase"] for e in run.of("setup")] == list(phases)[list(phases).index("distributed_init"):]
    assert any(k.endswith(".lora_B.weight") and v.abs().sum() > 0 for k, v in lora.items()), "LoRA B never trained"


def test_two_processes_equal_one_process_with_grad_accum(config):
    """2 ranks x gas 1 see the same samples and noise as 1 rank x gas 2: same losses, same LoRA."""
    fp32 = MemorySpec(base_dtype="float32")  # on a GPU 'auto' is half precision: compare like with like
    one, two = run_all_to_end(config("one", processes=1, steps=6, grad_accum=2, memory=fp32),
                              config("two", processes=2, steps=6, grad_accum=1, memory=fp32))
    assert two.of("started")[0]["world_size"] == 2
    assert one.losses() == pytest.approx(two.losses(), rel=1e-4, abs=1e-6)
    assert one.grad_norms() == pytest.approx(two.grad_norms(), rel=1e-4)  # averaged over the ranks first
    a, b = _lora(one), _lora(two)
    assert a.keys() == b.keys()
    for k in a:  # summation order differs (allreduce vs accumulation); Adam amplifies ~1e-7 noise
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-5)


@pytest.mark.core
def test_resume_from_a_mid_run_checkpoint_equals_uninterrupted(config, tmp_path):
    full = run_to_end(config("full", steps=8, checkpoint_every=4, scheduler="cosine", warmup_steps=2))
    # Continue a copy of that run from its step-4 checkpoint, as if it had stopped there.
    resumed_dir = rewound_copy(full.cfg.run_dir, tmp_path / "resumed", "step000008", "step000004")
    cfg = with_train(full.cfg, steps=8)
    cfg = dataclasses.replace(cfg, run_dir=str(resumed_dir), resume=True)
    resumed = run_to_end(cfg)
    assert resumed.of("started")[0]["step"] == 4
    assert [e["step"] for e in resumed.of("step")] == [5, 6, 7, 8]
    assert resumed.losses() == pytest.approx(full.losses()[4:], rel=1e-5, abs=1e-7)
    a, b = _lora(full), _lora(resumed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-7)


@pytest.mark.core
def test_cancel_ends_every_rank_at_the_next_step_and_leaves_a_checkpoint(config):
    run = EngineRun(config(processes=2, steps=100_000))
    run.wait_for("step", min_step=2, timeout=240)
    at_cancel = _last_step(Path(run.cfg.run_dir))
    (Path(run.cfg.run_dir) / "cancel").touch()  # what the node does when the user presses Cancel
    rc = run.wait(timeout=60)  # of 100,000 steps: only the cancel ends the run in this time
    assert rc == 0, run.log()
    cancelled = run.of("cancelled")
    assert cancelled, run.log()
    step = cancelled[0]["step"]
    # Every rank asks at the end of each step: the step under way when the file appeared, or the next
    # one if that step had just asked, is the last (a test of behaviour, not of a busy machine's clock).
    assert step <= at_cancel + 2, f"cancelled at step {step}, the file appeared after step {at_cancel}"
    ckpt = Path(run.cfg.run_dir) / "checkpoints"
    assert (ckpt / "latest").read_text().strip() == f"step{step:06d}"
    # The checkpoint is usable: resuming continues after it.
    resumed = run_to_end(dataclasses.replace(with_train(run.cfg, steps=step + 2), resume=True))
    assert [e["step"] for e in resumed.of("step")] == [step + 1, step + 2]


def _last_step(run_dir: Path) -> int:
    """The last step events.jsonl records now."""
    steps = [json.loads(line)["step"] for line in (run_dir / "events.jsonl").read_text().splitlines()
             if '"event": "step"' in line]
    return steps[-1]


def test_a_crashing_rank_fails_the_run_with_its_error(config, cache_dir, tmp_path):
    """A real fault: one cached sample is corrupt, so the rank that loads it raises."""
    broken = tmp_path / "broken_cache"
    shutil.copytree(cache_dir, broken)
    for item in sorted(broken.glob("*/*.safetensors")):  # the item files or shards
        item.write_bytes(item.read_bytes()[:100])  # truncated file
    run = EngineRun(dataclasses.replace(config(processes=2, steps=5), cache_dir=str(broken)))
    started = time.time()
    rc = run.wait(timeout=120)
    assert rc != 0
    errors = run.of("error")
    assert errors, run.log()
    assert any(str(broken) in e["message"] or "safetensors" in e["message"].lower() for e in errors), errors
    assert time.time() - started < 120


@pytest.mark.core
def test_rank_processes_are_gone_after_runs(tmp_path_factory):
    """Nothing from the runs above outlives them (no orphan rank holding memory). Only this session's
    runs (under its base temp folder): another session may be training beside it (scripts/test.sh)."""
    mine = engine_processes(str(tmp_path_factory.getbasetemp()))
    assert not mine, mine
