"""to_diffusion_pipe(): a PipeTrain run.json (+ its dataset settings) -> a diffusion-pipe main TOML and dataset
TOML, with the report of every run.json setting (mapped to which diffusion-pipe key, or not mapped). The
reverse of importer.py: importing the pair again gives back the mapped settings (tests/unit/
test_diffusion_pipe_configs.py checks the round trip)."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ..config.checks import ConfigError
from ..config.run import RunConfig
from ..data.scan import DatasetSpec
from .main_keys import MODEL_TYPES, PIPETRAIN_BETAS, PIPETRAIN_EPS
from .report import Report, Reports
from .toml_text import toml_text

DP_OPTIMIZERS = {"adamw": "adamw", "adamw8bit": "adamw8bit", "adamw8bit_kahan": "AdamW8bitKahan",
                 "adamw_cpu_offload": "offload", "prodigy": "Prodigy", "adafactor": "Adafactor"}
CHECKPOINTING = {"off": False, "on": True, "cpu_offload": "unsloth"}
HEADER = "Written by PipeTrain (python -m engine export-dp) from {run}.\nThe report lists what was not mapped."


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def dataset_of(run: RunConfig, dataset: dict[str, Any] | None) -> DatasetSpec:
    """The dataset settings: given (a DatasetSpec dict or a cache config with "dataset"), else the run's cache
    manifest (which records the dataset it was cached from)."""
    if dataset is None:
        manifest = os.path.join(run.cache_dir, "manifest.json")
        try:
            with open(manifest, encoding="utf-8") as f:
                dataset = json.load(f).get("dataset")
        except (OSError, ValueError, AttributeError):
            dataset = None
        if not isinstance(dataset, dict):
            raise ConfigError(f"no dataset settings: the run's cache_dir {run.cache_dir!r} has no readable "
                              "manifest.json; give the cache config the run was cached with (--cache-config).")
    data = dataset.get("dataset", dataset)
    try:
        return DatasetSpec.from_dict({**data, "folders": [f if isinstance(f, dict) else {"path": f}
                                                          for f in data.get("folders", [])]})
    except Exception as e:  # noqa: BLE001 - DatasetError/TypeError: a message that names the setting
        raise ConfigError(f"the dataset settings are not a PipeTrain dataset: {e}") from None


def to_diffusion_pipe(run_json: dict[str, Any], dataset: dict[str, Any] | None = None, model_type: str = "",
                      dataset_file: str = "dataset.toml") -> tuple[str, str, Reports]:
    """(main TOML text, dataset TOML text, reports). model_type: diffusion-pipe's [model] type; "" = from
    the cache config's clip_type."""
    run = RunConfig.from_dict(run_json)
    spec = dataset_of(run, dataset)
    clip_type = (dataset or {}).get("clip_type", "")
    model_type = model_type or next((t for t, c in MODEL_TYPES.items() if c == clip_type), "")
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"diffusion-pipe needs its [model] type: give one of {', '.join(sorted(MODEL_TYPES))} "
                          "(--model-type)." if not model_type else f"model type {model_type!r} is not one "
                          f"diffusion-pipe knows: use one of {', '.join(sorted(MODEL_TYPES))}.")
    report = Report("run.json")
    builder = _MainToml(run, model_type, dataset_file, dataset or {}, spec.clip_mode)
    main = builder.build()
    _report_settings(run, builder.done, report)
    data_report = Report("dataset")
    data = _dataset(spec, data_report)
    pairs = _batch_sizes(spec, run.train.batch_size)
    if pairs:  # LoadDataset's batch_sizes: diffusion-pipe's per-resolution list, in the main TOML
        main["micro_batch_size_per_gpu"] = pairs
        data_report.mapped("dataset.batch_sizes", "micro_batch_size_per_gpu", "in the main TOML, with "
                           "train.batch_size for every other resolution")
    header = HEADER.format(run=run.run_name)
    return toml_text(main, header), toml_text(data, header), Reports([report, data_report])


