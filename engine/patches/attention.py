"""ComfyUI's attention calls as graph breaks for torch.compile (engine/memory/compile.py).

ComfyUI's model code calls attention through module-level names imported from
comfy.ldm.modules.attention (`optimized_attention`, `attention_pytorch`, ...). Those names are
rebound, in the training process only, to torch.compiler.disable wrappers of the same functions,
in every loaded comfy.ldm module: dynamo breaks the graph around each call and runs it eagerly.
tests/with_comfy/test_memory_block_swap.py checks that compiled blocks give the same gradients.
"""
from __future__ import annotations

import sys

import torch

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
