"""Names of the LoRA files a run writes in <run_dir>/lora/: lora_step<N>.safetensors and
lora_final.safetensors, and with train.ema_decay the EMA of the same weights beside each one,
<name>_ema.safetensors (same key format: ComfyUI's LoRA loader reads both). Shared by the server and
the ranks: no torch here.
"""
from __future__ import annotations

from pathlib import Path

EMA_SUFFIX = "_ema"


def lora_step_file(step: int) -> str:
    return f"lora_step{step:06d}.safetensors"


def ema_file(path: str | Path) -> Path:
    """The EMA partner of a LoRA file: lora_final.safetensors -> lora_final_ema.safetensors."""
    path = Path(path)
    return path.with_name(path.stem + EMA_SUFFIX + path.suffix)


def is_ema_file(path: str | Path) -> bool:
    return Path(path).stem.endswith(EMA_SUFFIX)