class _MainToml:
    """The main TOML's tables, filled from a run; `done` records which diffusion-pipe key took each setting."""

    def __init__(self, run: RunConfig, model_type: str, dataset_file: str, cache: dict[str, Any],
                 clip_mode: str = "single_beginning"):
        self.run, self.cache, self.clip_mode = run, cache, clip_mode
        self.tables: dict[str, dict[str, Any]] = {
            "": {"output_dir": os.path.dirname(run.run_dir), "dataset": dataset_file},
            "model": {"type": model_type}, "adapter": {}, "optimizer": {}}
        self.done: dict[str, tuple[str, str]] = {  # PipeTrain setting -> (diffusion-pipe key, note)
            "run_dir": ("output_dir", "diffusion-pipe makes a dated run folder in it"),
            "run_name": ("output_dir", "the name of PipeTrain's run folder")}

    def put(self, table: str, key: str, value: Any, *settings: str, note: str = "") -> None:
        self.tables[table][key] = value
        for s in settings:
            self.done[s] = (f"{table}.{key}" if table else key, note)

    def build(self) -> dict[str, Any]:
        self.training()
        self.model()
        self.adapter()
        self.optimizer()
        return {**self.tables[""], **{k: v for k, v in self.tables.items() if k}}

    def training(self) -> None:
        t, m, run = self.run.train, self.run.memory, self.run
        if t.steps:
            self.put("", "max_steps", t.steps, "train.steps")
        if t.epochs:
            self.put("", "epochs", int(t.epochs) if t.epochs.is_integer() else t.epochs, "train.epochs")
        else:
            self.put("", "epochs", 1000, "train.epochs", note="0: a high epoch count, so that max_steps ends the run")
        for key, value, setting in (("micro_batch_size_per_gpu", t.batch_size, "train.batch_size"),
                                    ("pipeline_stages", m.pipeline_stages, "memory.pipeline_stages"),
                                    ("gradient_accumulation_steps", t.grad_accum, "train.grad_accum"),
                                    ("gradient_clipping", t.grad_clip, "train.grad_clip"),
                                    ("warmup_steps", t.warmup_steps, "train.warmup_steps"),
                                    ("lr_scheduler", t.scheduler, "train.scheduler"),
                                    ("activation_checkpointing", CHECKPOINTING[m.activation_checkpointing],
                                     "memory.activation_checkpointing"),
                                    ("blocks_to_swap", m.block_swap, "memory.block_swap"),
                                    ("compile", m.compile_blocks, "memory.compile_blocks")):
            self.put("", key, value, setting)
        if t.save_every:
            self.put("", "save_every_n_steps", t.save_every, "train.save_every")
        if m.pipeline_split:
            self.tables[""]["partition_method"] = "manual"
            self.put("", "partition_split", [int(p) for p in m.pipeline_split.split(",")], "memory.pipeline_split",
                     note="check the layer numbers: diffusion-pipe counts its own layer list")
        if run.eval.enabled:
            self.put("", "eval_every_n_steps", run.eval.every, "eval.every",
                     note="add eval_datasets for it to evaluate")
            self.put("", "eval_before_first_step", run.eval.before_start, "eval.before_start")
        self.tables[""]["video_clip_mode"] = self.clip_mode  # LoadDataset's clip_mode

    def model(self) -> None:
        t, o, base = self.run.train, self.run.objective, self.run.memory.base_dtype
        file_key = "checkpoint_path" if self.tables["model"]["type"] == "sdxl" else "transformer_path"
        self.put("model", file_key, self.run.model_path, "model_path", note="diffusion-pipe also needs the model's "
                 "other files (its docs/supported_models.md)")
        if self.cache.get("vae"):
            self.tables["model"]["vae_path"] = self.cache["vae"]
        self.put("model", "dtype", base if base in ("float32", "bfloat16", "float16") else "bfloat16",
                 "memory.base_dtype", note="auto: bfloat16" if base == "auto" else "")
        if base.startswith("float8"):
            self.put("model", "transformer_dtype", "float8" if base == "float8_e4m3fn" else base, "memory.base_dtype")
        self.put("model", "timestep_sample_method", t.timestep_sampling, "train.timestep_sampling")
        for key, value, setting, default in (("shift", t.timestep_shift, "train.timestep_shift", 0.0),
                                             ("min_t", t.min_t, "train.min_t", 0.0),
                                             ("max_t", t.max_t, "train.max_t", 1.0),
                                             ("sigmoid_scale", o.sigmoid_scale, "objective.sigmoid_scale", 1.0),
                                             ("guidance", o.guidance, "objective.guidance", 1.0),
                                             ("flux_shift", o.resolution_shift, "objective.resolution_shift", False),
                                             ("min_snr_gamma", o.min_snr_gamma, "objective.min_snr_gamma", 0.0),
                                             ("debiased_estimation_loss", o.debiased_estimation,
                                              "objective.debiased_estimation", False),
                                             ("cfg", o.cfg_augment, "objective.cfg_augment", 1.0)):
            if value != default:
                self.put("model", key, value, setting)

    def adapter(self) -> None:
        lo = self.run.lora
        kind = getattr(lo, "kind", "lora")
        if kind not in ("lora", "lokr"):
            raise ConfigError(f"lora.kind is {kind!r}: diffusion-pipe trains lora and lokr adapters only; export a "
                              "run of one of those.")
        self.put("adapter", "type", kind, *(["lora.kind"] if hasattr(lo, "kind") else []))
        if kind == "lokr":
            self.put("adapter", "decompose_factor", lo.lokr_factor, "lora.lokr_factor")
        self.put("adapter", "rank", lo.rank, "lora.rank")
        self.put("adapter", "dtype", lo.dtype, "lora.dtype")
        if lo.dropout:
            self.put("adapter", "dropout", lo.dropout, "lora.dropout")
        if lo.init_from:  # diffusion-pipe names a saved epoch's folder; importer.py reads it back the same way
            folder = os.path.basename(lo.init_from) == "adapter_model.safetensors"
            self.put("adapter", "init_from_existing", os.path.dirname(lo.init_from) if folder else lo.init_from,
                     "lora.init_from")
        if lo.alpha in (0, lo.rank):
            self.done["lora.alpha"] = ("adapter.rank", "diffusion-pipe's alpha is always the rank")
        if lo.targets == "all_linear" and not lo.target_regex:
            self.done["lora.targets"] = ("adapter.type", "diffusion-pipe adapts every linear layer of the blocks")

    def optimizer(self) -> None:
        t, m = self.run.train, self.run.memory
        self.put("optimizer", "type", DP_OPTIMIZERS[m.optimizer], "memory.optimizer")
        self.put("optimizer", "lr", t.learning_rate, "train.learning_rate")
        self.put("optimizer", "weight_decay", t.weight_decay, "train.weight_decay")
        if m.optimizer != "adafactor":
            self.tables["optimizer"].update(betas=list(PIPETRAIN_BETAS), eps=PIPETRAIN_EPS)


