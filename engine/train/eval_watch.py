"""The held-out eval during a run: run at its due steps (engine/config/eval.py), kept as the best-step
history in best.json (engine/best_step.py), and the early-stop decision, which rank 0 makes for all ranks
(its best.json holds the whole history; after a resume a rank on another node may have none)."""
from __future__ import annotations

from pathlib import Path

import torch

from .. import best_step
from ..config.run import RunConfig
from ..events import EventLog
from . import distributed as dist
from .eval_set import EvalSet, report
from .saving import RunSaver


class EvalWatch:
    def __init__(self, cfg: RunConfig, objective, device: torch.device, engine, adapter, saver: RunSaver,
                 start_step: int, events: EventLog, tb, wb):
        self.cfg, self.device, self.engine, self.adapter, self.saver = cfg, device, engine, adapter, saver
        self.events, self.tb, self.wb = events, tb, wb
        pipelined = cfg.memory.pipeline_stages > 1
        # a collective, on every rank at the same steps (engine/train/eval_set.py)
        self.evaluator = EvalSet.create(cfg, objective, device, engine, pipelined)
        self.history = (best_step.read(Path(cfg.run_dir), start_step)
                        if self.evaluator is not None and dist.rank() == 0 else [])

    def __call__(self, step: int) -> bool:
        """Eval when due; True when early_stop says to end the run after this step."""
        if self.evaluator is None or not self.cfg.eval.due(step, self.saver.total_steps):
            return False
        rank = dist.rank()
        result = self.evaluator.run(self.engine, self.adapter)
        if rank == 0:  # saves come right after the eval of the same step
            self.history = best_step.record(self.history, step, result["loss"], self.saver.file_at(step))
        early_stop = self.cfg.eval.early_stop
        stopping = dist.any_true(rank == 0 and step > 0 and best_step.should_stop(self.history, early_stop),
                                 self.device)
        if rank == 0:
            if stopping:  # the final file is saved at this step
                self.history = best_step.attach_file(self.history, step, self.saver.final.name)
            found = best_step.write(Path(self.cfg.run_dir), self.history)
            report({**result, "best_step": found["step"], "best_eval_loss": found["eval_loss"],
                    "best_file": found["file"]}, step, self.events, self.tb)
            self.wb.eval(result, step)
        return stopping

    def stop_message(self, step: int) -> str:
        return best_step.stop_message(step, self.cfg.eval.early_stop, self.history)
