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

from .eval_spec import EvalSpec

CONFIG_VERSION = 1

LORA_TARGET_PRESETS = ("attention", "attention_mlp", "all_linear")
LORA_DTYPES = ("float32", "bfloat16")
BASE_DTYPES = ("auto", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
CHECKPOINTING = ("off", "on", "cpu_offload")  # activation checkpointing modes (engine/checkpointing.py)
OPTIMIZERS = ("adamw", "adamw8bit", "adamw8bit_kahan", "adafactor", "prodigy", "adamw_cpu_offload")
# What each optimizer costs and saves, one sentence each (the MemoryOptions tooltip; docs/optimizers.md).
OPTIMIZER_NOTES = {
    "adamw": "AdamW with float32 state: 8 bytes of optimizer state per LoRA weight; the reference.",
    "adamw8bit": "bitsandbytes AdamW8bit: moments stored in 8 bits, ~2 bytes per weight (a quarter of adamw) "
                 "at about the same speed and quality.",
    "adamw8bit_kahan": "8-bit AdamW (~2 bytes per weight) plus Kahan-compensated updates, so a bfloat16 LoRA "
                       "(lora dtype) keeps its small updates for 2 more bytes per weight; on float32 weights it "
                       "is plain 8-bit AdamW.",
    "adafactor": "torch Adafactor: factored second moment, well under 1 byte per weight; learning_rate is a "
                 "relative step (1e-2 typical), training starts slower from a zero-initialised LoRA.",
    "prodigy": "Prodigy (pytorch-optimizer): finds the step size itself, set learning_rate to 1.0; 16 bytes per "
               "weight (twice adamw) and a little slower per step; pipeline_stages must be 1.",
    "adamw_cpu_offload": "AdamW with float32 master weights and state in CPU RAM (12 bytes per weight there, none "
                         "on the GPU); the step runs on the CPU, slower per step for large LoRAs.",
}
# Learning rates that make sense per optimizer (inclusive). Outside them training does nothing
# visible or diverges, so the config is refused before launch with the range in the message.
OPTIMIZER_LR_RANGES = {
    "adamw": (1e-7, 0.05),
    "adamw8bit": (1e-7, 0.05),
    "adamw8bit_kahan": (1e-7, 0.05),
    "adafactor": (1e-3, 1.0),
    "prodigy": (0.1, 10.0),
    "adamw_cpu_offload": (1e-7, 0.05),
}
SCHEDULERS = ("constant", "linear", "cosine")
TIMESTEP_SAMPLING = ("uniform", "logit_normal")
BACKENDS = ("deepspeed", "plain")  # plain = one PyTorch process, no DeepSpeed (engine/plain_trainer.py)
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class ConfigError(ValueError):
    """A setting the user can fix. The message names the setting and the fix."""


def check_optimizer_settings(memory: "MemorySpec", train: "TrainSpec") -> None:
    """The learning rate must suit the optimizer; Prodigy's one step size needs all weights on each rank."""
    low, high = OPTIMIZER_LR_RANGES.get(memory.optimizer, (0.0, float("inf")))
    if not low <= train.learning_rate <= high:
        typical = {"prodigy": "1.0", "adafactor": "1e-2"}.get(memory.optimizer, "1e-4")
        raise ConfigError(f"train.learning_rate {train.learning_rate:g} does not suit memory.optimizer "
                          f"{memory.optimizer!r} (sensible: {low:g} to {high:g}): set learning_rate to about "
                          f"{typical}, or choose another optimizer.")
    _check(memory.optimizer != "prodigy" or memory.pipeline_stages == 1,
           "memory.optimizer 'prodigy' estimates one step size from all LoRA weights, but with pipeline_stages "
           f"{memory.pipeline_stages} each stage holds only part of them: set pipeline_stages to 1 or choose "
           "another optimizer.")


def split_points(text: str, stages: int) -> list[int]:
    """memory.pipeline_split ("8,20") as layer indices; [] when empty. The upper bound (the layer
    count) is checked where the model is known (engine/pipeline.py)."""
    if not text.strip():
        return []
    fix = (f"give {stages - 1} increasing layer indices separated by commas (where stages 2..{stages} start), "
           "or leave it empty to give every stage the same number of layers.")
    try:
        points = [int(p) for p in text.split(",")]
    except ValueError:
        raise ConfigError(f"memory.pipeline_split {text!r} is not a list of whole numbers: {fix}") from None
    _check(stages > 1, f"memory.pipeline_split is {text!r} but pipeline_stages is 1: raise pipeline_stages or "
           "leave pipeline_split empty.")
    _check(len(points) == stages - 1, f"memory.pipeline_split {text!r} has {len(points)} split points; "
           f"{stages} pipeline stages need {stages - 1}: {fix}")
    _check(points[0] >= 1 and all(a < b for a, b in zip(points, points[1:])),
           f"memory.pipeline_split {text!r} must be strictly increasing and start at 1 or more (layer 0, the "
           f"embedding, always opens stage 1): {fix}")
    return points


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
    activation_checkpointing: str = "off"  # off | on | cpu_offload; run.json may still hold true/false
    optimizer: str = "adamw"
    base_dtype: str = "auto"  # auto = what ComfyUI's loader picks for this device; float8_* keep norms etc. high
    pipeline_stages: int = 1
    pipeline_split: str = ""  # "" = the same number of layers per stage; else layer indices where stages 2.. start
    block_swap: int = 0  # transformer blocks kept in CPU RAM and streamed in per use (engine/block_swap.py)
    block_swap_sampling: bool = True  # keep swapping while rendering samples; False = whole model on the GPU then
    compile_blocks: bool = False  # torch.compile each block, attention left eager (engine/compile_blocks.py)
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the ranks

    @staticmethod
    def upgrade_legacy(data: dict) -> dict:
        """run.json from before the checkpointing modes stored a boolean: true -> 'on', false -> 'off'."""
        value = data.get("activation_checkpointing")
        if isinstance(value, bool):
            data = {**data, "activation_checkpointing": "on" if value else "off"}
        return data

    def validate(self) -> None:
        _check(self.activation_checkpointing in CHECKPOINTING,
               f"memory.activation_checkpointing is {self.activation_checkpointing!r}: choose one of "
               f"{', '.join(CHECKPOINTING)}.")
        _check(0 <= self.block_swap <= 10_000, f"memory.block_swap is {self.block_swap}: use 0 (off) or the number "
               "of transformer blocks to keep in CPU RAM.")
        _check(self.block_swap == 0 or self.pipeline_stages == 1,
               f"memory.block_swap is {self.block_swap} with pipeline_stages {self.pipeline_stages}: block swap "
               "needs pipeline_stages 1 (each GPU holds the whole model); set block_swap to 0 or pipeline_stages "
               "to 1.")
        _check(self.optimizer in OPTIMIZERS, f"memory.optimizer is {self.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}.")
        _check(self.base_dtype in BASE_DTYPES,
               f"memory.base_dtype is {self.base_dtype!r}: choose one of {', '.join(BASE_DTYPES)}.")
        _check(1 <= self.pipeline_stages <= 64, f"memory.pipeline_stages is {self.pipeline_stages}: use 1 (data "
               "parallel only) or the number of GPUs to split the model over.")
        split_points(self.pipeline_split, self.pipeline_stages)  # its ConfigError names the setting


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
    # Noise range trained, in [0, 1] (1 = pure noise; sigma for flow models): Wan 2.2 A14B experts
    # (high noise: min_t 0.875; low noise: max_t 0.875). engine/objective.py: noise_range.
    min_t: float = 0.0
    max_t: float = 1.0

    def validate(self) -> None:
        _check(self.steps >= 0, f"train.steps is {self.steps}: use a positive number, or 0 with epochs > 0.")
        _check(self.epochs >= 0, f"train.epochs is {self.epochs}: use 0 or a positive number.")
        _check(self.steps > 0 or self.epochs > 0, "Both steps and epochs are 0: set steps (e.g. 500) or epochs (e.g. 10).")
        _check(self.learning_rate > 0, f"train.learning_rate is {self.learning_rate}: use a positive value like "
               "1e-4 (its range per optimizer: OPTIMIZER_LR_RANGES).")
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
        _check(0.0 <= self.min_t < self.max_t <= 1.0 and self.max_t - self.min_t >= 0.01,
               f"train.min_t/max_t are {self.min_t}/{self.max_t}: use 0 <= min_t < max_t <= 1, at least 0.01 apart "
               "(0/1 trains every noise level; Wan 2.2 A14B high-noise expert: 0.875/1, low-noise: 0/0.875).")


HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:%-]{0,252}$")  # a host name, IPv4 or IPv6 address


