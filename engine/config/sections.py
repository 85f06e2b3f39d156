"""The training sections of run.json: LoRA (`lora`), memory (`memory`), training (`train`) and
samples during training (`sample`), each a frozen dataclass with its own validate(), which reads no file
(RunConfig.check_files checks the files they name). Plain data, no torch; engine/config/run.py builds
them from run.json.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .checks import ConfigError, check, check_block_swap, split_points
from .choices import (
    ADAPTER_KINDS,
    BASE_DTYPES,
    CHECKPOINTING,
    COMPILE_MODES,
    LORA_DTYPES,
    LORA_TARGET_PRESETS,
    MEMORY_PLANS,
    OPTIMIZERS,
    SCHEDULERS,
    TIMESTEP_SAMPLING,
)


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 16
    alpha: float = 0.0  # 0 means "same as rank" (scale 1.0)
    dropout: float = 0.0
    targets: str = "attention"
    target_regex: str = ""
    init_from: str = ""  # absolute path of a LoRA .safetensors to start from, or ""
    dtype: str = "float32"
    kind: str = "lora"  # ADAPTER_KINDS (engine/train/adapter_kinds.py)
    lokr_factor: int = -1  # LoKr: the first factor's size per dimension (peft decompose_factor); -1 = automatic

    @property
    def effective_alpha(self) -> float:
        return float(self.alpha) if self.alpha > 0 else float(self.rank)

    def validate(self) -> None:
        check(1 <= self.rank <= 1024, f"lora.rank is {self.rank}: use a rank between 1 and 1024 (16-64 is typical).")
        check(self.alpha >= 0, f"lora.alpha is {self.alpha}: use 0 (= rank) or a positive number.")
        check(0.0 <= self.dropout < 1.0, f"lora.dropout is {self.dropout}: use a value in [0, 1).")
        check(self.targets in LORA_TARGET_PRESETS,
              f"lora.targets is {self.targets!r}: choose one of {', '.join(LORA_TARGET_PRESETS)}.")
        if self.target_regex:
            try:
                re.compile(self.target_regex)
            except re.error as e:
                raise ConfigError(f"lora.target_regex {self.target_regex!r} is not a valid regular expression ({e}).") from e
        check(self.dtype in LORA_DTYPES, f"lora.dtype is {self.dtype!r}: choose one of {', '.join(LORA_DTYPES)}.")
        self._check_kind()

    def _check_kind(self) -> None:
        check(self.kind in ADAPTER_KINDS, f"lora.kind is {self.kind!r}: choose one of {', '.join(ADAPTER_KINDS)} "
              "(lora is the usual choice).")
        check(self.lokr_factor == -1 or 1 <= self.lokr_factor <= 1024,
              f"lora.lokr_factor is {self.lokr_factor}: use -1 (automatic) or a factor between 1 and 1024.")
        check(self.kind != "full" or not self.init_from,
              "lora.init_from names a LoRA to continue, but kind 'full' trains the model itself: start from 'none' "
              "(to continue a full fine-tune, load its saved model as the base model).")
        # peft's LoHa and LoKr layers have no input dropout (only rank/module dropout, which PipeTrain does not offer).
        check(self.dropout == 0 or self.kind in ("lora", "dora"),
              f"lora.dropout is {self.dropout} but kind {self.kind!r} has no input dropout: set dropout to 0, or "
              "use kind lora or dora.")


@dataclass(frozen=True)
class MemorySpec:
    activation_checkpointing: str = "off"  # off | on | cpu_offload; run.json may still hold true/false
    optimizer: str = "adamw"
    base_dtype: str = "auto"  # auto = what ComfyUI's loader picks for this device; float8_* keep norms etc. high
    pipeline_stages: int = 1
    pipeline_split: str = ""  # "" = the same number of layers per stage; else layer indices where stages 2.. start
    block_swap: int = 0  # transformer blocks kept in CPU RAM and streamed in per use (engine/memory/block_swap.py)
    block_swap_sampling: bool = True  # keep swapping while rendering samples; False = whole model on the GPU then
    compile_blocks: bool = False  # torch.compile each block, attention left eager (engine/memory/compile.py)
    compile_mode: str = "default"  # COMPILE_MODES; cuda_graphs replays each compiled region as a CUDA graph
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the ranks
    plan: str = "manual"  # MEMORY_PLANS; fit: a probe picks checkpointing, block swap, fp8, optimizer (docs/memory.md)
    vram_gib: float = 0.0  # fit's budget per GPU; 0 = the GPU's memory less what other processes use at the start
    vram_margin: float = 0.1  # fit keeps this share of the budget free (allocator fragmentation, varying shapes)

    @staticmethod
    def upgrade_legacy(data: dict) -> dict:
        """run.json from before the checkpointing modes stored a boolean: true -> 'on', false -> 'off'."""
        value = data.get("activation_checkpointing")
        if isinstance(value, bool):
            data = {**data, "activation_checkpointing": "on" if value else "off"}
        return data

    def validate(self) -> None:
        check(self.activation_checkpointing in CHECKPOINTING,
              f"memory.activation_checkpointing is {self.activation_checkpointing!r}: choose one of "
              f"{', '.join(CHECKPOINTING)}.")
        check(0 <= self.block_swap <= 10_000, f"memory.block_swap is {self.block_swap}: use 0 (off) or the number "
              "of transformer blocks to keep in CPU RAM.")
        check_block_swap(self.block_swap, self.pipeline_stages)
        check(self.optimizer in OPTIMIZERS, f"memory.optimizer is {self.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}.")
        check(self.base_dtype in BASE_DTYPES,
              f"memory.base_dtype is {self.base_dtype!r}: choose one of {', '.join(BASE_DTYPES)}.")
        check(1 <= self.pipeline_stages <= 64, f"memory.pipeline_stages is {self.pipeline_stages}: use 1 (data "
              "parallel only) or the number of GPUs to split the model over.")
        split_points(self.pipeline_split, self.pipeline_stages)  # its ConfigError names the setting
        self._check_compile_mode()
        self._check_plan()

    def _check_plan(self) -> None:
        check(self.plan in MEMORY_PLANS, f"memory.plan is {self.plan!r}: choose one of {', '.join(MEMORY_PLANS)}.")
        check(0.0 <= self.vram_gib <= 100_000, f"memory.vram_gib is {self.vram_gib}: use 0 (the GPU's free memory "
              "at the start) or the GiB each GPU may use, e.g. 24.")
        check(0.0 <= self.vram_margin <= 0.5, f"memory.vram_margin is {self.vram_margin}: use a share of the budget "
              "between 0 and 0.5 to keep free (0.1 keeps 10%).")
        if self.plan != "fit":
            return
        check(self.pipeline_stages == 1, f"memory.plan is 'fit' with pipeline_stages {self.pipeline_stages}: the "
              "fit-to-VRAM probe plans one GPU holding the whole model; set pipeline_stages to 1, or plan to "
              "'manual' and choose the memory options yourself.")
        check(self.compile_mode != "cuda_graphs", "memory.plan is 'fit' with compile_mode 'cuda_graphs': the plan "
              "may turn block swap on, which CUDA graphs cannot replay; set compile_mode to 'default'.")

    def _check_compile_mode(self) -> None:
        check(self.compile_mode in COMPILE_MODES,
              f"memory.compile_mode is {self.compile_mode!r}: choose one of {', '.join(COMPILE_MODES)}.")
        if self.compile_mode != "cuda_graphs":
            return
        check(self.compile_blocks, "memory.compile_mode is 'cuda_graphs' but compile_blocks is off: turn "
              "compile_blocks on (CUDA graphs replay the compiled blocks), or set compile_mode to 'default'.")
        # A CUDA graph replays the weights at the addresses it recorded: block swap moves them, and the
        # pipeline's stages were not measured with it.
        check(self.block_swap == 0, "memory.compile_mode 'cuda_graphs' cannot be used with block_swap (the "
              "swapped weights move, a recorded graph would read stale memory): set block_swap to 0 or "
              "compile_mode to 'default'.")
        check(self.pipeline_stages == 1, "memory.compile_mode 'cuda_graphs' needs pipeline_stages 1 (not "
              "measured with pipeline stages): set compile_mode to 'default' for a pipelined run.")


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 100  # optimizer steps; 0 = derive from epochs
    epochs: float = 0.0
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # 0 = off
    scheduler: str = "constant"
    warmup_steps: int = 0
    batch_size: int = 1  # per process, per micro step
    grad_accum: int = 1
    seed: int = 0
    save_every: int = 0  # save a LoRA every N steps (0 = only at the end)
    checkpoint_every: int = 0  # write a resumable checkpoint every N steps (0 = only on cancel/end)
    timestep_sampling: str = "uniform"
    # 0 = the model's own shift (what ComfyUI samples with). SD3-style flow schedules: shift*t / (1 + (shift-1)*t);
    # Flux-style ones (Flux, Flux 2, Chroma, Qwen-Image): the exponent mu, e^mu / (e^mu + 1/t - 1).
    timestep_shift: float = 0.0
    # Noise range trained, in [0, 1] (1 = pure noise; sigma for flow models): Wan 2.2 A14B experts
    # (high noise: min_t 0.875; low noise: max_t 0.875). engine/train/objective.py: noise_range.
    min_t: float = 0.0
    max_t: float = 1.0
    # EMA of the LoRA weights, saved beside each LoRA as <name>_ema.safetensors (engine/train/ema.py):
    # ema = decay * ema + (1 - decay) * weights after each step past ema_start_step; up to it the copy is
    # the weights. 0 = off.
    ema_decay: float = 0.0
    ema_start_step: int = 0

    def validate(self) -> None:
        check(self.steps >= 0, f"train.steps is {self.steps}: use a positive number, or 0 with epochs > 0.")
        check(self.epochs >= 0, f"train.epochs is {self.epochs}: use 0 or a positive number.")
        check(self.steps > 0 or self.epochs > 0, "Both steps and epochs are 0: set steps (e.g. 500) or epochs (e.g. 10).")
        check(self.learning_rate > 0, f"train.learning_rate is {self.learning_rate}: use a positive value like "
              "1e-4 (its range per optimizer: OPTIMIZER_LR_RANGES).")
        check(self.weight_decay >= 0, f"train.weight_decay is {self.weight_decay}: use 0 or a positive number.")
        check(self.grad_clip >= 0, f"train.grad_clip is {self.grad_clip}: use 0 (off) or a positive number like 1.0.")
        check(self.scheduler in SCHEDULERS, f"train.scheduler is {self.scheduler!r}: choose one of {', '.join(SCHEDULERS)}.")
        check(self.warmup_steps >= 0, f"train.warmup_steps is {self.warmup_steps}: use 0 or more.")
        check(self.steps == 0 or self.warmup_steps <= self.steps,
              f"train.warmup_steps {self.warmup_steps} is more than steps {self.steps}: the learning rate would "
              "never reach learning_rate. Use fewer warmup steps (about 5-10% of steps), or more steps.")
        check(self.batch_size >= 1, f"train.batch_size is {self.batch_size}: use 1 or more.")
        check(self.grad_accum >= 1, f"train.grad_accum is {self.grad_accum}: use 1 or more.")
        check(self.save_every >= 0 and self.checkpoint_every >= 0, "save_every and checkpoint_every must be 0 or more.")
        check(self.timestep_shift >= 0, f"train.timestep_shift is {self.timestep_shift}: use 0 (the model's own) "
              "or a positive shift such as 3.0.")
        check(self.timestep_sampling in TIMESTEP_SAMPLING,
              f"train.timestep_sampling is {self.timestep_sampling!r}: choose one of {', '.join(TIMESTEP_SAMPLING)}.")
        check(0.0 <= self.min_t < self.max_t <= 1.0 and self.max_t - self.min_t >= 0.01,
              f"train.min_t/max_t are {self.min_t}/{self.max_t}: use 0 <= min_t < max_t <= 1, at least 0.01 apart "
              "(0/1 trains every noise level; Wan 2.2 A14B high-noise expert: 0.875/1, low-noise: 0/0.875).")
        check(0.0 <= self.ema_decay < 1.0, f"train.ema_decay is {self.ema_decay}: use 0 (no EMA) or a decay below 1 "
              "such as 0.999 (an average over about 1 / (1 - decay) = 1000 steps; 0.99 for runs of a few hundred).")
        check(self.ema_start_step >= 0, f"train.ema_start_step is {self.ema_start_step}: use 0 (the EMA averages from "
              "the first step) or the step from which it averages (up to it the EMA copy equals the weights).")
        check(self.ema_decay > 0 or self.ema_start_step == 0, f"train.ema_start_step is {self.ema_start_step} but "
              "ema_decay is 0 (no EMA), so it would do nothing: set ema_decay (e.g. 0.999) to keep an EMA, or "
              "ema_start_step back to 0.")


@dataclass(frozen=True)
class SampleSpec:
    """Sample images rendered during training with the current LoRA (engine/train/samples.py)."""

    every: int = 0  # render every N optimizer steps (and at the last step); 0 = off
    prompts_file: str = ""  # safetensors of the encoded prompts, written by the node (engine/train/samples.py)
    width: int = 512
    height: int = 512
    steps: int = 20
    cfg: float = 1.0
    seed: int = 0
    sampler: str = "euler"  # a name from comfy.samplers.KSampler.SAMPLERS (checked by the engine)
    scheduler: str = "simple"  # a name from comfy.samplers.KSampler.SCHEDULERS

    def validate(self) -> None:
        check(self.every >= 0, f"sample.every is {self.every}: use 0 (no samples) or a number of steps.")
        if not self.every:
            return
        check(16 <= self.width <= 8192 and 16 <= self.height <= 8192,
              f"sample size {self.width}x{self.height}: use a width and height between 16 and 8192.")
        check(self.width % 8 == 0 and self.height % 8 == 0,
              f"sample size {self.width}x{self.height} is not a multiple of 8 (latents are 1/8 of the image or "
              f"less, the rest would be cut off): use e.g. {self.width // 8 * 8 or 8}x{self.height // 8 * 8 or 8}.")
        check(1 <= self.steps <= 1000, f"sample.steps is {self.steps}: use 1 to 1000 (20 is typical).")
        check(0.0 <= self.cfg <= 100.0, f"sample.cfg is {self.cfg}: use a value in [0, 100] (1 = no guidance).")
        check(self.seed >= 0, f"sample.seed is {self.seed}: use 0 or a positive number.")
