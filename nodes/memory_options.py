"""PipeTrainMemoryOptions: how training trades speed for memory. Defaults give a working run."""
from __future__ import annotations

from ..engine.config.choices import BASE_DTYPES, CHECKPOINTING, COMPILE_MODES, MEMORY_PLANS, OPTIMIZER_NOTES, OPTIMIZERS
from ..engine.config.sections import MemorySpec
from .types import MEMORY

_LEGACY_CHECKPOINTING = {True: "on", False: "off"}  # the input was a BOOLEAN in saved workflows


def _optimizer_tooltip() -> str:
    notes = OPTIMIZER_NOTES
    lines = [f"{name}: {notes[name]}" for name in OPTIMIZERS if name in notes]
    return "Optimizer for the LoRA weights." + ("\n" + "\n".join(lines) if lines else
                                                " AdamW keeps two fp32 values per LoRA weight, small next to the base model.")


class PipeTrainMemoryOptions:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("Memory and speed options for training. The defaults work for small models; for a 14B video "
                   "model on a 24 GB card combine checkpointing, block swap and an fp8 base (docs/memory.md).")
    RETURN_TYPES = (MEMORY,)
    RETURN_NAMES = ("memory",)
    FUNCTION = "configure"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "activation_checkpointing": (list(CHECKPOINTING), {"default": "off", "tooltip":
                    "Per-block activation checkpointing. off: fastest, keeps every activation (most memory). "
                    "on: keeps only each block's input and recomputes the block in backward: far less memory for "
                    "large images/videos, about 30% slower. cpu_offload: like on, and those block inputs wait in "
                    "CPU RAM (copied in the background): saves a further block input per block (GBs for long "
                    "videos) for a few % more time."}),
                "optimizer": (list(OPTIMIZERS), {"default": "adamw", "tooltip": _optimizer_tooltip()}),
                "base_dtype": (list(BASE_DTYPES), {"default": "auto", "tooltip":
                    "Precision of the frozen base model. auto: what ComfyUI picks on this device. bfloat16/float16 "
                    "halve a float32 model. float8_e4m3fn / float8_e5m2 halve it again: the block linears' weights "
                    "are stored in fp8 and cast per layer (a little slower, slightly less precise); norms, biases, "
                    "embeddings and heads stay in the compute precision. A ComfyUI fp8_scaled file trains as it is "
                    "whatever this says. Use with activation checkpointing, or the cast copies are kept until "
                    "backward."}),
                "pipeline_stages": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip":
                    "Split the model across this many GPUs (pipeline parallelism; needs DeepSpeed). "
                    "1 = every GPU holds the whole model and trains on its own batches. More stages "
                    "fit bigger models; the GPU count must be divisible by it. Needs the family's "
                    "pipeline adapter (Wan, Flux, Qwen-Image, HiDream, ...: the list is on the help page)."}),
            },
            # Saved UI workflows store widget values by position: add new inputs at the end only.
            "optional": {
                "block_swap": ("INT", {"default": 0, "min": 0, "max": 1000, "tooltip":
                    "Keep the frozen weights of this many transformer blocks (the last ones) in pinned CPU RAM and "
                    "stream each to the GPU just before it runs, forward and backward. Saves one block's weights "
                    "per block swapped (Wan 14B bf16: ~0.7 GB each); costs CPU RAM and PCIe traffic, mostly hidden "
                    "behind compute when blocks are large (expect 0-30% slower; more if the GPU waits for PCIe). "
                    "LoRA weights stay on the GPU. Needs pipeline_stages 1; at most the model's block count."}),
                "compile_blocks": ("BOOLEAN", {"default": False, "tooltip":
                    "torch.compile each transformer block (attention stays eager): ~1.3x faster steps on "
                    "large models after a first step that compiles for tens of seconds to minutes; memory about "
                    "the same. Needs a working compiler toolchain (Triton on GPU)."}),
                "expandable_segments": ("BOOLEAN", {"default": False, "tooltip":
                    "Start the training processes with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: less "
                    "memory lost to fragmentation (can be the difference between fitting and out-of-memory with "
                    "varying image sizes or block swap); no speed cost in most runs."}),
                "pipeline_split": ("STRING", {"default": "", "tooltip":
                    "Where pipeline stages start, as layer indices separated by commas (pipeline_stages - 1 of "
                    "them, increasing). Layer 0 is the embedding, 1..N the transformer blocks, N+1 the head; "
                    "e.g. '21' puts the embedding and blocks 0-19 on GPU 1 of 2. Empty: the same number of "
                    "layers per stage (SDXL/SD UNets: balanced by parameter count). Use it when the first or last GPU runs out of memory (docs/pipeline.md)."}),
                "block_swap_sampling": ("BOOLEAN", {"default": True, "tooltip":
                    "With block_swap: keep swapping blocks while sample images are rendered during training "
                    "(on, the default: the memory stays as in training). Off: every block is on the GPU while "
                    "sampling, so samples render faster, but the GPU must hold the whole model then."}),
                "compile_mode": (list(COMPILE_MODES), {"default": "default", "tooltip":
                    "With compile_blocks: 'default' compiles each block; 'cuda_graphs' also replays the compiled "
                    "parts of each block as CUDA graphs, so the CPU launches far fewer kernels (Flux-dev LoRA on an "
                    "H200: docs/benchmarks.md). Costs some GPU memory per image size; needs block_swap 0 and "
                    "pipeline_stages 1. No effect on a CPU."}),
                "plan": (list(MEMORY_PLANS), {"default": "manual", "tooltip":
                    "manual: train with the settings above. fit: before step 1 a short probe runs real forward + "
                    "backward passes on the dataset's largest bucket on each GPU, then picks activation "
                    "checkpointing, block swap, an fp8 base (only when base_dtype is auto/bfloat16/float16) and "
                    "8-bit AdamW (only instead of adamw) so the run fits vram_gib with the margin, fastest first. "
                    "The plan and its predicted peak and s/step show on Train Pipeline; when nothing fits the run "
                    "stops before step 1 and says what to change. Needs pipeline_stages 1 (docs/memory.md)."}),
                "vram_gib": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100000.0, "step": 0.5, "tooltip":
                    "With plan fit: the GPU memory each training process may use, in GiB (e.g. 24 to plan for a "
                    "24 GB card on a larger one). 0 = the GPU's whole memory less what other processes hold "
                    "when training starts."}),
                "vram_margin": ("FLOAT", {"default": 0.1, "min": 0.0, "max": 0.5, "step": 0.01, "tooltip":
                    "With plan fit: the share of vram_gib kept free for what the probe cannot see (allocator "
                    "fragmentation, sample rendering, other bucket shapes); 0.1 plans for 90% of the budget."}),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, activation_checkpointing):
        # Workflows saved while this input was a BOOLEAN hold true/false: still accepted.
        if activation_checkpointing in CHECKPOINTING or activation_checkpointing in _LEGACY_CHECKPOINTING:
            return True
        return (f"activation_checkpointing is {activation_checkpointing!r}: choose one of "
                f"{', '.join(CHECKPOINTING)}.")

    def configure(self, activation_checkpointing, optimizer, base_dtype, pipeline_stages, block_swap=0,
                  compile_blocks=False, expandable_segments=False, pipeline_split="", block_swap_sampling=True,
                  compile_mode="default", plan="manual", vram_gib=0.0, vram_margin=0.1):
        mode = _LEGACY_CHECKPOINTING.get(activation_checkpointing, activation_checkpointing) \
            if isinstance(activation_checkpointing, bool) else activation_checkpointing
        spec = MemorySpec(activation_checkpointing=mode, optimizer=optimizer, base_dtype=base_dtype,
                          pipeline_stages=int(pipeline_stages), block_swap=int(block_swap),
                          block_swap_sampling=bool(block_swap_sampling),
                          compile_blocks=bool(compile_blocks), compile_mode=str(compile_mode),
                          expandable_segments=bool(expandable_segments),
                          pipeline_split=str(pipeline_split or "").strip(), plan=str(plan),
                          vram_gib=float(vram_gib), vram_margin=float(vram_margin))
        spec.validate()
        return (spec,)
