"""What a run writes while it trains: the trained weights at save steps (a LoRA file, or a full fine-tune's
model file, each with its EMA twin) and the checkpoints a resume continues from.

Both are collectives. Pipelined, every stage holds part of the trained weights and of their EMA, so all
ranks gather them and rank 0 writes; every rank takes part in a checkpoint (DeepSpeed's rule), and each
node keeps and prunes its own copy (no shared filesystem needed).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .. import model_files
from ..config.base_loras import identity as base_lora_identity
from ..config.run import RunConfig
from ..events import EventLog
from ..lora_files import ema_file, lora_step_file
from ..version import __version__
from . import checkpoints
from . import distributed as dist


def lora_metadata(cfg: RunConfig, fingerprint: str) -> dict[str, str]:
    """The safetensors metadata of every file a run saves: where it came from."""
    return {
        "pipetrain_version": __version__,
        "pipetrain_base_model": os.path.basename(cfg.model_path),
        "pipetrain_rank": str(cfg.lora.rank),
        "pipetrain_alpha": str(cfg.lora.effective_alpha),
        "pipetrain_targets": cfg.lora.targets,
        "pipetrain_adapter": cfg.lora.kind,
        "pipetrain_dataset_fingerprint": fingerprint,
        "pipetrain_run": cfg.run_name,
        **({"pipetrain_base_loras": json.dumps(base_lora_identity(cfg.base_loras))} if cfg.base_loras else {}),
    }


class RunSaver:
    """Saves of one run. `lora_names` maps a pipelined rank's trained parameters (by id) to their names in the
    files; `ema` is the run's WeightEma or None; `signature` goes into every checkpoint (engine/train/checkpoints.py)."""

    def __init__(self, cfg: RunConfig, model, engine, events: EventLog, *, ema, lora_names: dict[int, str] | None,
                 signature: dict, fingerprint: str, total_steps: int):
        self.cfg, self.model, self.engine, self.events, self.ema = cfg, model, engine, events, ema
        self.lora_names, self.signature, self.total_steps = lora_names, signature, total_steps
        self.pipelined = cfg.memory.pipeline_stages > 1
        self.full = cfg.lora.kind == "full"  # the whole diffusion model is saved, not a LoRA
        self.run_dir = Path(cfg.run_dir)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.meta = lora_metadata(cfg, fingerprint)
        if self.full:
            self.step_file, self.final = model_files.step_file, self.run_dir / model_files.FOLDER / model_files.FINAL
        else:
            self.step_file, self.final = lora_step_file, self.run_dir / "lora" / "lora_final.safetensors"

    def file_at(self, step: int) -> str | None:
        """The file name this step saves, if any (the final step saves the final file)."""
        if step == self.total_steps:
            return self.final.name
        save_every = self.cfg.train.save_every
        return self.step_file(step) if save_every and step and step % save_every == 0 else None

    def weights(self, name: str, step: int) -> None:
        """Save the trained weights (and their EMA) as `name` in the run's lora/ or model folder."""
        from .lora import lora_state_dict, lora_tensors
        from .lora import save_lora as write

        rank, ema, t = dist.rank(), self.ema, self.cfg.train
        if self.pipelined:
            from . import pipeline

            named = pipeline.gather_weights(self.engine.module, self.lora_names)
            averaged = pipeline.gather_tensors(ema.tensors()) if ema else None
        else:
            named = (None if self.full else lora_tensors(self.model.diffusion_model)) if rank == 0 else None
            averaged = ema.tensors() if ema and rank == 0 else None
        if rank != 0:
            return
        module = self.model.diffusion_model
        if self.full:  # the whole diffusion model, bf16, ComfyUI's keys (engine/model_files.py); pipelined, the
            # other stages' trained blocks over rank 0's copy; the EMA file: the averages in their place
            from .full_tune import model_tensors

            path = self.run_dir / model_files.FOLDER / name
            files = {path: model_tensors(module, named)}
            if averaged is not None:
                files[ema_file(path)] = model_tensors(module, averaged)
        else:  # DoRA's file is made against the base weights (every rank holds them; pipelined ones on the CPU)
            path = self.run_dir / "lora" / name
            files = {path: lora_state_dict(named, self.cfg.lora, module)}
            if averaged is not None:  # fp32, the key format of the plain file
                files[ema_file(path)] = lora_state_dict(averaged, self.cfg.lora, module)
        for target, tensors in files.items():
            extra = ({"pipetrain_ema_decay": str(t.ema_decay), "pipetrain_ema_start_step": str(t.ema_start_step)}
                     if target != path else {})
            write(target, tensors, {**self.meta, "pipetrain_steps": str(step), **extra})
        self.events.emit("saved", step=step, path=str(path),
                         **({"ema_path": str(ema_file(path))} if averaged else {}))

    def checkpoint(self, step: int) -> None:
        """A checkpoint of every rank's state, the EMA included; older ones pruned."""
        tag = checkpoints.tag_for(step)
        averaged = None  # the whole EMA, in every node's checkpoint folder (no shared filesystem needed)
        if self.ema is not None and (self.pipelined or dist.local_rank() == 0):
            if self.pipelined:
                from . import pipeline

                averaged = pipeline.gather_named(self.ema.tensors(), everywhere=True)
            else:
                averaged = self.ema.tensors()
        checkpoints.save_checkpoint(self.engine, self.ckpt_root, tag, {"step": step, "signature": self.signature},
                                    deepspeed=self.cfg.launch.backend == "deepspeed",
                                    ema=averaged if dist.local_rank() == 0 else None)
        if dist.local_rank() == 0:  # every node prunes its own copy
            checkpoints.prune(self.ckpt_root, tag)
        if dist.rank() == 0:
            self.events.emit("checkpoint", step=step, path=str(self.ckpt_root / tag))
