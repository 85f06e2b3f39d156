"""Rules that join settings of several sections of run.json: each written once, here, and called
from every place that needs it (RunConfig.validate, the nodes' checks before launch, the engine).
Plain data, no torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .checks import ConfigError, check
from .choices import OPTIMIZER_LR_RANGES

if TYPE_CHECKING:  # annotations only (no import at run time)
    from .sections import MemorySpec, TrainSpec


def check_optimizer_settings(memory: "MemorySpec", train: "TrainSpec") -> None:
    """The learning rate must suit the optimizer; Prodigy's one step size needs all weights on each rank."""
    low, high = OPTIMIZER_LR_RANGES.get(memory.optimizer, (0.0, float("inf")))
    if not low <= train.learning_rate <= high:
        typical = {"prodigy": "1.0", "adafactor": "1e-2"}.get(memory.optimizer, "1e-4")
        raise ConfigError(f"train.learning_rate {train.learning_rate:g} does not suit memory.optimizer "
                          f"{memory.optimizer!r} (sensible: {low:g} to {high:g}): set learning_rate to about "
                          f"{typical}, or choose another optimizer.")
    check(memory.optimizer != "prodigy" or memory.pipeline_stages == 1,
          "memory.optimizer 'prodigy' estimates one step size from all LoRA weights, but with pipeline_stages "
          f"{memory.pipeline_stages} each stage holds only part of them: set pipeline_stages to 1 or choose "
          "another optimizer.")
