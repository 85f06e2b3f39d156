"""EvalSpec: the held-out eval set's settings in run.json (`eval`), validated like the rest of RunConfig
(its cache folder is checked with the other files, RunConfig.check_files).

Plain data (no torch). What the engine does with it: engine/train/eval_set.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from .checks import ConfigError

# Fixed points of the run's own timestep distribution the eval loss is measured at (quantiles of
# the draws train.timestep_sampling / timestep_shift / min_t / max_t give): the eval covers the
# noise levels the run trains, low to high, the same ones at every evaluation.
EVAL_QUANTILES = (0.1, 0.3, 0.5, 0.7, 0.9)


@dataclass(frozen=True)
class EvalSpec:
    cache_dir: str = ""  # a CacheLatents cache of the held-out items; "" = no eval set
    every: int = 0  # evaluate every N optimizer steps (and after the last one); 0 = not during training
    before_start: bool = False  # also evaluate before the first step (the base model's loss, step 0)
    seed: int = 0  # the eval noise's own seed, independent of train.seed (runs with other seeds compare)
    early_stop: int = 0  # end the run after N evals in a row without a lower eval loss; 0 = off

    @property
    def enabled(self) -> bool:
        return bool(self.cache_dir) and (self.every > 0 or self.before_start)

    def due(self, step: int, total: int) -> bool:
        """Whether to evaluate after optimizer step `step` (step 0 = before training)."""
        if not self.enabled:
            return False
        if step == 0:
            return self.before_start
        return self.every > 0 and (step % self.every == 0 or step == total)

    def validate(self) -> None:
        if self.every < 0:
            raise ConfigError(f"eval.every (eval_every) is {self.every}: use 0 (no eval during training) or a "
                              "number of steps such as 100.")
        if self.early_stop < 0:
            raise ConfigError(f"eval.early_stop is {self.early_stop}: use 0 (off) or a number of evals such as 3.")
        if self.early_stop > 0 and not (self.cache_dir and self.every > 0):
            raise ConfigError(f"eval.early_stop is {self.early_stop} but no eval runs during training: connect an "
                              "eval set (eval_cache) and set eval_every above 0, or set early_stop to 0.")
        if self.seed < 0:
            raise ConfigError(f"eval.seed is {self.seed}: use 0 or a positive number.")
        if not self.cache_dir and (self.every or self.before_start):
            raise ConfigError("eval.every / eval.before_start are set but eval.cache_dir is empty: connect an "
                              "eval set (eval_cache, a Cache Latents output), or set eval_every to 0 and "
                              "eval_before_start to false.")
