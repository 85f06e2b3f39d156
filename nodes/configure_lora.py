"""PipeTrainConfigureLoRA: what LoRA to train (rank, alpha, layers, adapter kind, starting point)."""
from __future__ import annotations

from ..engine.config.checks import ConfigError
from ..engine.config.choices import ADAPTER_KINDS, LORA_DTYPES, LORA_TARGET_PRESETS
from ..engine.config.sections import LoraSpec
from . import compat
from .types import LORA

NONE = "none"


class PipeTrainConfigureLoRA:
    CATEGORY = "PipeTrain"
    DESCRIPTION = "Choose the LoRA's size and which layers of the model it adapts."
    RETURN_TYPES = (LORA,)
    RETURN_NAMES = ("lora",)
    FUNCTION = "configure"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "rank": ("INT", {"default": 16, "min": 1, "max": 1024, "tooltip":
                         "LoRA rank: capacity of the adapter. 16-32 suits a style or a character; higher ranks "
                         "learn more detail and make bigger files. Not used by adapter 'full'."}),
                "alpha": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 4096.0, "step": 0.5, "tooltip":
                          "LoRA alpha; the update is scaled by alpha / rank. 0 means alpha = rank (scale 1.0). Not "
                          "used by adapter 'full'."}),
                "dropout": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 0.9, "step": 0.01, "tooltip":
                            "Dropout on the LoRA input during training (0 = off). Small values (0.05) can reduce "
                            "overfitting on tiny datasets."}),
                "targets": (list(LORA_TARGET_PRESETS), {"default": "attention", "tooltip":
                            "Which linear layers of the model's blocks get a LoRA: attention projections only, "
                            "attention + MLP, or every linear layer in the blocks. With adapter 'full' these layers' own "
                            "weights train, and all_linear trains every weight of the blocks (norms too)."}),
                "target_regex": ("STRING", {"default": "", "tooltip":
                                 "Optional regular expression on module names (e.g. 'double_blocks'); when set, only "
                                 "the preset's layers whose name matches are trained."}),
                "start_from": ([NONE] + compat.filenames("loras"), {"default": NONE, "tooltip":
                               "Continue training an existing LoRA from ComfyUI's loras folder (same rank and "
                               "targets), or 'none' to start fresh."}),
                "lora_dtype": (list(LORA_DTYPES), {"default": "float32", "tooltip":
                               "Precision of the trainable LoRA weights. float32 is safest; bfloat16 saves a little "
                               "memory. Adapter 'full': float32 keeps float32 master copies of the trained weights; "
                               "bfloat16 halves their memory (pair it with the adamw8bit_kahan optimizer)."}),
            },
            # Optional so that graphs and API prompts from before the adapter kinds keep working (plain LoRA).
            "optional": {
                "adapter": (list(ADAPTER_KINDS), {"default": "lora", "tooltip":
                            "Adapter kind. lora: low-rank update B x A (the usual choice). loha: Hadamard product of "
                            "two low-rank updates (more expressive per parameter). lokr: Kronecker product of a small "
                            "and a low-rank factor (very small files). dora: LoRA plus a learned magnitude per output "
                            "channel (weight-decomposed; slower). All load with ComfyUI's LoRA loader. full: no adapter, "
                            "the model's own block weights train (full fine-tune; rank and alpha do not apply; save "
                            "it with PipeTrain Save Model; needs much more GPU memory, see docs/full-finetune.md)."}),
                "lokr_factor": ("INT", {"default": -1, "min": -1, "max": 1024, "tooltip":
                                "LoKr only: size of the first Kronecker factor per dimension, where it divides the "
                                "layer's width; -1 picks it automatically (near the square root of the width)."}),
            },
        }

    def configure(self, rank, alpha, dropout, targets, target_regex, start_from, lora_dtype, adapter="lora",
                  lokr_factor=-1):
        init_from = ""
        if start_from != NONE:
            init_from = compat.full_path("loras", start_from) or ""
            if not init_from:
                raise ConfigError(f"start_from: LoRA {start_from!r} is not in ComfyUI's loras folder any more; "
                                  "refresh the page and pick another, or 'none'.")
        spec = LoraSpec(rank=rank, alpha=float(alpha), dropout=float(dropout), targets=targets,
                        target_regex=target_regex.strip(), init_from=init_from, dtype=lora_dtype, kind=adapter,
                        lokr_factor=int(lokr_factor))
        spec.validate()
        if init_from:
            check_start_rank(init_from, start_from, spec.rank)
        return (spec,)


def check_start_rank(path: str, name: str, rank: int) -> None:
    """A LoRA to continue must have the rank set here (read from its header; its down/A weights, LoHa's
    hada_w1_b and LoKr's lokr_w2_b are rank x in). Files whose layout is not recognised, and a kind other than
    the adapter set here, are left to the engine's check."""
    try:
        from safetensors import safe_open

        with safe_open(path, framework="pt", device="cpu") as f:
            ranks = {f.get_slice(k).get_shape()[0] for k in f.keys()
                     if k.endswith((".lora_A.weight", ".lora_down.weight", ".lora.down.weight", ".hada_w1_b",
                                    ".lokr_w2_b"))}
    except Exception:  # noqa: BLE001 - an unreadable file is reported by the engine with its path
        return
    if len(ranks) == 1 and rank not in ranks:
        (found,) = ranks
        raise ConfigError(f"start_from LoRA {name!r} has rank {found} but rank is {rank}: set rank to {found} to "
                          "continue it, or start from 'none'.")