def _report_settings(run: RunConfig, done: dict[str, tuple[str, str]], report: Report) -> None:
    defaults = _flat(dataclasses.asdict(RunConfig(run_name="x", run_dir="", comfyui_root="", model_path="",
                                                  cache_dir="")))
    for setting, value in _flat(run.to_dict()).items():
        if setting in done:
            report.mapped(setting, *done[setting])
        elif setting in ("comfyui_root", "cache_dir", "more_cache_dirs"):
            report.not_mapped(setting, "diffusion-pipe caches and loads by itself")
        elif defaults.get(setting) != value:  # settings at PipeTrain's default lose nothing: not listed
            report.not_mapped(setting, f"diffusion-pipe has no such setting (the run has {value!r})")


def _dataset(spec: DatasetSpec, report: Report) -> dict[str, Any]:
    data: dict[str, Any] = {"resolutions": list(spec.resolutions)}
    report.mapped("dataset.resolution", "resolutions")
    report.mapped("dataset.extra_resolutions", "resolutions")
    data["enable_ar_bucket"] = bool(spec.aspect_ratios)
    if spec.aspect_ratios:
        data["ar_buckets"] = list(spec.aspect_ratios)
    report.mapped("dataset.aspect_ratios", "ar_buckets")
    data["frame_buckets"] = [1, *spec.clip_lengths]  # diffusion-pipe's 1: images
    report.mapped("dataset.video_frames", "frame_buckets")
    report.mapped("dataset.frame_buckets", "frame_buckets")
    report.mapped("dataset.clip_mode", "video_clip_mode", "in the main TOML")
    if spec.tag_shuffles:
        data["cache_shuffle_num"], data["cache_shuffle_delimiter"] = spec.tag_shuffles, ", "
    report.mapped("dataset.tag_shuffles", "cache_shuffle_num")
    if spec.caption_prefix:
        data["caption_prefix"] = spec.caption_prefix
        report.mapped("dataset.caption_prefix", "caption_prefix")
    data["skip_empty_caption"] = False  # PipeTrain trains images without a caption file on the empty caption
    dirs = []
    for i, f in enumerate(spec.folders):
        entry: dict[str, Any] = {"path": f.path, "num_repeats": f.repeats}
        if spec.mask_folder:
            entry["mask_path"] = spec.mask_folder
        if spec.control_folder:
            entry["control_path"] = spec.control_folder
        dirs.append(entry)
        report.mapped(f"dataset.folders[{i}]", f"directory[{i}]")
    for name, value in (("mask_folder", spec.mask_folder), ("control_folder", spec.control_folder)):
        if value:
            report.mapped(f"dataset.{name}", f"directory[].{name.replace('folder', 'path')}")
    for name, value, default in (("bucket_multiple", spec.bucket_multiple, 64), ("frame_stride", spec.frame_stride, 1),
                                 ("target_fps", spec.target_fps, 0.0), ("caption_lines", spec.caption_lines, False),
                                 ("keep_tokens", spec.keep_tokens, 0), ("caption_dropout", spec.caption_dropout, 0.0),
                                 ("caption_ext", spec.caption_ext, ".txt"), ("follow_links", spec.follow_links, False)):
        if value != default:
            report.not_mapped(f"dataset.{name}", f"diffusion-pipe has no such setting (the dataset has {value!r})")
    for n, part in enumerate(spec.more):  # chained datasets: directories with their own settings
        dirs += _part_directories(spec, part, f"dataset.more[{n}]", report)
    data["directory"] = dirs
    return data


