"""Weights & Biases logging (run.json `monitor`, engine/config/monitor.py): rank 0 logs the scalars TensorBoard
gets (train/loss, train/lr, train/grad_norm, eval/loss and its quantiles) and the whole run.json as the W&B
run's config. Off unless monitor.wandb_project is set; `wandb` is an optional package, imported only then.

`session()` wraps the training (engine/train/loop.py main): the W&B run starts before the model loads, so
a missing package or a failed login stops the run before training, and it finishes however the training
ends (done, Cancel, or an error: then with exit code 1). Every rank but 0, and every run without W&B, gets
a logger that does nothing.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator

from ..config.checks import ConfigError
from ..config.monitor import wandb_missing_message


class WandbLog:
    """The W&B run of rank 0, or nothing (run=None): the loop calls it the same either way."""

    def __init__(self, run: Any = None):
        self.run = run

    def step(self, step: int, loss: float, lr: float, grad_norm: float) -> None:
        if self.run is not None:
            self.run.log({"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm}, step=step)

    def eval(self, result: dict[str, Any], step: int) -> None:
        """engine/train/eval_set.py's result, under TensorBoard's names."""
        if self.run is not None:
            scalars = {"eval/loss": result["loss"]}
            scalars.update({f"eval/loss_q{q:g}": loss for q, loss in zip(result["quantiles"], result["losses"])})
            self.run.log(scalars, step=step)

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.finish(exit_code=exit_code)


def start(cfg, rank: int) -> WandbLog:
    """The W&B run for `cfg` (a RunConfig) on rank 0 when monitor.wandb_project is set; else a no-op logger."""
    m = cfg.monitor
    if rank != 0 or not m.wandb:
        return WandbLog()
    m.check_installed()
    try:
        import wandb
    except ImportError as e:  # installed but broken (a missing dependency of its own)
        raise ConfigError(f"{wandb_missing_message(m.wandb_project)} (importing it failed: {e})") from e
    try:
        run = wandb.init(project=m.wandb_project, entity=m.wandb_entity or None, name=m.wandb_run_name or cfg.run_name,
                         mode=m.wandb_mode, dir=str(Path(cfg.run_dir)), config=cfg.to_dict())
    except Exception as e:  # W&B's own errors (no login, no network, a project it refuses)
        raise ConfigError(f"W&B could not start a run in project {m.wandb_project!r} ({m.wandb_mode}): {e}. Log in "
                          "once with `wandb login` (or set WANDB_API_KEY) where ComfyUI runs, set wandb_mode to "
                          "offline (upload later with `wandb sync`), or leave wandb_project empty.") from e
    where = (getattr(run, "url", None) if m.wandb_mode == "online" else None) or \
        f"{Path(cfg.run_dir) / 'wandb'} (upload an offline run with `wandb sync`)"
    print(f"W&B run {run.name!r}: {where}", file=sys.stderr, flush=True)
    return WandbLog(run)


@contextlib.contextmanager
def session(cfg, rank: int) -> Iterator[WandbLog]:
    """start(), and the run finished when the block ends: exit code 0, or 1 when it raised."""
    log = start(cfg, rank)
    try:
        yield log
    except BaseException:
        log.finish(exit_code=1)
        raise
    log.finish()
