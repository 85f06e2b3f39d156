"""base_loras: LoRA files merged into the base model before training (Train Pipeline's `model` input).

A graph that loads a model and stacks LoRAs on it (LoraLoaderModelOnly, LoraLoader) trains a new LoRA
on top of that stack: the node finds the files and strengths in the queued graph (nodes/model_sources.py),
run.json lists them in order, and every rank merges them into the base weights with ComfyUI's own
LoRA code (engine/models/base_loras.py) before its new LoRA is added. The saved LoRA holds only the
new weights; applied after the same stack at inference it gives the model that was trained.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .checks import check


@dataclass(frozen=True)
class BaseLora:
    path: str  # a LoRA file ComfyUI's LoRA loaders read
    strength: float = 1.0  # LoraLoader's strength_model

    def validate(self) -> None:
        check(bool(self.path), "base_loras: an entry has no path: give the LoRA file, or remove the entry.")
        check(math.isfinite(self.strength) and self.strength != 0.0,
              f"base_loras: {os.path.basename(self.path)} has strength {self.strength}: use a non-zero number (a "
              "LoRA at strength 0 changes nothing: remove it).")

    def check_file(self) -> None:
        check(os.path.isfile(self.path), f"base_loras: the LoRA file {self.path} does not exist: put it back, or "
              "remove it from the graph's LoRA loaders (run.json base_loras headless).")


def identity(entries) -> list[list]:
    """What a resume compares: each file's name (its folder is machine-local) and strength, in order."""
    out = []
    for e in entries or ():
        path, strength = (e.get("path", ""), e.get("strength", 1.0)) if isinstance(e, dict) else (e.path, e.strength)
        out.append([os.path.basename(os.path.normpath(path)) if path else "", strength])
    return out