def _part_directories(top: DatasetSpec, part: DatasetSpec, where: str, report: Report) -> list[dict[str, Any]]:
    """A chained dataset's folders as [[directory]] entries that override the top-level settings with its own
    (importing them again makes the same dataset)."""
    own: dict[str, Any] = {"resolutions": list(part.resolutions), "enable_ar_bucket": bool(part.aspect_ratios),
                           "frame_buckets": [1, *part.clip_lengths], "cache_shuffle_num": part.tag_shuffles}
    if part.aspect_ratios:
        own["ar_buckets"] = list(part.aspect_ratios)
    if part.caption_prefix or top.caption_prefix:
        own["caption_prefix"] = part.caption_prefix
    first = len(top.folders)  # the directory numbers follow the first dataset's
    dirs = []
    for f in part.folders:
        entry: dict[str, Any] = {"path": f.path, "num_repeats": f.repeats, **own}
        if part.mask_folder:
            entry["mask_path"] = part.mask_folder
        if part.control_folder:
            entry["control_path"] = part.control_folder
        dirs.append(entry)
    report.mapped(where, f"directory[{first}..]", "its folders, each with the dataset's own bucket and caption "
                  "settings")
    for name, value, default in (("bucket_multiple", part.bucket_multiple, 64), ("frame_stride", part.frame_stride, 1),
                                 ("caption_lines", part.caption_lines, False), ("keep_tokens", part.keep_tokens, 0),
                                 ("caption_dropout", part.caption_dropout, 0.0), ("caption_ext", part.caption_ext, ".txt"),
                                 ("follow_links", part.follow_links, False)):
        if value != default:
            report.not_mapped(f"{where}.{name}", f"diffusion-pipe has no such setting (the dataset has {value!r})")
    return dirs


def _batch_sizes(spec: DatasetSpec, batch_size: int) -> list[list[int]]:
    """Every dataset's batch_sizes as one [[resolution, batch], ...] list ([] when none sets any); resolutions
    without an entry get the run's batch_size, as they train in PipeTrain."""
    if not any(part.batch_sizes for part in spec.parts):
        return []
    pairs: dict[int, int] = {}
    for part in spec.parts:
        for r in part.resolutions:
            pairs.setdefault(r, dict(part.batch_sizes).get(r, batch_size))
    return [[r, b] for r, b in pairs.items()]
