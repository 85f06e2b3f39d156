"""What the Save LoRA and Save Model nodes fed by a Train Pipeline will need, checked before it trains.

Train Pipeline reads the queued prompt (ComfyUI's hidden PROMPT input) for the save nodes whose `run`
input is its own output, and refuses the run when one of them would fail after training: a name that
is not allowed or is taken with overwrite off, a Save LoRA on a full fine-tune (no LoRA is written) or
a Save Model on a LoRA run (no model is written), and Save LoRA / Save Model weights the run will not
make (ema without ema_decay, best without an eval set). A value wired from another node is only known when the
save node runs, which then checks it itself.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..engine.config.checks import ConfigError
from . import compat
from .save_lora import BEST, EMA, pair_names, safe_lora_target

SAVE_LORA, SAVE_MODEL = "PipeTrainSaveLoRA", "PipeTrainSaveModel"


@dataclass(frozen=True)
class RunOutputs:
    """What the run about to start will write, as far as the save nodes care."""

    full: bool = False  # Configure LoRA's adapter 'full': a model file, no LoRA
    ema: bool = False  # ema_decay above 0: an EMA LoRA beside the plain one
    eval: bool = False  # an eval set is connected and evaluated: best.json can name a best step
    pair: bool = False  # Wan 2.2 experts (nodes/expert_pair.py): Save LoRA writes <name>_high_noise and _low_noise


def _fed_save_nodes(prompt: dict | None, train_node: str | None):
    """(class_type, inputs) of each save node whose run input is `train_node`'s output."""
    if not isinstance(prompt, dict) or train_node is None:
        return
    for node in prompt.values():
        if not isinstance(node, dict) or node.get("class_type") not in (SAVE_LORA, SAVE_MODEL):
            continue
        inputs = node.get("inputs") or {}
        run = inputs.get("run")
        if isinstance(run, list) and run and str(run[0]) == str(train_node):
            yield node["class_type"], inputs


def check_save_names(prompt: dict | None, train_node: str | None, outputs: RunOutputs = RunOutputs()) -> None:
    """Refuse the run now (nothing trained yet) when a save node it feeds would fail after training."""
    for kind, inputs in _fed_save_nodes(prompt, train_node):
        if kind == SAVE_LORA and outputs.full:
            raise ConfigError("Save LoRA is connected to this Train Pipeline, but Configure LoRA's adapter is 'full': "
                              "a full fine-tune writes the whole model and no LoRA. Connect PipeTrain Save Model "
                              "instead, or choose adapter 'lora'. Nothing was trained.")
        if kind == SAVE_MODEL and not outputs.full:
            raise ConfigError("Save Model is connected to this Train Pipeline, but it trains a LoRA (Configure LoRA's "
                              "adapter is not 'full'), which writes no model file. Connect PipeTrain Save LoRA "
                              "instead, or choose adapter 'full'. Nothing was trained.")
        weights = inputs.get("weights")
        if weights == EMA and not outputs.ema:  # Save LoRA's and Save Model's weights alike
            what = "Save LoRA" if kind == SAVE_LORA else "Save Model"
            raise ConfigError(f"{what}'s weights is 'ema', but this run keeps no EMA (Train Options' ema_decay is "
                              "0): set ema_decay above 0 (e.g. 0.999), or set weights to 'plain'. Nothing was trained.")
        if kind == SAVE_LORA and weights == BEST and not outputs.eval:
            raise ConfigError("Save LoRA's weights is 'best', but this run evaluates nothing, so no step can be best: "
                              "connect an eval set to Train Pipeline's eval_cache and set eval_every above 0, or set "
                              "weights to 'plain'. Nothing was trained.")
        name, overwrite = inputs.get("name"), inputs.get("overwrite", False)
        if not isinstance(name, str):
            continue
        if kind == SAVE_LORA:
            label, targets = "SaveLoRA", [safe_lora_target(compat.first_folder("loras"), n)
                                          for n in pair_names(name, outputs.pair)]
        else:
            label, targets = "Save Model", [safe_lora_target(compat.first_folder("diffusion_models"), name,
                                                             what="model", folder="diffusion_models")]
        for target in targets:
            if overwrite is False and target.exists():
                raise ConfigError(f"{label}'s name {name!r} is taken: {target} already exists and overwrite is off, "
                                  f"so the {'LoRA' if kind == SAVE_LORA else 'model'} could not be saved after "
                                  f"training. Choose another name, or turn on {label}'s overwrite to replace it. "
                                  "Nothing was trained.")

