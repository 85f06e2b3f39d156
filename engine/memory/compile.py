"""torch.compile per block, with ComfyUI's attention left outside the compiled graphs.

Compiling whole Flux blocks including attention crashed in backward on the H200 (illegal memory
access, GPU-BASELINE.md), while compiling them with attention as an eager region was 1.36x faster
than eager. engine/patches/attention.py makes ComfyUI's attention calls graph breaks, in the
training process only, so dynamo runs each one eagerly (SDPA/cuDNN as without compile).
"""
from __future__ import annotations

import torch
from torch import nn

from ..patches.attention import keep_attention_eager
from .blocks import blocks


def compile_blocks(diffusion_model: nn.Module, backend: str = "inductor", mode: str | None = None) -> int:
    """Compile each block's forward (one graph per block type and shape). Returns the block count.
    mode: torch.compile's (None = its default; benchmarks/memory.py --compile-mode tries others).

    Must wrap before block swap and checkpointing, so they wrap the compiled forward.
    """
    keep_attention_eager()
    wrapped = blocks(diffusion_model)
    for block in wrapped:
        block.forward = torch.compile(block.forward, backend=backend, mode=mode)
    return len(wrapped)
