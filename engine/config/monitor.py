"""MonitorSpec: where a run's progress is reported besides events.jsonl and TensorBoard (`monitor` in
run.json): Weights & Biases, an optional extra (`pip install wandb`), off unless `wandb_project` is set.

Its own section rather than part of `launch`: it decides neither how the ranks start nor what they
compute, and a resume may change it freely (engine/config/revisions.py, SAME_RESULT). Plain data (no
torch, no wandb import); what the engine does with it: engine/train/wandb_log.py.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass

from .checks import ConfigError, check
from .choices import WANDB_MODES

# What W&B accepts in a project or entity name (no '/', '\', '#', '?', '%', ':', no spaces at the ends).
_WANDB_NAME_RE = re.compile(r"^[^/\\#?%:\s]([^/\\#?%:]{0,126}[^/\\#?%:\s])?$")


@dataclass(frozen=True)
class MonitorSpec:
    wandb_project: str = ""  # the W&B project the run logs to; "" = no W&B
    wandb_run_name: str = ""  # the W&B run's name; "" = the PipeTrain run's name (its folder)
    wandb_mode: str = "online"  # online (uploads as it trains) or offline (files in <run_dir>/wandb, `wandb sync`)
    wandb_entity: str = ""  # the W&B team or user; "" = the logged-in user's default

    @property
    def wandb(self) -> bool:
        return bool(self.wandb_project)

    def validate(self) -> None:
        check(self.wandb_mode in WANDB_MODES, f"monitor.wandb_mode is {self.wandb_mode!r}: use one of "
              f"{', '.join(WANDB_MODES)} (offline keeps the W&B files in the run folder for `wandb sync`).")
        for name, value in (("wandb_project", self.wandb_project), ("wandb_entity", self.wandb_entity)):
            check(not value or _WANDB_NAME_RE.match(value) is not None,
                  f"monitor.{name} {value!r} is not a W&B name: use at most 128 characters without / \\ # ? % : "
                  "and without spaces at the ends" + (", or leave it empty for no W&B." if name == "wandb_project"
                                                      else ", or leave it empty for your default entity."))
        check(len(self.wandb_run_name) <= 128 and "\n" not in self.wandb_run_name,
              "monitor.wandb_run_name must be one line of at most 128 characters (empty = the run's name).")
        check(self.wandb or not (self.wandb_run_name or self.wandb_entity),
              "monitor.wandb_run_name / wandb_entity are set but wandb_project is empty: set wandb_project to log "
              "to W&B, or clear them.")

    def check_installed(self) -> None:
        """With W&B asked for, the wandb package must be importable by this Python: checked by the node before
        launch and by rank 0 before the model loads, so a missing package never fails a run at its first step."""
        if self.wandb and not wandb_installed():
            raise ConfigError(wandb_missing_message(self.wandb_project))


def wandb_installed() -> bool:
    """Whether `import wandb` can work, without importing it (a second or so, and W&B's own start-up)."""
    if "wandb" in sys.modules:  # imported already, or blocked (None)
        return sys.modules["wandb"] is not None
    return importlib.util.find_spec("wandb") is not None


def wandb_missing_message(project: str) -> str:
    return (f"monitor.wandb_project is {project!r} but the wandb package is not installed in this Python "
            f"({sys.executable}): install it with `{sys.executable} -m pip install wandb` (the Python that runs "
            "ComfyUI and the training), or leave wandb_project empty to train without W&B.")
