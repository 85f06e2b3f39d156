"""Activation checkpointing per block: off, on (recompute in backward), cpu_offload.

'on': each block runs under non-reentrant torch.utils.checkpoint, so autograd keeps only the
block's inputs and recomputes the rest during backward (about one extra forward of compute).
'cpu_offload': the same, and the inputs it keeps are copied to pinned CPU RAM on a side CUDA
stream as soon as they are saved, then copied back when backward reaches the block (like
diffusion-pipe's 'unsloth' mode). For a video model those inputs are most of what checkpointing
still holds (Wan 14B at 81 frames: 40 blocks x ~220 MB).

Non-reentrant checkpoint saves its tensor positional arguments as saved tensors of the graph,
which is where the offload hooks see them; tensor keyword arguments would stay in a closure on
the GPU, so the wrapper passes them positionally.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .blocks import blocks

MIN_OFFLOAD_BYTES = 1 << 20  # smaller saved inputs on a GPU (time embeddings, rope tables) stay there


class ActivationOffloader:
    """saved_tensors_hooks that park saved tensors in (pinned) CPU memory.

    On CUDA the copy runs on a side stream and the GPU tensor is released once that copy is done;
    backward copies it back on the compute stream. On a CPU device the "offload side" is a
    separate CPU copy, so tests can see that the device tensor itself is no longer held.
    """

    def __init__(self, min_bytes: int = MIN_OFFLOAD_BYTES):
        self.min_bytes = min_bytes
        self._stream = None
        self.offloaded = 0  # tensors moved out so far (tests and the benchmark read it)

    def _side_stream(self, device: torch.device):
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def pack(self, tensor: torch.Tensor):
        if isinstance(tensor, nn.Parameter):
            return tensor
        if tensor.device.type == "cuda" and tensor.numel() * tensor.element_size() < self.min_bytes:
            return tensor
        self.offloaded += 1
        if tensor.device.type != "cuda":
            return ("copy", tensor.device, tensor.detach().clone())
        stream = self._side_stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            done = stream.record_event()
        tensor.record_stream(stream)  # the allocator must not reuse it before the copy has read it
        return ("cuda", tensor.device, host, done)

    @staticmethod
    def unpack(packed):
        if torch.is_tensor(packed):
            return packed
        if packed[0] == "copy":
            return packed[2]
        _, device, host, done = packed
        torch.cuda.current_stream(device).wait_event(done)
        return host.to(device, non_blocking=True)

    def saving(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def draws_random_numbers(block: nn.Module) -> bool:
    """True when the block has an active dropout (a LoRA dropout, say): only then must recompute
    replay the forward's random state."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in block.modules())


def _checkpointed(forward, offloader: ActivationOffloader | None, random: bool):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        names = [k for k, v in kwargs.items() if torch.is_tensor(v)]
        rest = {k: v for k, v in kwargs.items() if k not in names}
        count = len(args)

        def call(*flat):
            return forward(*flat[:count], **rest, **dict(zip(names, flat[count:])))

        saving = offloader.saving() if offloader is not None else contextlib.nullcontext()
        with saving:
            # Saving and restoring the RNG state costs host time on every block (Flux-dev with per-block
            # compile on an H200: 0.69 s/step with it, 0.54-0.62 without); keep it only where a
            # dropout needs it (tests/with_comfy/test_checkpointing_rng.py).
            return checkpoint(call, *args, *(kwargs[k] for k in names), use_reentrant=False,
                              preserve_rng_state=random)
    return run


def enable_checkpointing(diffusion_model: nn.Module, mode: str = "on") -> ActivationOffloader | None:
    """Wrap every block's forward for `mode` ('on' or 'cpu_offload'). Returns the offloader, if any.

    Must wrap the forward after any block swap guard (engine/memory/block_swap.py), so the guard runs
    again when backward recomputes the block.
    """
    if mode not in ("on", "cpu_offload"):
        raise ValueError(f"checkpointing mode {mode!r}")
    offloader = ActivationOffloader() if mode == "cpu_offload" else None
    for block in blocks(diffusion_model):
        block.forward = _checkpointed(block.forward, offloader, draws_random_numbers(block))
    return offloader
