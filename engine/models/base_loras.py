"""Merging run.json's base_loras into the loaded base model, with ComfyUI's own LoRA code.

comfy.sd.load_lora_for_models reads each file the way LoraLoaderModelOnly does (its key names, its
LoRA/LoCon/LoHa/... formats) and records the patches on a clone of the model's patcher;
comfy.lora.calculate_weight then computes each patched weight as sampling would (in float32), and
the result is written into the base weight in place. The base model thus holds the graph's stack
before the new LoRA is added, and no copy of the original weights is kept.
"""
from __future__ import annotations

import logging

import torch

from ..config.base_loras import BaseLora

log = logging.getLogger("PipeTrain")


class BaseLoraError(RuntimeError):
    pass


def merge_base_loras(patcher, loras: tuple[BaseLora, ...]) -> int:
    """Merge `loras` (in order) into patcher.model's weights (not a quantized file's: the caller refuses
    those); returns how many weights changed."""
    import comfy.lora
    import comfy.sd
    import comfy.utils

    if not loras:
        return 0
    stacked = patcher
    for lora in loras:
        before = _patch_count(stacked)
        stacked, _ = comfy.sd.load_lora_for_models(stacked, None, comfy.utils.load_torch_file(lora.path, safe_load=True),
                                                   lora.strength, 0.0)
        if _patch_count(stacked) == before:
            raise BaseLoraError(f"base_loras: {lora.path} matches no layer of this model (ComfyUI's LoRA loader "
                                "loads none of its keys): it is a LoRA of another model, remove it.")
    model = stacked.model
    with torch.no_grad():
        for key, patches in stacked.patches.items():
            weight = comfy.utils.get_attr(model, key)
            merged = comfy.lora.calculate_weight(patches, weight.to(torch.float32, copy=True), key)
            weight.copy_(merged.to(weight.dtype))
    log.info("PipeTrain: merged %d base LoRA(s) into %d weights", len(loras), len(stacked.patches))
    return len(stacked.patches)


def _patch_count(patcher) -> int:
    return sum(len(p) for p in patcher.patches.values())
