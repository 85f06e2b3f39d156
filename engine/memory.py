"""Memory options that work on any ComfyUI diffusion model through its block lists."""
from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from .blocks import blocks


def _checkpointed(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run


def enable_activation_checkpointing(diffusion_model: nn.Module) -> int:
    """Recompute each block's activations in backward instead of storing them.

    Non-reentrant checkpointing, per block. Returns how many modules were wrapped.
    """
    wrapped = blocks(diffusion_model)
    for block in wrapped:
        block.forward = _checkpointed(block.forward)
    return len(wrapped)
