"""What each key of a diffusion-pipe main TOML becomes in PipeTrain (docs/diffusion-pipe-configs.md).

map_main() walks every key of the file: a key is set on the Draft and reported as mapped, reported as not
mapped with the reason, or reported as unknown. Bad values raise ConfigError naming the file and key.
"""
from __future__ import annotations

from typing import Any, Callable

from ..config.choices import SCHEDULERS
from ..data.frame_picks import CLIP_MODES
from .report import Report
from .values import Draft, Where, is_model_file

# diffusion-pipe's [model] type -> CLIPLoader's type for the cache config (a comfy.sd.CLIPType name, lower case).
MODEL_TYPES = {
    "flux": "flux", "ltx-video": "ltxv", "hunyuan-video": "hunyuan_video", "sdxl": "stable_diffusion",
    "cosmos": "cosmos", "lumina_2": "lumina2", "wan": "wan", "chroma": "chroma", "hidream": "hidream",
    "sd3": "sd3", "cosmos_predict2": "cosmos", "anima": "cosmos", "omnigen2": "omnigen2",
    "qwen_image": "qwen_image", "hunyuan_image": "hunyuan_image", "auraflow": "stable_diffusion",
    "z_image": "lumina2", "hunyuan_video_15": "hunyuan_video_15", "flux2": "flux2", "ltx2": "ltxv",
    "ideogram4": "ideogram4", "krea2": "krea2", "minimax_h3": "minimax", "ernie_image": "stable_diffusion",
}
# diffusion-pipe's optimizer type (lower case) -> PipeTrain's memory.optimizer (engine/config/choices.py).
OPTIMIZERS = {"adamw": "adamw", "adamw_optimi": "adamw", "adamw8bit": "adamw8bit",
              "adamw8bitkahan": "adamw8bit_kahan", "offload": "adamw_cpu_offload", "prodigy": "prodigy",
              "adafactor": "adafactor"}
PIPETRAIN_BETAS, PIPETRAIN_EPS = [0.9, 0.999], 1e-8  # what engine/train/optimizers uses for every Adam-type one
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "float8": "float8_e4m3fn",
          "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2"}
CHECKPOINTING = {True: "on", False: "off", "unsloth": "cpu_offload"}

# key -> (PipeTrain setting, kind): the value is checked by its kind and set as it is.
TOP_DIRECT = {
    "epochs": ("train.epochs", "number"), "max_steps": ("train.steps", "whole1"),
    "pipeline_stages": ("memory.pipeline_stages", "whole1"),
    "gradient_accumulation_steps": ("train.grad_accum", "whole1"), "gradient_clipping": ("train.grad_clip", "number"),
    "warmup_steps": ("train.warmup_steps", "whole0"), "blocks_to_swap": ("memory.block_swap", "whole0"),
    "save_every_n_steps": ("train.save_every", "whole0"), "compile": ("memory.compile_blocks", "flag"),
}
STEPS_NOT_EPOCHS = "PipeTrain counts in optimizer steps"
TOP_NOT_MAPPED = {
    "image_micro_batch_size_per_gpu": "PipeTrain has one batch size for images and videos (train.batch_size)",
    "force_constant_lr": "to change the learning rate of a resumed run, set train.learning_rate and accept_changes",
    "pseudo_huber_c": "PipeTrain's losses are mse, huber and smooth_l1 (objective.loss), not pseudo-Huber",
    "eval_every_n_epochs": f"{STEPS_NOT_EPOCHS}: set eval.every to a number of steps (with an eval set)",
    "eval_every_n_examples": f"{STEPS_NOT_EPOCHS}: set eval.every to examples / (batch size x GPUs x grad_accum)",
    "eval_micro_batch_size_per_gpu": "PipeTrain evaluates one item at a time at fixed noise levels",
    "image_eval_micro_batch_size_per_gpu": "PipeTrain evaluates one item at a time at fixed noise levels",
    "eval_gradient_accumulation_steps": "PipeTrain evaluates one item at a time at fixed noise levels",
    "disable_block_swap_for_eval": "PipeTrain's eval uses the training's block swap",
    "save_every_n_epochs": f"{STEPS_NOT_EPOCHS}: set train.save_every to a number of steps (0 = at the end)",
    "save_every_n_examples": f"{STEPS_NOT_EPOCHS}: set train.save_every to examples / (batch size x GPUs x grad_accum)",
    "checkpoint_every_n_epochs": f"{STEPS_NOT_EPOCHS}: set train.checkpoint_every (Cancel always checkpoints)",
    "checkpoint_every_n_minutes": f"{STEPS_NOT_EPOCHS}: set train.checkpoint_every to a number of steps "
                                  "(Cancel and the end always checkpoint)",
    "reentrant_activation_checkpointing": "PipeTrain picks its checkpointing method itself",
    "save_dtype": "PipeTrain saves the LoRA in its training precision (lora.dtype)",
    "caching_batch_size": "the cache encodes one item at a time per process; more GPUs: the cache config's "
                          "processes",
    "map_num_proc": "the cache scan has no worker count; more GPUs: the cache config's processes",
    "steps_per_print": "PipeTrain reports every step (events.jsonl, TensorBoard, the node's chart)",
    "x_axis_examples": "PipeTrain's charts count steps",
    "regenerate_cache": "set regenerate in the cache config (or on CacheLatents)",
    "resume_from_checkpoint": "set resume: true in run.json",
}
MODEL_NOT_MAPPED = ("cache_text_embeddings", "llm_adapter_path", "max_sequence_length", "v_pred",
                    "first_frame_conditioning_p", "bypass_guidance_embedding", "multiscale_loss_weight",
                    "lumina_shift", "image_shift", "merge_adapters")
