"""Stop & save with real DeepSpeed ranks (gloo on CPU) on the tiny UNet: `<run_dir>/finish` makes the step
under way the last one, so the run ends as a finished run (final LoRA, checkpoint, 'done', exit code 0) and a
resume continues it; a cancel asked at the same time wins."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from safetensors import safe_open

from engine_runs import EngineRun, engine_processes, run_to_end, with_train

pytestmark = pytest.mark.slow


def _last_step(run_dir: Path) -> int:
    steps = [json.loads(line)["step"] for line in (run_dir / "events.jsonl").read_text().splitlines()
             if '"event": "step"' in line]
    return steps[-1]


@pytest.mark.core
def test_the_finish_file_ends_every_rank_as_a_finished_run_that_resume_continues(config):
    run = EngineRun(config(processes=2, steps=100_000, checkpoint_every=0))
    run_dir = Path(run.cfg.run_dir)
    run.wait_for("step", min_step=1, timeout=240)
    at_request = _last_step(run_dir)
    (run_dir / "finish").touch()  # what Stop & save does (engine/launch/launcher.py request_finish)
    rc = run.wait(timeout=120)  # of 100,000 steps: only the finish file ends the run in this time
    assert rc == 0, run.log()
    done, = run.of("done")
    step = done["step"]
    assert step <= at_request + 2 and done["total"] == 100_000, (step, at_request)
    assert not run.of("cancelled")
    finish, = run.of("finish_requested")
    assert finish["step"] == step
    assert finish["message"] == f"stopped by Stop & save at step {step} of 100000: this step's LoRA is the final one"
    assert finish["message"] in run.log()  # also printed to the log
    # The final LoRA is this step's, and the checkpoint of this step is written (both ranks took part).
    final = Path(done["lora"])
    assert final == run_dir / "lora" / "lora_final.safetensors"
    with safe_open(str(final), "pt") as f:
        assert f.metadata()["pipetrain_steps"] == str(step)
        assert any(k.endswith(".lora_B.weight") and f.get_tensor(k).abs().sum() > 0 for k in f.keys())
    assert [e["step"] for e in run.of("saved")][-1] == step
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step{step:06d}"
    assert not (run_dir / "finish").exists(), "the finish file was not used up"
    assert not engine_processes(str(run_dir))

    # A finish file left in the folder does not stop a resume at once: the launch removes it.
    (run_dir / "finish").touch()
    resumed = run_to_end(dataclasses.replace(with_train(run.cfg, steps=step + 2), resume=True))
    assert [e["step"] for e in resumed.of("step")] == [step + 1, step + 2]
    assert not resumed.of("finish_requested") and resumed.of("done")[0]["step"] == step + 2


def test_a_cancel_wins_over_a_finish_asked_at_the_same_time(config):
    run = EngineRun(config(processes=1, steps=100_000))
    run_dir = Path(run.cfg.run_dir)
    # Both there before the first step ends (the ranks are still loading): the first step sees both.
    (run_dir / "finish").touch()
    (run_dir / "cancel").touch()
    assert run.wait(timeout=240) == 0, run.log()
    cancelled, = run.of("cancelled")
    assert cancelled["step"] == 1 and not run.of("done") and not run.of("finish_requested"), run.log()
    assert not (run_dir / "lora" / "lora_final.safetensors").exists()
