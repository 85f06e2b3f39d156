"""RunConfig: the one contract between the ComfyUI nodes and the training engine.

The node writes it as `<run_dir>/run.json`; the engine reads it back. Both sides validate it
with `RunConfig.from_dict`, so a bad value is reported before any rank starts, with a message
that names the setting and says what to change. Everything here is plain data (no torch).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_VERSION = 1

LORA_TARGET_PRESETS = ("attention", "attention_mlp", "all_linear")
LORA_DTYPES = ("float32", "bfloat16")
BASE_DTYPES = ("auto", "float32", "bfloat16", "float16")
OPTIMIZERS = ("adamw",)
SCHEDULERS = ("constant", "linear", "cosine")
TIMESTEP_SAMPLING = ("uniform", "logit_normal")
BACKENDS = ("deepspeed", "plain")  # plain = one PyTorch process, no DeepSpeed (engine/plain_trainer.py)
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class ConfigError(ValueError):
    """A setting the user can fix. The message names the setting and the fix."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 16
    alpha: float = 0.0  # 0 means "same as rank" (scale 1.0)
    dropout: float = 0.0
    targets: str = "attention"
    target_regex: str = ""
    init_from: str = ""  # absolute path of a LoRA .safetensors to start from, or ""
    dtype: str = "float32"

    @property
    def effective_alpha(self) -> float:
        return float(self.alpha) if self.alpha > 0 else float(self.rank)

    def validate(self) -> None:
        _check(1 <= self.rank <= 1024, f"lora.rank is {self.rank}: use a rank between 1 and 1024 (16-64 is typical).")
        _check(self.alpha >= 0, f"lora.alpha is {self.alpha}: use 0 (= rank) or a positive number.")
        _check(0.0 <= self.dropout < 1.0, f"lora.dropout is {self.dropout}: use a value in [0, 1).")
        _check(self.targets in LORA_TARGET_PRESETS,
               f"lora.targets is {self.targets!r}: choose one of {', '.join(LORA_TARGET_PRESETS)}.")
        if self.target_regex:
            try:
                re.compile(self.target_regex)
            except re.error as e:
                raise ConfigError(f"lora.target_regex {self.target_regex!r} is not a valid regular expression ({e}).") from e
        _check(self.dtype in LORA_DTYPES, f"lora.dtype is {self.dtype!r}: choose one of {', '.join(LORA_DTYPES)}.")
        if self.init_from:
            _check(os.path.isfile(self.init_from),
                   f"lora.init_from: the LoRA file {self.init_from} does not exist; pick another file or 'none'.")


@dataclass(frozen=True)
class MemorySpec:
    activation_checkpointing: bool = False
    optimizer: str = "adamw"
    base_dtype: str = "auto"  # auto = what ComfyUI's loader picks for this device
    pipeline_stages: int = 1

    def validate(self) -> None:
        _check(self.optimizer in OPTIMIZERS, f"memory.optimizer is {self.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}.")
        _check(self.base_dtype in BASE_DTYPES,
               f"memory.base_dtype is {self.base_dtype!r}: choose one of {', '.join(BASE_DTYPES)}.")
        _check(1 <= self.pipeline_stages <= 64, f"memory.pipeline_stages is {self.pipeline_stages}: use 1 (data "
               "parallel only) or the number of GPUs to split the model over.")


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
    timestep_shift: float = 0.0  # 0 = the model's own shift (what ComfyUI samples with)

    def validate(self) -> None:
        _check(self.steps >= 0, f"train.steps is {self.steps}: use a positive number, or 0 with epochs > 0.")
        _check(self.epochs >= 0, f"train.epochs is {self.epochs}: use 0 or a positive number.")
        _check(self.steps > 0 or self.epochs > 0, "Both steps and epochs are 0: set steps (e.g. 500) or epochs (e.g. 10).")
        _check(0 < self.learning_rate < 1, f"train.learning_rate is {self.learning_rate}: use a value like 1e-4.")
        _check(self.weight_decay >= 0, f"train.weight_decay is {self.weight_decay}: use 0 or a positive number.")
        _check(self.grad_clip >= 0, f"train.grad_clip is {self.grad_clip}: use 0 (off) or a positive number like 1.0.")
        _check(self.scheduler in SCHEDULERS, f"train.scheduler is {self.scheduler!r}: choose one of {', '.join(SCHEDULERS)}.")
        _check(self.warmup_steps >= 0, f"train.warmup_steps is {self.warmup_steps}: use 0 or more.")
        _check(self.batch_size >= 1, f"train.batch_size is {self.batch_size}: use 1 or more.")
        _check(self.grad_accum >= 1, f"train.grad_accum is {self.grad_accum}: use 1 or more.")
        _check(self.save_every >= 0 and self.checkpoint_every >= 0, "save_every and checkpoint_every must be 0 or more.")
        _check(self.timestep_shift >= 0, f"train.timestep_shift is {self.timestep_shift}: use 0 (the model's own) "
               "or a positive shift such as 3.0.")
        _check(self.timestep_sampling in TIMESTEP_SAMPLING,
               f"train.timestep_sampling is {self.timestep_sampling!r}: choose one of {', '.join(TIMESTEP_SAMPLING)}.")


