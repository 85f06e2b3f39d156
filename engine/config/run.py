"""RunConfig: the one contract between the ComfyUI nodes and the training engine.

The node writes it as `<run_dir>/run.json`; the engine reads it back. `validate()` is pure (it reads
no file) and runs once where a config is built (the node, and `RunConfig.from_dict` / `load` on each
rank); `check_files()` checks that the files it names exist, at each boundary: the node before launch,
the headless launcher, every rank at start. A bad value is reported before any rank starts, with a
message that names the setting and says what to change. Everything here is plain data (no torch).

The sections live in files named for them (engine/config/sections.py: lora, memory, train, sample;
engine/config/launch.py: launch and its cluster; engine/config/eval.py: eval; engine/config/monitor.py:
monitor, W&B), the allowed values in engine/config/choices.py, the shared checks in
engine/config/checks.py and the rules across sections in engine/config/rules.py; the loss's settings
in engine/config/objective.py. Each name is imported from the file that defines it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic_files import write_text
from .base_loras import BaseLora
from .checks import ConfigError, check_more_caches, check_run_name
from .checks import check as _check
from .eval import EvalSpec
from .launch import ClusterSpec, LaunchSpec
from .monitor import MonitorSpec
from .objective import ObjectiveSpec
from .revisions import keep_run_settings
from .rules import (
    check_cfg_augment,
    check_full_finetune,
    check_gguf_base,
    check_objective_settings,
    check_optimizer_settings,
    check_pipeline_backend,
    data_parallel_size,
)
from .sections import LoraSpec, MemorySpec, SampleSpec, TrainSpec

CONFIG_VERSION = 1


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
    sample: SampleSpec = field(default_factory=SampleSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)  # held-out eval set (engine/config/eval.py)
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)  # the loss (engine/config/objective.py)
    monitor: MonitorSpec = field(default_factory=MonitorSpec)  # W&B (engine/config/monitor.py); off by default
    # the caches of the datasets chained to the first (LoadDataset's add_to), read with cache_dir as one
    # sample stream (engine/cache/joined.py); () = one dataset
    more_cache_dirs: tuple[str, ...] = ()
    base_loras: tuple[BaseLora, ...] = ()  # LoRAs merged into the base before training (engine/config/base_loras.py)
    resume: bool = False  # continue from the newest checkpoint in run_dir/checkpoints
    accept_changes: bool = False  # resume even with settings that change the result (engine/config/revisions.py)
    version: int = CONFIG_VERSION

    def validate(self) -> None:
        """Every setting and every rule across sections; pure (no file is read: check_files does that)."""
        _check(self.version == CONFIG_VERSION,
               f"run.json has version {self.version}, this PipeTrain reads version {CONFIG_VERSION}: "
               "re-create the run from the TrainPipeline node.")
        check_run_name(self.run_name)
        check_more_caches(self.cache_dir, self.more_cache_dirs)
        for part in (self.lora, self.memory, self.train, self.launch, self.sample, self.eval, self.objective,
                     self.monitor, *self.base_loras):
            part.validate()
        check_optimizer_settings(self.memory, self.train)
        check_objective_settings(self.objective, self.train)
        check_cfg_augment(self.objective, self.memory)
        check_pipeline_backend(self.memory, self.launch)
        check_full_finetune(self.lora, self.memory)
        check_gguf_base(self.model_path, self.lora, self.memory, len(self.base_loras))
        nodes = self.launch.nodes()  # with a hostfile, engine/launch/cluster.py checks this once it is read
        if nodes:
            data_parallel_size(nodes * self.launch.num_gpus, self.memory.pipeline_stages, nodes)

    def check_files(self) -> None:
        """The files and folders the run reads exist (validate() reads none): the node checks them before
        launch, each rank at start."""
        _check(os.path.isfile(self.model_path), f"model file {self.model_path} does not exist: pick a file ComfyUI lists.")
        _check(os.path.isfile(os.path.join(self.comfyui_root, "comfy", "sd.py")),
               f"comfyui_root {self.comfyui_root} is not a ComfyUI folder (no comfy/sd.py).")
        _check(os.path.isfile(os.path.join(self.cache_dir, "manifest.json")),
               f"cache {self.cache_dir} is incomplete (no manifest.json): run CacheLatents again.")
        for folder in self.more_cache_dirs:
            _check(os.path.isfile(os.path.join(folder, "manifest.json")),
                   f"more_cache_dirs: the cache {folder} is incomplete (no manifest.json): run CacheLatents again "
                   "(it caches every chained dataset).")
        _check(not self.lora.init_from or os.path.isfile(self.lora.init_from),
               f"lora.init_from: the LoRA file {self.lora.init_from} does not exist; pick another file or 'none'.")
        _check(not self.sample.every or os.path.isfile(self.sample.prompts_file),
               f"sample.prompts_file {self.sample.prompts_file!r} does not exist: re-queue TrainPipeline with sample "
               "prompts (it writes the file), or set sample.every to 0.")
        for lora in self.base_loras:
            lora.check_file()
        _check(not self.eval.cache_dir or os.path.isfile(os.path.join(self.eval.cache_dir, "manifest.json")),
               f"eval.cache_dir {self.eval.cache_dir} is incomplete (no manifest.json): run the eval set's Cache "
               "Latents again, or disconnect eval_cache.")

    # ---- (de)serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        """Build and validate (pure); run.json files of older versions load as well (upgrade_legacy)."""
        cfg = _build(cls, data, "run")
        cfg.validate()
        return cfg

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunConfig":
        """run.json; a resumed one that leaves out objective settings keeps the run's (revisions.keep_run_settings)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read run config {path}: {e}") from e
        return cls.from_dict(keep_run_settings(data) if isinstance(data, dict) else data)

    def save(self, path: str | os.PathLike) -> None:
        write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True))


def _build(cls, data: Any, where: str):
    """Build a frozen dataclass from a dict, rejecting unknown keys and wrong types."""
    _check(isinstance(data, dict), f"{where} must be a JSON object, got {type(data).__name__}.")
    data = getattr(cls, "upgrade_legacy", lambda d: d)(data)  # older run.json spellings of a setting
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
        listed = _SECTIONS.get(ftype[len("tuple["):].split(",")[0]) if ftype.startswith("tuple[") else None
        if sub is not None:
            value = _build(sub, value, f"{where}.{name}")
        elif ftype == "tuple[str, ...]":  # a list of strings, e.g. more_cache_dirs
            _check(isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value),
                   f"{where}.{name} must be a list of strings.")
            value = tuple(value)
        elif listed is not None:  # a list of sections, e.g. base_loras
            _check(isinstance(value, (list, tuple)), f"{where}.{name} must be a list.")
            value = tuple(_build(listed, item, f"{where}.{name}[{i}]") for i, item in enumerate(value))
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


_SECTIONS = {"LoraSpec": LoraSpec, "MemorySpec": MemorySpec, "TrainSpec": TrainSpec, "LaunchSpec": LaunchSpec,
             "ClusterSpec": ClusterSpec,
             "SampleSpec": SampleSpec, "EvalSpec": EvalSpec, "ObjectiveSpec": ObjectiveSpec, "MonitorSpec": MonitorSpec,
             "BaseLora": BaseLora}


