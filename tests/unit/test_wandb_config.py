"""W&B's settings (run.json `monitor`, engine/config/monitor.py), the node's W&B inputs (nodes/monitor_inputs.py)
and the W&B session (engine/train/wandb_log.py) against a stand-in `wandb` module: off by default, bad values
and a missing package refused with the fix, a resume may change them, the run finished however training ends."""
from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from PipeTrain.engine.config import revisions
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.monitor import MonitorSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.train import wandb_log
from PipeTrain.nodes.monitor_inputs import monitor_spec, wandb_inputs

pytestmark = pytest.mark.core  # pure Python: also on ComfyUI 0.33

BASE = {"run_name": "r", "run_dir": "runs/r", "comfyui_root": "comfy", "model_path": "m.safetensors",
        "cache_dir": "cache"}


class FakeRun:
    def __init__(self, **init):
        self.init, self.logged, self.finished, self.name, self.url = init, [], [], init["name"], None

    def log(self, data, step):
        self.logged.append((step, dict(data)))

    def finish(self, exit_code=None):
        self.finished.append(exit_code)


@pytest.fixture
def fake_wandb(monkeypatch):
    runs: list[FakeRun] = []
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # libraries that look for it (accelerate) find it
    module.init = lambda **kw: runs.append(FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return runs


def _cfg(**monitor) -> RunConfig:
    return RunConfig.from_dict({**BASE, "monitor": monitor})


def test_old_run_json_loads_with_wandb_off_and_the_section_round_trips():
    old = RunConfig.from_dict(dict(BASE))  # a run.json from before `monitor`
    assert old.monitor == MonitorSpec() and not old.monitor.wandb
    cfg = _cfg(wandb_project="loras", wandb_mode="offline")
    assert RunConfig.from_dict(cfg.to_dict()).monitor == MonitorSpec(wandb_project="loras", wandb_mode="offline")


@pytest.mark.parametrize("monitor, words", [
    ({"wandb_project": "p", "wandb_mode": "cloud"}, "use one of online, offline"),
    ({"wandb_project": "a/b"}, "leave it empty for no W&B"),
    ({"wandb_project": "p", "wandb_entity": "team:x"}, "monitor.wandb_entity"),
    ({"wandb_project": "p", "wandb_run_name": "two\nlines"}, "one line"),
    ({"wandb_run_name": "named"}, "set wandb_project"),
    ({"wandb_project": "p", "wandb_spam": 1}, "unknown setting(s) in run.monitor: wandb_spam"),
])
def test_bad_values_are_refused_with_the_fix(monitor, words):
    with pytest.raises(ConfigError, match=None) as e:
        _cfg(**monitor)
    assert words in str(e.value)


def test_a_resume_may_change_every_wandb_setting():
    before, after = _cfg().to_dict(), _cfg(wandb_project="p", wandb_mode="offline", wandb_entity="me").to_dict()
    assert revisions.result_changes(before, after) == []


def test_a_missing_package_is_named_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails, as where it is not installed
    with pytest.raises(ConfigError) as e:
        monitor_spec("loras")  # the node, before launch
    assert "wandb package is not installed" in str(e.value) and "-m pip install wandb" in str(e.value)
    assert "leave wandb_project empty" in str(e.value)
    with pytest.raises(ConfigError, match="wandb package is not installed"):  # rank 0, before the model loads
        wandb_log.start(_cfg(wandb_project="loras"), rank=0)
    assert monitor_spec("") == MonitorSpec()  # off: no package needed
    assert wandb_log.start(_cfg(), rank=0).run is None


def test_node_inputs_have_tooltips_and_make_the_section():
    inputs = wandb_inputs()
    assert set(inputs) == {"wandb_project", "wandb_run_name", "wandb_mode", "wandb_entity"}
    assert all(opts.get("tooltip") for _, opts in inputs.values())
    assert inputs["wandb_mode"][0] == ["online", "offline"]
    with pytest.raises(ConfigError, match="wandb_mode"):
        monitor_spec("p", wandb_mode="sometimes")


def test_the_session_starts_on_rank_0_only_and_finishes_on_failure(fake_wandb):
    cfg = _cfg(wandb_project="loras", wandb_mode="offline")
    assert wandb_log.start(cfg, rank=1).run is None and not fake_wandb  # other ranks: no W&B run
    with pytest.raises(RuntimeError):
        with wandb_log.session(cfg, rank=0) as wb:
            wb.step(1, 0.5, 1e-4, 2.0)
            raise RuntimeError("the model did not load")
    (run,) = fake_wandb
    assert run.init["project"] == "loras" and run.init["name"] == "r" and run.init["mode"] == "offline"
    assert run.init["config"] == cfg.to_dict() and run.init["entity"] is None
    assert run.logged == [(1, {"train/loss": 0.5, "train/lr": 1e-4, "train/grad_norm": 2.0})]
    assert run.finished == [1]  # failed: W&B marks the run failed