@dataclass(frozen=True)
class ClusterSpec:
    """Several machines, launched by DeepSpeed's own launcher (engine/cluster.py). Defaults = one machine.

    Two ways DeepSpeed users know: a hostfile (`host slots=N` lines) that DeepSpeed reaches over
    ssh (pdsh) from one node, or one launcher per node (`no_ssh`, SLURM-style) given its node_rank
    and node 0's address. run.json is the same on every node; a node's own rank and the master's
    address can also be given on the command line (`python -m engine.launcher run.json --node_rank 1`).
    """

    hostfile: str = ""  # path of a DeepSpeed hostfile; "" = none
    num_nodes: int = 0  # machines; 0 = every host of the hostfile (1 without a hostfile)
    node_rank: int = 0  # this machine's index with no_ssh (0 = the master); the command line overrides it
    master_addr: str = ""  # node 0's address as every node reaches it (or --master_addr); ssh mode: "" = ask via ssh
    master_port: int = 0  # 0 = 29500 on several machines, a free port on one
    no_ssh: bool = False  # start one launcher per node (SLURM-style) instead of DeepSpeed's ssh fan-out
    timeout_s: int = 1800  # how long a rank waits for the others (joining, any collective) before it fails

    @property
    def multi_node(self) -> bool:
        return bool(self.hostfile) or self.num_nodes > 1

    def validate(self) -> None:
        _check(0 <= self.num_nodes <= 4096, f"cluster.num_nodes is {self.num_nodes}: use 0 (from the hostfile) "
               "or the number of machines.")
        _check(self.node_rank >= 0, f"cluster.node_rank is {self.node_rank}: use 0 for the master node, 1, 2, ... "
               "for the others.")
        _check(0 <= self.master_port <= 65535, f"cluster.master_port is {self.master_port}: use a TCP port such as "
               "29500 (or 0 for the default).")
        _check(1 <= self.timeout_s <= 7 * 86400, f"cluster.timeout_s is {self.timeout_s}: use a number of seconds "
               "such as 1800 (how long ranks wait for each other before failing).")
        if self.master_addr:
            _check(HOST_RE.match(self.master_addr) is not None, f"cluster.master_addr {self.master_addr!r} is not a "
                   "host name or IP address: use node 0's address, e.g. 10.0.0.1.")
        if not self.multi_node:
            _check(self.node_rank == 0, f"cluster.node_rank is {self.node_rank} but the run has one node: set "
                   "cluster.num_nodes or cluster.hostfile, or use node_rank 0.")
            return
        if self.num_nodes and not self.hostfile:
            _check(self.no_ssh, f"cluster.num_nodes is {self.num_nodes} without a hostfile: DeepSpeed needs the "
                   "host names to reach the nodes over ssh. Give a hostfile, or set no_ssh and start "
                   "`python -m engine.launcher run.json --node_rank N` on every node.")
            _check(self.node_rank < self.num_nodes, f"cluster.node_rank is {self.node_rank} but num_nodes is "
                   f"{self.num_nodes}: node ranks go from 0 to {self.num_nodes - 1}.")


