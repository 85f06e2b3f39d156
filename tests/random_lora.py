"""A seeded random LoRA for a model file, in the kohya layout ComfyUI's LoRA loaders read."""
from __future__ import annotations

from pathlib import Path

import torch


def write_random_lora(model_file: str, path: Path, rank: int = 4, scale: float = 0.1, seed: int = 0) -> Path:
    """A LoRA in the kohya layout ComfyUI's loaders read (lora_up / lora_down per linear weight of the file),
    with seeded random factors: a stand-in for a LoRA the user downloaded."""
    from safetensors.torch import load_file, save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for key, weight in load_file(model_file).items():
        if key.endswith(".weight") and weight.ndim == 2 and min(weight.shape) >= rank:
            name = "diffusion_model." + key[:-len(".weight")]
            tensors[f"{name}.lora_up.weight"] = torch.randn(weight.shape[0], rank, generator=gen) * scale
            tensors[f"{name}.lora_down.weight"] = torch.randn(rank, weight.shape[1], generator=gen) * scale
    save_file(tensors, str(path))
    return path
