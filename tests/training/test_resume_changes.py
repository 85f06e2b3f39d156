"""Resuming with changed settings (engine/config/revisions.py) through the real engine: a change that
makes the run differ from an uninterrupted one is refused before the model loads, with the list of
changes; accepted, it is logged at the step it takes effect, and every start's settings are kept."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.revisions import revisions
from PipeTrain.nodes.runs import check_resume
from engine_runs import EngineRun, build_cache, make_config, run_to_end, with_train

pytestmark = pytest.mark.slow


@pytest.mark.core
def test_changed_settings_are_refused_then_logged_when_accepted(tmp_path, comfy_root, demo_base):
    cache = build_cache(comfy_root, demo_base)
    first = run_to_end(make_config(tmp_path / "run", comfy_root, demo_base, cache, steps=2, checkpoint_every=2))
    changed = dataclasses.replace(with_train(first.cfg, steps=4, learning_rate=0.05), resume=True,
                                  lora=dataclasses.replace(first.cfg.lora, alpha=64.0, dropout=0.5))
    refused = EngineRun(changed)
    assert refused.wait(timeout=300) != 0
    message = " ".join(e.get("message", "") for e in refused.of("error"))
    for text in ("lora.alpha: 0.0 -> 64.0", "lora.dropout: 0.0 -> 0.5", "train.learning_rate: 0.001 -> 0.05"):
        assert text in message, message
    assert not refused.of("started")  # refused before the model was loaded
    assert len(revisions(first.cfg.run_dir)) == 1  # the refused attempt kept nothing

    accepted = run_to_end(dataclasses.replace(changed, accept_changes=True))
    logged = accepted.of("config_changed")
    assert logged and logged[0]["step"] == 2
    assert {c["setting"] for c in logged[0]["changes"]} == {"lora.alpha", "lora.dropout", "train.learning_rate"}
    kept = [json.loads(p.read_text()) for p in revisions(first.cfg.run_dir)]
    assert [(k["step"], k["config"]["train"]["learning_rate"]) for k in kept] == [(0, 1e-3), (2, 0.05)]


def test_the_node_refuses_before_launch_also_for_a_run_without_history(tmp_path, comfy_root, demo_base):
    """A run folder from an older PipeTrain has only run.json: it is what the resume is compared with."""
    cfg = make_config(tmp_path / "old", comfy_root, demo_base, str(tmp_path / "cache"), steps=2)
    run_dir = Path(cfg.run_dir)
    (run_dir / "checkpoints" / "step000002").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("step000002")
    new = dataclasses.replace(with_train(cfg, steps=10), lora=dataclasses.replace(cfg.lora, dropout=0.5))
    with pytest.raises(ConfigError, match=r"lora\.dropout: 0\.0 -> 0\.5"):
        check_resume(run_dir, new)
    check_resume(run_dir, with_train(cfg, steps=10))  # more steps: fine
    check_resume(run_dir, dataclasses.replace(new, accept_changes=True))