MONITORING_NOTE = "PipeTrain writes TensorBoard logs in the run folder, not Weights & Biases"


def adapter_kinds() -> tuple[str, ...]:
    """The adapter kinds this PipeTrain trains (lora.kind's choices; only lora where it has no kind setting)."""
    from ..config import choices

    return tuple(getattr(choices, "ADAPTER_KINDS", ("lora",)))


class MainKeys:
    """One import's walk over the main TOML."""

    def __init__(self, cfg: dict[str, Any], where: Where, draft: Draft, report: Report, eval_cache_dir: str = ""):
        self.cfg, self.where, self.draft, self.report, self.eval_cache_dir = cfg, where, draft, report, eval_cache_dir

    # ---- helpers ----------------------------------------------------------------------------
    def value(self, key: str, value: Any, kind: str) -> Any:
        w = self.where
        return {"number": lambda: w.number(key, value), "whole0": lambda: w.whole(key, value, 0),
                "whole1": lambda: w.whole(key, value, 1), "flag": lambda: w.flag(key, value),
                "text": lambda: w.text(key, value)}[kind]()

    def put(self, key: str, target: str, value: Any, note: str = "") -> None:
        self.report.mapped(key, self.draft.set(target, value), note)

    # ---- the walk ---------------------------------------------------------------------------
    def run(self) -> None:
        tables: dict[str, Callable[[str, Any], None]] = {
            "model": self.model_key, "adapter": self.adapter_key, "optimizer": self.optimizer_key,
            "monitoring": lambda k, v: self.report.not_mapped(k, MONITORING_NOTE)}
        self.require_tables()
        for key, value in self.cfg.items():
            if key in tables and isinstance(value, dict):
                for sub, v in value.items():
                    tables[key](f"{key}.{sub}", v)
            elif key in TOP_DIRECT:
                target, kind = TOP_DIRECT[key]
                self.put(key, target, self.value(key, value, kind))
            elif key in TOP_NOT_MAPPED:
                self.report.not_mapped(key, TOP_NOT_MAPPED[key])
            elif hasattr(self, f"top_{key}"):
                getattr(self, f"top_{key}")(key, value)
            else:
                self.report.unknown(key)

    def require_tables(self) -> None:
        for table in ("model", "adapter", "optimizer"):
            if not isinstance(self.cfg.get(table), dict):
                fix = {"model": "add a [model] table with type = '...' and the model's file",
                       "adapter": "PipeTrain trains LoRAs (no full fine-tune): add [adapter] with type = 'lora' "
                                  "and rank = 32",
                       "optimizer": "add [optimizer] with type = 'adamw_optimi' and lr = 2e-5"}[table]
                raise self.where.fail(f"[{table}]", f"is missing: {fix}.")

    # ---- top-level keys that need more than a type check --------------------------------------
    def top_micro_batch_size_per_gpu(self, key: str, value: Any) -> None:
        """One number, or diffusion-pipe's per-resolution list [[512, 4], [1024, 1]] (a resolution as a side or a
        [width, height] pair): LoadDataset's batch_sizes, set on each dataset for the resolutions it has."""
        if not isinstance(value, list):
            self.put(key, "train.batch_size", self.value(key, value, "whole1"))
            return
        from .dataset_keys import side_of

        pairs = []
        for i, pair in enumerate(value):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise self.where.fail(f"{key}[{i}]", f"is {pair!r}: give [resolution, batch size] pairs, e.g. "
                                      "[[512, 4], [1024, 1]].")
            pairs.append([side_of(self.where, f"{key}[{i}]", pair[0]), self.where.whole(f"{key}[{i}]", pair[1], 1)])
        self.draft.batch_sizes = pairs
        self.draft.set("train.batch_size", min(b for _, b in pairs))
        self.report.mapped(key, "cache.dataset.batch_sizes", "per resolution (LoadDataset's batch_sizes), on every "
                           "dataset that has the resolution; train.batch_size = the smallest, for any other")

    def top_output_dir(self, key: str, value: Any) -> None:
        self.draft.output_dir = self.where.path_of(key, value)
        self.report.mapped(key, "run_dir", "run_dir = output_dir/<run name>: PipeTrain trains in one folder per "
                           "run and resumes from it, no dated subfolders")

    def top_dataset(self, key: str, value: Any) -> None:
        self.draft.dataset_toml = self.where.path_of(key, value)
        self.report.mapped(key, "cache.dataset", "read as the dataset TOML unless one is given (relative paths "
                           "against the main TOML's folder)")

    def top_eval_datasets(self, key: str, value: Any) -> None:
        if self.eval_cache_dir:
            self.put(key, "eval.cache_dir", self.eval_cache_dir, "PipeTrain has one eval set: the cache given "
                     "with --eval-cache-dir")
        else:
            self.report.not_mapped(key, "cache the eval dataset with `python -m engine cache` and import with "
                                   "--eval-cache-dir <its cache folder> (one eval set)")

    def top_eval_every_n_steps(self, key: str, value: Any) -> None:
        self.eval_setting(key, "eval.every", self.value(key, value, "whole0"))

    def top_eval_before_first_step(self, key: str, value: Any) -> None:
        self.eval_setting(key, "eval.before_start", self.value(key, value, "flag"))

    def eval_setting(self, key: str, target: str, value: Any) -> None:
        if self.eval_cache_dir and "eval_datasets" in self.cfg:
            self.put(key, target, value)
        else:
            self.report.not_mapped(key, "no eval set: give eval_datasets and --eval-cache-dir")

    def top_activation_checkpointing(self, key: str, value: Any) -> None:
        if isinstance(value, str) and value in CHECKPOINTING or isinstance(value, bool):
            note = "unsloth keeps the checkpointed block inputs in CPU RAM, as cpu_offload does"
            self.put(key, "memory.activation_checkpointing", CHECKPOINTING[value], note if value == "unsloth" else "")
        else:
            raise self.where.fail(key, f"is {value!r}: use true, false or 'unsloth'.")

    def top_lr_scheduler(self, key: str, value: Any) -> None:
        name = self.value(key, value, "text")
        if name not in SCHEDULERS:
            raise self.where.fail(key, f"is {name!r}: use one of {', '.join(SCHEDULERS)}.")
        self.put(key, "train.scheduler", name)

    def top_partition_method(self, key: str, value: Any) -> None:
        if value == "manual":
            self.report.mapped(key, "memory.pipeline_split", "with partition_split")
        else:
            self.report.not_mapped(key, "PipeTrain gives each stage the same number of layers (UNets: balanced by "
                                   "parameters); set memory.pipeline_split to choose the split")

    def top_partition_split(self, key: str, value: Any) -> None:
        values = value if isinstance(value, list) else [value]
        points = [self.where.whole(f"{key}[{i}]", v, 1) for i, v in enumerate(values)]
        self.put(key, "memory.pipeline_split", ",".join(str(p) for p in points),
                 "check the layer numbers: PipeTrain's layer 0 is the embedding (docs/pipeline.md)")

    def top_video_clip_mode(self, key: str, value: Any) -> None:
        mode = self.where.text(key, value)
        if mode not in CLIP_MODES:
            raise self.where.fail(key, f"is {mode!r}: use one of {', '.join(CLIP_MODES)}.")
        self.put(key, "cache.dataset.clip_mode", mode)

    # ---- [model] ---------------------------------------------------------------------------
    def model_key(self, key: str, value: Any) -> None:
        name = key.split(".", 1)[1]
        w = self.where
        if name == "type":
            kind = w.text(key, value)
            if kind not in MODEL_TYPES:
                raise w.fail(key, f"is {kind!r}, a model type this importer does not know: use one of "
                             f"{', '.join(sorted(MODEL_TYPES))}.")
            self.put(key, "cache.clip_type", MODEL_TYPES[kind], "PipeTrain finds the architecture from the model "
                     "file, as ComfyUI does; this picks the text encoder type")
        elif name in ("transformer_path", "ckpt_path", "checkpoint_path", "diffusers_path", "single_file_path"):
            path = w.path_of(key, value)
            if is_model_file(path) and name != "diffusers_path":
                if self.draft.get("model_path"):
                    self.report.not_mapped(key, f"model_path is already {self.draft.get('model_path')}")
                else:
                    self.put(key, "model_path", path, "loaded with ComfyUI's loader")
                    if name == "checkpoint_path":  # a full checkpoint also holds the VAE and text encoder
                        self.draft.set("cache.checkpoint", path)
            else:
                self.report.not_mapped(key, "a model folder: point PipeTrain at a single-file ComfyUI checkpoint "
                                       "or diffusion model (.safetensors), e.g. with --model")
        elif name == "vae_path":
            self.file_or_folder(key, value, "cache.vae")
        elif name in ("clip_path", "llm_path", "text_encoder_path"):
            path = w.path_of(key, value)
            if is_model_file(path):
                self.draft.cache.setdefault("clip", []).append(path)
                self.report.mapped(key, "cache.clip", "a text encoder file for the cache")
            else:
                self.report.not_mapped(key, "a Hugging Face folder: give the cache config the ComfyUI text encoder "
                                       "file(s) (clip)")
        elif name in ("dtype", "transformer_dtype", "diffusion_model_dtype"):
            self.dtype_key(key, name, value)
        elif name == "timestep_sample_method":
            if value not in ("logit_normal", "uniform"):
                raise w.fail(key, f"is {value!r}: use 'logit_normal' or 'uniform'.")
            self.put(key, "train.timestep_sampling", value)
        elif name in ("sigmoid_scale", "guidance", "min_snr_gamma"):
            self.put(key, f"objective.{name}", w.number(key, value))
        elif name in ("shift", "min_t", "max_t"):
            self.put(key, {"shift": "train.timestep_shift"}.get(name, f"train.{name}"), w.number(key, value))
        elif name == "flux_shift":
            self.put(key, "objective.resolution_shift", w.flag(key, value))
        elif name == "cfg":  # MiniMax H3's CFG-augmented training
            self.put(key, "objective.cfg_augment", w.number(key, value))
        elif name == "debiased_estimation_loss":
            self.put(key, "objective.debiased_estimation", w.flag(key, value))
        elif name in MODEL_NOT_MAPPED:
            self.report.not_mapped(key, "a model option PipeTrain does not have")
        else:
            self.report.unknown(key)

    def file_or_folder(self, key: str, value: Any, target: str) -> None:
        path = self.where.path_of(key, value)
        if is_model_file(path):
            self.put(key, target, path)
        else:
            self.report.not_mapped(key, "not a single .safetensors file: give the ComfyUI file instead")

    def dtype_key(self, key: str, name: str, value: Any) -> None:
        if value not in DTYPES:
            raise self.where.fail(key, f"is {value!r}: use one of {', '.join(DTYPES)}.")
        if name == "dtype" and any(k in self.cfg["model"] for k in ("transformer_dtype", "diffusion_model_dtype")):
            self.report.not_mapped(key, "PipeTrain computes in the precision ComfyUI picks for the device; the "
                                   "stored weights follow transformer_dtype")
        else:
            self.put(key, "memory.base_dtype", DTYPES[value])

    # ---- [adapter] -------------------------------------------------------------------------
    def adapter_key(self, key: str, value: Any) -> None:
        name = key.split(".", 1)[1]
        w = self.where
        if name == "type":
            kinds = [k for k in adapter_kinds() if k in ("lora", "lokr")]  # the two diffusion-pipe has
            if value not in kinds:
                raise w.fail(key, f"is {value!r}: PipeTrain trains {' or '.join(kinds)} adapters from diffusion-pipe "
                             "configs; set type = 'lora'.")
            if value != "lora":
                self.draft.set("lora.kind", value)
            self.put(key, "lora.targets", "all_linear", f"{value}: every linear layer of the blocks, as "
                     "diffusion-pipe; alpha = rank (lora.alpha 0), as diffusion-pipe forces")
            self.draft.set("lora.alpha", 0.0)
        elif name == "decompose_factor" and self.cfg["adapter"].get("type") == "lokr":
            self.put(key, "lora.lokr_factor", -1 if value == -1 else w.whole(key, value, 1))
        elif name == "rank":
            self.put(key, "lora.rank", w.whole(key, value, 1))
        elif name == "dtype":
            if value not in ("float32", "bfloat16"):
                raise w.fail(key, f"is {value!r}: PipeTrain trains LoRA weights in float32 or bfloat16.")
            self.put(key, "lora.dtype", value)
        elif name == "dropout":
            self.put(key, "lora.dropout", w.number(key, value))
        elif name == "init_from_existing":
            path = w.path_of(key, value)
            path = path if is_model_file(path) else f"{path.rstrip('/')}/adapter_model.safetensors"
            self.put(key, "lora.init_from", path, "a folder means its adapter_model.safetensors")
        elif name in ("alpha", "fuse_adapters", "decompose_factor", "rank_dropout"):
            self.report.not_mapped(key, "an adapter option PipeTrain's LoRA does not have (alpha: lora.alpha)")
        else:
            self.report.unknown(key)

    # ---- [optimizer] -----------------------------------------------------------------------
    def optimizer_key(self, key: str, value: Any) -> None:
        name = key.split(".", 1)[1]
        w = self.where
        if name == "type":
            kind = w.text(key, value)
            if kind.lower() in OPTIMIZERS:
                note = "optimi's AdamW adds Kahan summation for bfloat16 weights; PipeTrain's adamw8bit_kahan has " \
                       "it" if kind.lower() == "adamw_optimi" else ""
                self.put(key, "memory.optimizer", OPTIMIZERS[kind.lower()], note)
            else:
                self.report.not_mapped(key, f"PipeTrain has no {kind}: it trains with adamw; choose one of "
                                       "memory.optimizer's choices (docs/optimizers.md)")
        elif name == "lr":
            self.put(key, "train.learning_rate", w.number(key, value))
        elif name == "weight_decay":
            self.put(key, "train.weight_decay", w.number(key, value))
        elif name == "betas" and value == PIPETRAIN_BETAS or name == "eps" and value == PIPETRAIN_EPS:
            self.report.mapped(key, "memory.optimizer", "PipeTrain's own value")
        elif name in ("betas", "eps"):
            self.report.not_mapped(key, f"PipeTrain's optimizers use betas {PIPETRAIN_BETAS} and eps "
                                   f"{PIPETRAIN_EPS:g}, not {value!r}")
        else:
            self.report.not_mapped(key, "an optimizer argument PipeTrain does not take (it sets lr and weight_decay)")
