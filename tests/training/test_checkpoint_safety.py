"""Resuming reads only tensors and plain data: a run folder whose checkpoint file holds a pickled
object (which full pickle would run) is refused by name, and the object never runs. The real
engine with a DeepSpeed rank (gloo on CPU) on the tiny UNet."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from engine_runs import EngineRun, build_cache, make_config, run_to_end

pytestmark = pytest.mark.slow


class _RunsCode:
    """Unpickling this creates a file: what a crafted checkpoint could do instead."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.core
def test_resume_refuses_a_checkpoint_with_pickled_objects(tmp_path, comfy_root, demo_base):
    cache = build_cache(comfy_root, demo_base)
    first = run_to_end(make_config(tmp_path / "run", comfy_root, demo_base, cache, steps=2, checkpoint_every=2))
    folder = Path(first.cfg.run_dir) / "checkpoints" / "step000002"
    states = sorted(folder.glob("*model_states.pt"))
    assert states, sorted(p.name for p in folder.iterdir())
    marker = tmp_path / "code_ran"
    state = torch.load(states[0], map_location="cpu", weights_only=True)  # a real file, one object added
    state["client_state_extra"] = _RunsCode(str(marker))
    torch.save(state, states[0])
    resumed = EngineRun(dataclasses.replace(first.cfg, resume=True, train=dataclasses.replace(first.cfg.train, steps=4)))
    assert resumed.wait(timeout=300) != 0
    assert not marker.exists(), "the pickled object ran on resume"
    errors = " ".join(e.get("message", "") for e in resumed.of("error"))
    assert os.path.basename(states[0]) in errors and "tensors and plain data" in errors, errors
