"""The W&B inputs (optional: Weights & Biases logging, off until wandb_project is set) and the run.json
`monitor` section they make (engine/config/monitor.py), for the node that trains."""
from __future__ import annotations

from ..engine.config.choices import WANDB_MODES
from ..engine.config.monitor import MonitorSpec


def wandb_inputs() -> dict:
    """Optional inputs for logging the run to Weights & Biases (the `wandb` package, `pip install wandb`)."""
    return {
        "wandb_project": ("STRING", {"default": "", "tooltip":
                          "Also log the run to this Weights & Biases project: loss, learning rate, gradient norm, "
                          "eval loss and the run's settings, as TensorBoard gets them. Empty = no W&B. Needs the "
                          "wandb package in ComfyUI's Python (pip install wandb) and, online, `wandb login` once."}),
        "wandb_run_name": ("STRING", {"default": "", "tooltip":
                           "The run's name in W&B; empty = the run's folder name (run_name, or its _2, _3 ...)."}),
        "wandb_mode": (list(WANDB_MODES), {"default": "online", "tooltip":
                       "online: uploads while it trains. offline: keeps W&B's files in the run folder (wandb/) "
                       "without a network or login; upload them later with `wandb sync`."}),
        "wandb_entity": ("STRING", {"default": "", "tooltip":
                         "The W&B team or user the project belongs to; empty = your default entity."}),
    }


def monitor_spec(wandb_project: str = "", wandb_run_name: str = "", wandb_mode: str = "online",
                 wandb_entity: str = "") -> MonitorSpec:
    """The run's MonitorSpec from the W&B inputs: validated, and with W&B on, the wandb package found, so
    a bad value or a missing package is refused before anything launches."""
    spec = MonitorSpec(wandb_project=wandb_project.strip(), wandb_run_name=wandb_run_name.strip(),
                       wandb_mode=wandb_mode, wandb_entity=wandb_entity.strip())
    spec.validate()
    spec.check_installed()
    return spec