@dataclass(frozen=True)
class LaunchSpec:
    num_gpus: int = 1  # processes; on a machine without CUDA these are CPU processes
    gpu_ids: str = ""  # e.g. "0,1"; "" = the first num_gpus visible devices
    backend: str = "deepspeed"

    def validate(self) -> None:
        _check(1 <= self.num_gpus <= 1024, f"launch.num_gpus is {self.num_gpus}: use 1 or more.")
        _check(self.backend in BACKENDS, f"launch.backend is {self.backend!r}: choose one of {', '.join(BACKENDS)}.")
        _check(self.backend == "deepspeed" or self.num_gpus == 1,
               f"{self.num_gpus} GPUs need DeepSpeed, which is not in use (backend '{self.backend}'): "
               "install it (pip install deepspeed, Linux) or train on 1 GPU.")
        if self.gpu_ids:
            _check(re.fullmatch(r"\d+(,\d+)*", self.gpu_ids) is not None,
                   f"gpu_ids {self.gpu_ids!r} is not a comma-separated list of GPU numbers like '0,1'.")
            n = len(self.gpu_ids.split(","))
            _check(n == self.num_gpus, f"gpu_ids lists {n} GPUs but num_gpus is {self.num_gpus}: make them agree.")

    def device_ids(self) -> list[int]:
        return [int(i) for i in self.gpu_ids.split(",")] if self.gpu_ids else list(range(self.num_gpus))


@dataclass(frozen=True)
class RunConfig:
    run_name: str
    run_dir: str
    comfyui_root: str
    model_path: str
    cache_dir: str
    lora: LoraSpec = field(default_factory=LoraSpec)
    memory: MemorySpec = field(default_factory=MemorySpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    launch: LaunchSpec = field(default_factory=LaunchSpec)
    resume: bool = False  # continue from the newest checkpoint in run_dir/checkpoints
    version: int = CONFIG_VERSION

    def validate(self) -> None:
        _check(self.version == CONFIG_VERSION,
               f"run.json has version {self.version}, this PipeTrain reads version {CONFIG_VERSION}: "
               "re-create the run from the TrainPipeline node.")
        _check(bool(RUN_NAME_RE.match(self.run_name)),
               f"run_name {self.run_name!r}: use letters, digits, '_', '-' or '.', starting with a letter or digit.")
        _check(os.path.isfile(self.model_path), f"model file {self.model_path} does not exist: pick a file ComfyUI lists.")
        _check(os.path.isfile(os.path.join(self.comfyui_root, "comfy", "sd.py")),
               f"comfyui_root {self.comfyui_root} is not a ComfyUI folder (no comfy/sd.py).")
        _check(os.path.isfile(os.path.join(self.cache_dir, "manifest.json")),
               f"cache {self.cache_dir} is incomplete (no manifest.json): run CacheLatents again.")
        for part in (self.lora, self.memory, self.train, self.launch):
            part.validate()
        _check(self.launch.num_gpus % self.memory.pipeline_stages == 0,
               f"{self.launch.num_gpus} GPUs cannot be split into {self.memory.pipeline_stages} pipeline stages: use "
               "a number of GPUs divisible by pipeline_stages (e.g. 2 stages on 2, 4 or 8 GPUs).")
        _check(self.launch.backend == "deepspeed" or self.memory.pipeline_stages == 1,
               "pipeline_stages > 1 needs DeepSpeed: install it (pip install deepspeed, Linux) or set "
               "pipeline_stages to 1.")

    # ---- (de)serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        cfg = _build(cls, data, "run")
        cfg.validate()
        return cfg

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunConfig":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read run config {path}: {e}") from e
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike) -> None:
        write_text_atomic(Path(path), json.dumps(self.to_dict(), indent=2, sort_keys=True))


def _build(cls, data: Any, where: str):
    """Build a frozen dataclass from a dict, rejecting unknown keys and wrong types."""
    _check(isinstance(data, dict), f"{where} must be a JSON object, got {type(data).__name__}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    _check(not unknown, f"unknown setting(s) in {where}: {', '.join(unknown)}. Remove them or check the spelling.")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            _check(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
                   f"{where}.{name} is missing from run.json.")
            continue
        value = data[name]
        ftype = f.type if isinstance(f.type, str) else f.type.__name__
        sub = _SECTIONS.get(ftype)
        if sub is not None:
            value = _build(sub, value, f"{where}.{name}")
        elif ftype == "float":
            _check(isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}.{name} must be a number.")
            value = float(value)
        elif ftype == "int":
            _check(isinstance(value, int) and not isinstance(value, bool), f"{where}.{name} must be a whole number.")
        elif ftype == "bool":
            _check(isinstance(value, bool), f"{where}.{name} must be true or false.")
        elif ftype == "str":
            _check(isinstance(value, str), f"{where}.{name} must be a string.")
        kwargs[name] = value
    return cls(**kwargs)


_SECTIONS = {"LoraSpec": LoraSpec, "MemorySpec": MemorySpec, "TrainSpec": TrainSpec, "LaunchSpec": LaunchSpec}


def write_text_atomic(path: Path, text: str) -> None:
    """Write a file so readers see the old or the new content, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
