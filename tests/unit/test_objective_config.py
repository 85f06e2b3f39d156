"""run.json's `objective` section (engine/config/objective.py): its checks, the rules joining it with `train`,
and what a resumed run from before it trains with (engine/config/revisions.py)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.objective import ObjectiveSpec
from PipeTrain.engine.config.revisions import check_resume, keep_run_settings, record, trained_section
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import TrainSpec


def _cfg(tmp_path, **objective) -> RunConfig:
    return RunConfig(run_name="r", run_dir=str(tmp_path / "run"), comfyui_root="/c", model_path="/m.safetensors",
                     cache_dir="/cache", objective=ObjectiveSpec(**objective))


def test_the_defaults_are_the_fields_and_round_trip(tmp_path):
    spec = ObjectiveSpec()
    assert (spec.guidance, spec.loss, spec.min_snr_gamma, spec.sigmoid_scale) == (1.0, "mse", 0.0, 1.0)
    cfg = _cfg(tmp_path, loss="huber", huber_delta=0.5, guidance=2.5)
    path = tmp_path / "run.json"
    cfg.save(path)
    assert json.loads(path.read_text())["objective"]["huber_delta"] == 0.5
    assert RunConfig.load(path) == cfg


@pytest.mark.parametrize("change,needle", [
    ({"loss": "l1"}, "mse, huber, smooth_l1"),
    ({"huber_delta": 0.0}, "huber_delta is 0.0"),
    ({"huber_delta": 0.5}, "loss is 'mse', which has no delta"),
    ({"guidance": -1.0}, "objective.guidance"),
    ({"sigmoid_scale": 0.0}, r"\[0.1, 10\]"),
    ({"min_snr_gamma": -5.0}, "min_snr_gamma is -5.0"),
    ({"max_shift": 2.0}, "resolution_shift is off"),
])
def test_bad_values_name_the_setting_and_the_fix(tmp_path, change, needle):
    data = _cfg(tmp_path).to_dict()
    data["objective"].update(change)
    with pytest.raises(ConfigError, match=needle):
        RunConfig.from_dict(data)


def test_settings_that_would_do_nothing_are_refused_with_the_fix(tmp_path):
    cfg = _cfg(tmp_path, sigmoid_scale=2.0)
    with pytest.raises(ConfigError, match="set timestep_sampling to 'logit_normal'"):
        cfg.validate()
    dataclasses.replace(cfg, train=TrainSpec(timestep_sampling="logit_normal")).validate()
    shifted = dataclasses.replace(_cfg(tmp_path, resolution_shift=True), train=TrainSpec(timestep_shift=3.0))
    with pytest.raises(ConfigError, match="set timestep_shift to 0"):
        shifted.validate()
    _cfg(tmp_path, resolution_shift=True, max_shift=2.02).validate()


def _old_run(tmp_path, history: bool) -> Path:
    """A run started before the objective settings: run.json (and its revision) without them, a checkpoint."""
    cfg = _cfg(tmp_path).to_dict()
    del cfg["objective"]
    run_dir = Path(cfg["run_dir"])
    (run_dir / "checkpoints" / "step000002").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("step000002")
    (run_dir / "run.json").write_text(json.dumps({**cfg, "resume": True}))
    if history:
        record(run_dir, cfg, 0)
    return run_dir


@pytest.mark.parametrize("history", [True, False])
def test_a_run_from_before_resumes_with_its_old_guidance_and_the_new_defaults_are_no_change(tmp_path, history):
    run_dir = _old_run(tmp_path, history)
    cfg = RunConfig.load(run_dir / "run.json")  # headless: run.json as it was, resume on
    assert cfg.objective == ObjectiveSpec(guidance=0.0)  # each item's cached guidance, else ComfyUI's 3.5
    before = None if history else json.loads((run_dir / "run.json").read_text())
    assert check_resume(run_dir, cfg.to_dict(), before=before) == []  # the other new settings: defaults, no change
    assert trained_section(run_dir, "objective", before=before) == {"guidance": 0.0}
    explicit = dataclasses.replace(cfg, objective=ObjectiveSpec(guidance=1.0))
    with pytest.raises(ConfigError, match=r"objective\.guidance: 0\.0 -> 1\.0"):
        check_resume(run_dir, explicit.to_dict(), before=before)
    accepted = {**explicit.to_dict(), "accept_changes": True}
    assert check_resume(run_dir, accepted, before=before) == [("objective.guidance", 0.0, 1.0)]


def test_a_resume_keeps_the_runs_objective_where_run_json_leaves_it_out(tmp_path):
    cfg = _cfg(tmp_path, loss="huber", guidance=2.0).to_dict()
    run_dir = Path(cfg["run_dir"])
    (run_dir / "checkpoints").mkdir(parents=True)
    record(run_dir, cfg, 0)
    partial = {**cfg, "resume": True, "objective": {"guidance": 2.0}}
    assert keep_run_settings(partial) is partial  # no checkpoint yet: nothing to keep
    (run_dir / "checkpoints" / "latest").write_text("step000002")
    assert keep_run_settings(partial)["objective"]["loss"] == "huber"
    fresh = {k: v for k, v in cfg.items() if k != "objective"}
    assert "objective" not in keep_run_settings(fresh)  # resume off: the defaults
