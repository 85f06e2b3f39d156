"""torch.compile per block, with ComfyUI's attention left outside the compiled graphs.

Compiling whole Flux blocks including attention crashed in backward on the H200 (illegal memory
access, GPU-BASELINE.md), while compiling them with attention as an eager region was 1.36x faster
than eager. ComfyUI's model code calls attention through module-level names imported from
comfy.ldm.modules.attention (`optimized_attention`, `attention_pytorch`, ...); those names are
rebound, in the training process only, to torch.compiler.disable wrappers, so dynamo breaks the
graph around each attention call and runs it eagerly (SDPA/cuDNN as without compile).
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from .blocks import blocks

_ATTENTION_MODULE = "comfy.ldm.modules.attention"
_eager: dict[int, object] = {}  # id(original function) -> its eager wrapper


def _attention_functions() -> set[int]:
    attention = sys.modules[_ATTENTION_MODULE]
    return {id(v) for k, v in vars(attention).items()
            if callable(v) and (k.startswith("attention_") or k.startswith("optimized_attention"))
            and getattr(v, "__module__", "") == _ATTENTION_MODULE}


def keep_attention_eager() -> int:
    """Rebind every ComfyUI attention function name in comfy.ldm.* to an eager wrapper; returns how many."""
    import comfy.ldm.modules.attention  # noqa: F401  (the functions live there)

    originals = _attention_functions()
    count = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("comfy.ldm") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in originals:
                wrapper = _eager.setdefault(id(value), torch.compiler.disable(value, recursive=True))
                setattr(module, attr, wrapper)
                count += 1
    return count


def compile_blocks(diffusion_model: nn.Module, backend: str = "inductor") -> int:
    """Compile each block's forward (one graph per block type and shape). Returns the block count.

    Must wrap before block swap and checkpointing, so they wrap the compiled forward.
    """
    keep_attention_eager()
    wrapped = blocks(diffusion_model)
    for block in wrapped:
        block.forward = torch.compile(block.forward, backend=backend)
    return len(wrapped)
