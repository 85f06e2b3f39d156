"""PipeTrainMemoryOptions: how training trades speed for memory. Defaults give a working run."""
from __future__ import annotations

from ..engine.config import BASE_DTYPES, OPTIMIZERS, MemorySpec
from .types import MEMORY


class PipeTrainMemoryOptions:
    CATEGORY = "PipeTrain"
    DESCRIPTION = "Memory and speed options for training. The defaults work for small models."
    RETURN_TYPES = (MEMORY,)
    RETURN_NAMES = ("memory",)
    FUNCTION = "configure"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "activation_checkpointing": ("BOOLEAN", {"default": False, "tooltip":
                                             "Recompute each block's activations during backward instead of keeping "
                                             "them: much less memory for large images/videos, about 30% slower."}),
                "optimizer": (list(OPTIMIZERS), {"default": "adamw", "tooltip":
                              "Optimizer for the LoRA weights. AdamW keeps two fp32 values per LoRA weight, small "
                              "next to the base model."}),
                "base_dtype": (list(BASE_DTYPES), {"default": "auto", "tooltip":
                               "Precision of the frozen base model. 'auto' uses what ComfyUI would pick on this "
                               "device; bfloat16 halves the memory of a float32 model."}),
                "pipeline_stages": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip":
                                    "Split the model across this many GPUs (pipeline parallelism; needs DeepSpeed). "
                                    "1 = every GPU holds the whole model and trains on its own batches. More stages "
                                    "fit bigger models; the GPU count must be divisible by it. Families with a "
                                    "pipeline adapter: Wan (text-to-video), Flux.1 (text-to-image)."}),
            }
        }

    def configure(self, activation_checkpointing, optimizer, base_dtype, pipeline_stages):
        spec = MemorySpec(activation_checkpointing=bool(activation_checkpointing), optimizer=optimizer,
                          base_dtype=base_dtype, pipeline_stages=int(pipeline_stages))
        spec.validate()
        return (spec,)
