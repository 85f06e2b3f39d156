"""The last net under the probe: a block that writes into its input on its first real call stops
training with an error naming it.

engine/patches/trainable.py probes the first block of each class on a small input before training.
A block can still take another path on the real batch (another resolution, a mask the probe's
input lacked), and an in-place update of its input then makes LoRA backward fail with a bare
autograd error, or, under activation checkpointing, gives wrong gradients (MODEL-NOTES.md finding
2). So every block gets a one-shot hook on its first call: if a tensor it was given (a positional
or keyword argument, or one inside a tuple/list argument) has a newer autograd version after the
block ran, the block wrote into its input, and training stops with a message that names the block
class. The hooks remove themselves after that first call.

The inputs are held weakly between the two hooks: a block that raises on its first call (a GPU out of
memory in the fit probe's no-checkpointing pass) must not keep its input, and through the input's
autograd graph every activation before it, alive for the next pass.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn

from ..memory.blocks import blocks


class InPlaceBlockError(RuntimeError):
    """A block updated one of its input tensors in place (no PipeTrain out-of-place copy for it)."""


def _tensors(args, kwargs):
    for value in list(args) + list(kwargs.values()):
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if torch.is_tensor(item):
                yield item


def guard_blocks(diffusion_model: nn.Module) -> int:
    """Add the one-shot check to every block (engine.memory.blocks); returns how many were guarded."""
    guarded = 0
    for index, block in enumerate(blocks(diffusion_model)):
        state = {}

        def before(module, args, kwargs, state=state):
            state["versions"] = [(weakref.ref(t), t._version) for t in _tensors(args, kwargs)]

        def after(module, args, kwargs, output, state=state, index=index):
            for handle in state.pop("handles", ()):
                handle.remove()
            inputs = [(ref(), version) for ref, version in state.pop("versions", [])]
            changed = [t for t, version in inputs if t is not None and t._version != version]
            if changed:
                shape = tuple(changed[0].shape)
                raise InPlaceBlockError(
                    f"block {index} ({type(module).__module__}.{type(module).__qualname__}) updated an input tensor "
                    f"{shape} in place. LoRA training needs an out-of-place forward for it (its backward fails, "
                    "and with activation checkpointing gradients can be silently wrong). PipeTrain has such "
                    "forwards for the Flux-style, Hunyuan, LTXV and MiniMax H3 blocks (engine/patches/); this "
                    "block needs one added there, or use a ComfyUI release PipeTrain supports for this model "
                    "(docs/comfyui-versions.md).")

        state["handles"] = (block.register_forward_pre_hook(before, with_kwargs=True),
                            block.register_forward_hook(after, with_kwargs=True))
        guarded += 1
    return guarded
