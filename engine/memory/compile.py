"""torch.compile per block, with ComfyUI's attention left outside the compiled graphs.

Compiling whole Flux blocks including attention crashed in backward on the H200 (illegal memory
access, GPU-BASELINE.md), while compiling them with attention as an eager region was 1.36x faster
than eager. engine/patches/attention.py makes ComfyUI's attention calls graph breaks, in the
training process only, so dynamo runs each one eagerly (SDPA/cuDNN as without compile).

memory.compile_mode "cuda_graphs" compiles with inductor's reduce-overhead mode: each compiled region
between two attention calls is replayed as a CUDA graph, so the host launches one graph instead of its
kernels one by one (a Flux-dev step had ~110 ms of host-bound gaps; docs/benchmarks.md). The graphs'
outputs live in memory the next replay reuses, so every call of the diffusion model starts a new
replay generation (`_new_graph_step`): by then the previous call's block outputs are consumed (its
backward has run, or, when sampling, its result was computed by the eager head), and the gradients
kept across micro-batches are in memory of their own (`_grad_in_own_memory`). On a CPU inductor
skips the graphs and runs the compiled code as in the default mode.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from ..patches.attention import keep_attention_eager
from .blocks import blocks


# memory.compile_mode -> torch.compile's mode argument
TORCH_MODES = {"default": None, "cuda_graphs": "reduce-overhead"}


def compile_blocks(diffusion_model: nn.Module, backend: str = "inductor", mode: str | None = None) -> int:
    """Compile each block's forward (one graph per block type and shape). Returns the block count.
    mode: torch.compile's (None = its default, "reduce-overhead" = CUDA graphs; benchmarks/memory.py
    --compile-mode tries others).

    Must wrap before block swap and checkpointing, so they wrap the compiled forward.
    """
    keep_attention_eager()
    wrapped = blocks(diffusion_model)
    for block in wrapped:
        block.forward = torch.compile(block.forward, backend=backend, mode=mode)
    if mode == "reduce-overhead":
        diffusion_model.register_forward_pre_hook(_new_graph_step)
        for param in diffusion_model.parameters():
            if param.requires_grad:
                param.register_hook(functools.partial(_grad_in_own_memory, param))
    return len(wrapped)


def _new_graph_step(module, args):
    torch.compiler.cudagraph_mark_step_begin()


def _grad_in_own_memory(param: nn.Parameter, grad: torch.Tensor) -> torch.Tensor:
    """A trainable weight's first gradient of a step, copied out of the graphs' memory: autograd would
    keep the graph's output tensor as param.grad, and the next micro-batch's replay overwrites it before
    gradient accumulation adds to it (seen on an H200 with 4 micro-batches per step). Later micro-batches
    add into that copy in place, so only the first one per step is copied."""
    return grad.clone() if param.grad is None else grad
