"""Every change PipeTrain makes to upstream (ComfyUI) code, and how it decides which are needed.

- trainable.py: `make_trainable(diffusion_model, run_forward)`, the engine's one call per training
  process: sets the host's training flag, probes each block class (probe.py) and installs an
  out-of-place forward (fixes.py; flux.py, ltxv.py, ltxav.py, minimax.py, pixeldit.py) only where
  upstream's own would train wrongly.
- host.py: the host's version and training flag. verdicts.py: the probe's cached verdicts.
- guard.py: the first-call check that a block wrote into none of its inputs.
- kitchen.py: a backward for comfy-kitchen's fused rope/norm ops. probe_batch.py: the probe's input.
- attention.py: ComfyUI's attention calls left eager inside compiled blocks (engine/memory/compile.py).
- peft.py: peft's LoRA Linear computing in the activations' dtype (engine/train/lora.py).
- deepspeed.py: the private parts of DeepSpeed's pipeline engine PipeTrain sets (engine/train/pipeline.py).
The ComfyUI server process is never patched. Importing this package imports no ComfyUI code.
"""
from __future__ import annotations

from .host import comfy_version, set_training_mode, training_mode
from .trainable import UnsafeBlock, is_trainable, make_trainable, stale_blocks

__all__ = ["UnsafeBlock", "comfy_version", "is_trainable", "make_trainable", "set_training_mode", "stale_blocks", "training_mode"]
