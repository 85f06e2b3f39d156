"""Memory options on any ComfyUI diffusion model through its block lists (engine/memory/blocks.py).

`apply_memory_options` is the one entry point the train loop calls, after LoRA injection:
    compile (innermost) -> block swap guard -> checkpointing (outermost) on each block's forward,
then places the model on the device (all but the swapped blocks' frozen weights).
The parts: engine/memory/compile.py, engine/memory/block_swap.py, engine/memory/activation_checkpointing.py.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from ..config.checks import check_block_swap
from ..config.sections import MemorySpec
from .blocks import blocks


@dataclass
class MemoryPlan:
    """What was applied; `hidden()` wraps framework code that moves the whole model (DeepSpeed init)."""

    checkpointing: str = "off"
    swapper: object | None = None  # block_swap.BlockSwapper
    offloader: object | None = None  # checkpointing.ActivationOffloader
    compiled_blocks: int = 0

    def hidden(self):
        return self.swapper.hidden() if self.swapper is not None else contextlib.nullcontext()

    def for_sampling(self, keep_swapping: bool):
        """Context for rendering samples: the swap schedule as in training, or (keep_swapping False)
        every block on the device, which is faster and needs the whole model's memory."""
        if self.swapper is None or keep_swapping:
            return contextlib.nullcontext()
        return self.swapper.all_resident()


def unswappable_weight(diffusion_model: nn.Module) -> tuple[str, str] | None:
    """(name, tensor type) of the first block weight block swap cannot pack, or None. Block swap packs each
    block's tensors into one byte buffer: tensor subclasses (the QuantizedTensor of a quantized file's
    layers, ComfyUI 0.33+) cannot join it."""
    for block in blocks(diffusion_model):
        for name, param in block.named_parameters():
            if type(param.data) is not torch.Tensor:
                return name, type(param.data).__name__
    return None


def check_plain_weights(diffusion_model: nn.Module) -> None:
    from ..config.checks import ConfigError

    found = unswappable_weight(diffusion_model)
    if found is not None:
        raise ConfigError(f"block_swap on a quantized model file: {found[0]} holds a {found[1]} (ComfyUI's quantized "
                          "layers), which block swap cannot move. Set block_swap to 0 (a quantized model already "
                          "needs less memory), or train on the full-precision file with base_dtype float8_e4m3fn "
                          "and block swap.")


def enable_activation_checkpointing(diffusion_model: nn.Module) -> int:
    """Recompute each block's activations in backward instead of storing them (non-reentrant, per
    block). Returns how many modules were wrapped."""
    from .activation_checkpointing import enable_checkpointing

    enable_checkpointing(diffusion_model, "on")
    return len(blocks(diffusion_model))


def apply_memory_options(model: nn.Module, spec: MemorySpec, device: torch.device | None,
                         prefetch: int = 1) -> MemoryPlan:
    """Apply spec to ComfyUI's BaseModel `model` (LoRA already injected).

    device None: leave placement to the caller (the pipeline path, where DeepSpeed moves stages).
    """
    dm = model.diffusion_model
    plan = MemoryPlan(checkpointing=spec.activation_checkpointing)
    if spec.compile_blocks:
        from .compile import TORCH_MODES, compile_blocks

        plan.compiled_blocks = compile_blocks(dm, mode=TORCH_MODES[spec.compile_mode])
    if spec.block_swap:
        from .block_swap import BlockSwapper

        check_block_swap(spec.block_swap, spec.pipeline_stages)  # device is None only for pipeline stages
        check_plain_weights(dm)
        plan.swapper = BlockSwapper(blocks(dm), spec.block_swap, device, prefetch=prefetch,
                                    checkpointed=spec.activation_checkpointing != "off")
    if spec.activation_checkpointing != "off":
        from .activation_checkpointing import enable_checkpointing

        plan.offloader = enable_checkpointing(dm, spec.activation_checkpointing)
    if device is not None:
        with plan.hidden():
            model.to(device)
    return plan