@dataclass(frozen=True)
class LaunchSpec:
    num_gpus: int = 1  # processes per node; on a machine without CUDA these are CPU processes
    gpu_ids: str = ""  # e.g. "0,1"; "" = the first num_gpus visible devices (on every node)
    backend: str = "deepspeed"
    cluster: ClusterSpec = field(default_factory=ClusterSpec)

    def nodes(self) -> int:
        """Machines in the run; 0 = not known before the hostfile is read (engine/cluster.py)."""
        c = self.cluster
        return c.num_nodes or (0 if c.hostfile else 1)

    def validate(self) -> None:
        _check(1 <= self.num_gpus <= 1024, f"launch.num_gpus is {self.num_gpus}: use 1 or more.")
        _check(self.backend in BACKENDS, f"launch.backend is {self.backend!r}: choose one of {', '.join(BACKENDS)}.")
        _check(self.backend == "deepspeed" or self.num_gpus == 1,
               f"{self.num_gpus} GPUs need DeepSpeed, which is not in use (backend '{self.backend}'): "
               "install it (pip install deepspeed, Linux) or train on 1 GPU.")
        self.cluster.validate()
        _check(self.backend == "deepspeed" or not self.cluster.multi_node,
               f"several nodes need DeepSpeed, which is not in use (backend '{self.backend}'): install it "
               "(pip install deepspeed, Linux) or train on one machine.")
        if self.gpu_ids:
            _check(re.fullmatch(r"\d+(,\d+)*", self.gpu_ids) is not None,
                   f"gpu_ids {self.gpu_ids!r} is not a comma-separated list of GPU numbers like '0,1'.")
            n = len(self.gpu_ids.split(","))
            _check(n == self.num_gpus, f"gpu_ids lists {n} GPUs but num_gpus is {self.num_gpus}: make them agree.")

    def device_ids(self) -> list[int]:
        return [int(i) for i in self.gpu_ids.split(",")] if self.gpu_ids else list(range(self.num_gpus))


