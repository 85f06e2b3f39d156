"""Rules that join settings of several sections of run.json: each written once, here, and called from
every place that needs it (RunConfig.validate, the nodes' checks before launch, the engine at start and
while it builds the run). A rule within one section that the section's validate() applies lives with the
shared checks instead (engine/config/checks.py: check_block_swap, split_points), so that the sections
never import this file. Plain data, no torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .checks import ConfigError, check, gpu_count
from .choices import OPTIMIZER_LR_RANGES

if TYPE_CHECKING:  # annotations only (no import at run time)
    from .launch import LaunchSpec
    from .objective import ObjectiveSpec
    from .sections import LoraSpec, MemorySpec, TrainSpec


def check_optimizer_settings(memory: "MemorySpec", train: "TrainSpec") -> None:
    """The learning rate must suit the optimizer; Prodigy's one step size needs all weights on each rank."""
    low, high = OPTIMIZER_LR_RANGES.get(memory.optimizer, (0.0, float("inf")))
    if not low <= train.learning_rate <= high:
        typical = {"prodigy": "1.0", "adafactor": "1e-2"}.get(memory.optimizer, "1e-4")
        raise ConfigError(f"train.learning_rate {train.learning_rate:g} does not suit memory.optimizer "
                          f"{memory.optimizer!r} (sensible: {low:g} to {high:g}): set learning_rate to about "
                          f"{typical}, or choose another optimizer.")
    check(memory.optimizer != "prodigy" or memory.pipeline_stages == 1,
          "memory.optimizer 'prodigy' estimates one step size from all LoRA weights, but with pipeline_stages "
          f"{memory.pipeline_stages} each stage holds only part of them: set pipeline_stages to 1 or choose "
          "another optimizer.")


def check_objective_settings(objective: "ObjectiveSpec", train: "TrainSpec") -> None:
    """sigmoid_scale shapes logit-normal draws only; the resolution shift computes the shift itself."""
    check(objective.sigmoid_scale == 1.0 or train.timestep_sampling == "logit_normal",
          f"objective.sigmoid_scale is {objective.sigmoid_scale:g} but train.timestep_sampling is "
          f"{train.timestep_sampling!r}, which it does not shape: set timestep_sampling to 'logit_normal', or "
          "sigmoid_scale back to 1.")
    check(not objective.resolution_shift or train.timestep_shift == 0,
          f"objective.resolution_shift computes the shift (mu) of each image from its size, but "
          f"train.timestep_shift is {train.timestep_shift:g}: set timestep_shift to 0, or turn resolution_shift "
          "off to train at that one shift.")


def check_cfg_augment(objective: "ObjectiveSpec", memory: "MemorySpec") -> None:
    """The unconditional pass runs beside the conditional one in one process."""
    check(objective.cfg_augment == 1.0 or memory.pipeline_stages == 1,
          f"objective.cfg_augment is {objective.cfg_augment:g} but memory.pipeline_stages is "
          f"{memory.pipeline_stages}: CFG-augmented training runs with one pipeline stage (use block_swap or "
          "activation checkpointing to fit), or set cfg_augment to 1.")


def check_pipeline_backend(memory: "MemorySpec", launch: "LaunchSpec") -> None:
    """Pipeline stages are DeepSpeed's PipelineEngine: the plain backend has one stage."""
    check(launch.backend == "deepspeed" or memory.pipeline_stages == 1,
          f"memory.pipeline_stages {memory.pipeline_stages} needs DeepSpeed, which is not in use (launch.backend "
          f"'{launch.backend}'): install it (pip install deepspeed, Linux) or set pipeline_stages to 1.")


def check_full_finetune(lora: "LoraSpec", memory: "MemorySpec") -> None:
    """A full fine-tune (lora.kind full) trains the model's own weights: not in fp8, not while block swap moves
    them between CPU and GPU. (Its EMA lives in CPU memory: engine/train/ema.py.)"""
    if lora.kind != "full":
        return
    check(not memory.base_dtype.startswith("float8"),
          f"a full fine-tune cannot train fp8 weights (memory.base_dtype {memory.base_dtype!r}: updates vanish in "
          "fp8's rounding): set base_dtype to auto or bfloat16, or train a LoRA (adapter lora) on the fp8 model.")
    check(memory.block_swap == 0,
          f"a full fine-tune does not work with block swap yet (memory.block_swap {memory.block_swap}: it moves "
          "frozen blocks, the trained ones would lose their optimizer state): set block_swap to 0, and use "
          "activation checkpointing and an 8-bit or CPU-offload optimizer to save memory.")


def data_parallel_size(gpus: int, stages: int, nodes: int = 1) -> int:
    """The data-parallel replicas of a run on `gpus` ranks in all (over `nodes` machines): the GPUs must
    split into `stages` equal pipeline groups, and each group's replicas are gpus / stages."""
    where = gpu_count(nodes, gpus // nodes) if nodes > 1 and gpus % nodes == 0 else f"{gpus} GPUs"
    check(stages >= 1 and gpus % stages == 0,
          f"{where} cannot be split into {stages} pipeline stages: use a total number of GPUs (launch.num_gpus "
          "on every node) divisible by pipeline_stages, or change memory.pipeline_stages (e.g. 2 stages on 2, "
          "4 or 8 GPUs).")
    return gpus // stages


def check_gguf_base(model_path: str, lora: "LoraSpec", memory: "MemorySpec", merged_loras: int) -> None:
    """A GGUF base (engine/models/gguf_base.py) keeps its quantized weights frozen as they are."""
    if not str(model_path).lower().endswith(".gguf"):
        return
    check(lora.kind != "full", f"{model_path} is a GGUF file: its quantized weights cannot be fine-tuned. Train a "
          "LoRA (Configure LoRA's adapter 'lora'), or fine-tune the .safetensors file of the model.")
    check(merged_loras == 0, f"base_loras cannot be merged into the quantized weights of the GGUF file {model_path}: "
          "train on the .safetensors file, or remove the LoRA loaders from Train Pipeline's model.")
    check(not memory.base_dtype.startswith("float8"), f"{model_path} is a GGUF file, already quantized: set memory "
          "base_dtype to auto (or bfloat16) for it.")
