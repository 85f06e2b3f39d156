"""PipeTrainTrainOptions: Train Pipeline's rarely changed settings (GPUs and backend, noise levels, sample
rendering, eval interval, EMA, accept_changes, W&B logging), kept off the Train Pipeline node so that its run view stays
in sight. Unconnected, TrainOptions' defaults apply: the same values as this node's widget defaults."""
from __future__ import annotations

import dataclasses

from .monitor_inputs import wandb_inputs
from .train_inputs import ema_inputs, eval_inputs, launch_inputs, resume_inputs, sample_setting_inputs
from .types import TRAIN_OPTIONS


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """The node's output; field names are its input names (tests/e2e/test_node_settings.py checks the defaults)."""
    gpu_ids: str = ""
    backend: str = "auto"
    timestep_sampling: str = "uniform"
    timestep_shift: float = 0.0
    min_t: float = 0.0
    max_t: float = 1.0
    sample_negative: str = ""
    sample_every: int = 100
    sample_width: int = 512
    sample_height: int = 512
    sample_steps: int = 20
    sample_cfg: float = 1.0
    sample_seed: int = 0
    sample_sampler: str = "euler"
    sample_scheduler: str = "simple"
    eval_every: int = 100
    eval_before_start: bool = True
    ema_decay: float = 0.0
    ema_start_step: int = 0
    accept_changes: bool = False
    wandb_project: str = ""
    wandb_run_name: str = ""
    wandb_mode: str = "online"
    wandb_entity: str = ""
    eval_early_stop: int = 0  # run.json eval.early_stop (appended last: saved workflows keep their values)


def option_inputs() -> dict:
    """The node's inputs, in widget order."""
    evals = {name: spec for name, spec in eval_inputs().items() if name != "eval_cache"}
    return {**launch_inputs(), **sample_setting_inputs(), **evals, **ema_inputs(), **resume_inputs(), **wandb_inputs(),
            **early_stop_inputs()}


def early_stop_inputs() -> dict:
    """Added after the W&B inputs: widget values are stored by position, so new inputs go at the end."""
    return {"eval_early_stop": ("INT", {"default": 0, "min": 0, "max": 1_000_000, "tooltip":
                                "End the run after this many evals in a row without a lower eval loss (the final "
                                "LoRA is still saved; SaveLoRA's weights 'best' picks the saved step with the lowest "
                                "eval loss). 0 = off. Needs eval_cache and eval_every above 0."})}


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(TrainOptions))


class PipeTrainTrainOptions:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("Train Pipeline's less often changed settings: which GPUs and backend, the noise levels trained, "
                   "how samples are rendered, the eval interval, an EMA of the LoRA weights, accept_changes for "
                   "resumes and W&B logging. Connect it to Train Pipeline's options input; unconnected, these defaults apply.")
    RETURN_TYPES = (TRAIN_OPTIONS,)
    RETURN_NAMES = ("options",)
    FUNCTION = "configure"

    @classmethod
    def INPUT_TYPES(cls):
        # Optional, so that an API prompt names only what it changes; the widgets show all of them.
        return {"required": {}, "optional": option_inputs()}

    def configure(self, **values):
        types = {f.name: f.type for f in dataclasses.fields(TrainOptions)}
        cast = {"str": str, "float": float, "int": int, "bool": bool}
        options = TrainOptions(**{name: cast[types[name]](values[name]) for name in OPTION_NAMES if name in values})
        # the engine's config validates these with the rest of the run (TrainPipeline)
        return (options,)