@dataclass(frozen=True)
class SampleSpec:
    """Sample images rendered during training with the current LoRA (engine/sampling.py)."""

    every: int = 0  # render every N optimizer steps (and at the last step); 0 = off
    prompts_file: str = ""  # safetensors of the encoded prompts, written by the node (engine/sampling.py)
    width: int = 512
    height: int = 512
    steps: int = 20
    cfg: float = 1.0
    seed: int = 0
    sampler: str = "euler"  # a name from comfy.samplers.KSampler.SAMPLERS (checked by the engine)
    scheduler: str = "simple"  # a name from comfy.samplers.KSampler.SCHEDULERS

    def validate(self) -> None:
        _check(self.every >= 0, f"sample.every is {self.every}: use 0 (no samples) or a number of steps.")
        if not self.every:
            return
        _check(os.path.isfile(self.prompts_file), f"sample.prompts_file {self.prompts_file!r} does not exist: "
               "re-queue TrainPipeline with sample prompts (it writes the file), or set sample.every to 0.")
        _check(16 <= self.width <= 8192 and 16 <= self.height <= 8192,
               f"sample size {self.width}x{self.height}: use a width and height between 16 and 8192.")
        _check(1 <= self.steps <= 1000, f"sample.steps is {self.steps}: use 1 to 1000 (20 is typical).")
        _check(0.0 <= self.cfg <= 100.0, f"sample.cfg is {self.cfg}: use a value in [0, 100] (1 = no guidance).")
        _check(self.seed >= 0, f"sample.seed is {self.seed}: use 0 or a positive number.")


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
    eval: EvalSpec = field(default_factory=EvalSpec)  # held-out eval set (engine/eval_spec.py)
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
        for part in (self.lora, self.memory, self.train, self.launch, self.sample, self.eval):
            part.validate()
        check_optimizer_settings(self.memory, self.train)
        nodes = self.launch.nodes()  # with a hostfile, engine/cluster.py checks this once it is read
        _check(not nodes or (nodes * self.launch.num_gpus) % self.memory.pipeline_stages == 0,
               f"{gpu_count(nodes, self.launch.num_gpus)} cannot be split into {self.memory.pipeline_stages} pipeline "
               "stages: use a number of GPUs (over all nodes) divisible by pipeline_stages (e.g. 2 stages on 2, 4 "
               "or 8 GPUs).")
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


_SECTIONS = {"LoraSpec": LoraSpec, "MemorySpec": MemorySpec, "TrainSpec": TrainSpec, "LaunchSpec": LaunchSpec,
             "ClusterSpec": ClusterSpec,
             "SampleSpec": SampleSpec, "EvalSpec": EvalSpec}


def gpu_count(nodes: int, per_node: int) -> str:
    """'4 GPUs', or '4 GPUs (2 nodes x 2)' for several nodes: how validation messages count."""
    total = f"{nodes * per_node} GPUs"
    return total if nodes <= 1 else f"{total} ({nodes} nodes x {per_node})"


def write_text_atomic(path: Path, text: str) -> None:
    """Write a file so readers see the old or the new content, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
