"""The diffusion-model files a full fine-tune (lora.kind = "full") writes in <run_dir>/model/:
model_step<N>.safetensors at train.save_every and model_final.safetensors at the end, and with
train.ema_decay the EMA model beside each one (<name>_ema.safetensors, engine/lora_files.py). Each holds the whole
diffusion model's state dict in ComfyUI's own key format (no prefix), bfloat16, which ComfyUI's
UNETLoader / comfy.sd.load_diffusion_model read from models/diffusion_models/. Shared by the server and the
ranks: torch only inside the function that converts.
"""
from __future__ import annotations

from pathlib import Path

from .lora_files import ema_file, is_ema_file

FOLDER = "model"
FINAL = "model_final.safetensors"
SAVE_DTYPES = ("bfloat16", "float8_e4m3fn")  # what PipeTrain Save Model writes


def step_file(step: int) -> str:
    return f"model_step{step:06d}.safetensors"


def newest_model(run_dir: str | Path, ema: bool = False) -> Path | None:
    """model_final.safetensors of the run, else its newest model_step file, else None; with `ema`, the EMA
    model saved beside that file (None where the run kept no EMA)."""
    folder = Path(run_dir) / FOLDER
    steps = sorted(p for p in folder.glob("model_step*.safetensors") if not is_ema_file(p))
    newest = folder / FINAL if (folder / FINAL).is_file() else (steps[-1] if steps else None)
    if newest is None or not ema:
        return newest
    return ema_file(newest) if ema_file(newest).is_file() else None


def in_save_dtype(tensors: dict, dtype: str) -> dict:
    """bfloat16: every floating tensor in bfloat16. float8_e4m3fn: the weight matrices of linear and conv layers
    (floating, 2+ dims, key ending '.weight') in float8_e4m3fn and the rest (norms, biases, embeddings) in
    bfloat16, as ComfyUI's own fp8 files are; ComfyUI's loader sees fp8 as the main dtype and computes in a
    higher one."""
    import torch

    if dtype not in SAVE_DTYPES:
        raise ValueError(f"dtype is {dtype!r}: choose one of {', '.join(SAVE_DTYPES)}.")
    out = {}
    for key, tensor in tensors.items():
        if not tensor.is_floating_point():
            out[key] = tensor
        elif dtype == "float8_e4m3fn" and tensor.dim() >= 2 and key.endswith(".weight"):
            top = torch.finfo(torch.float8_e4m3fn).max  # out-of-range values would turn into NaN, not saturate
            out[key] = tensor.float().clamp(-top, top).to(torch.float8_e4m3fn)
        else:
            out[key] = tensor.to(torch.bfloat16)
    return out
