"""PipeTrainImportDiffusionPipeConfig: a diffusion-pipe main TOML + dataset TOML as PipeTrain node outputs
(engine/dpconfig does the mapping; this node only reads paths and hands the results on)."""
from __future__ import annotations

import os

from ..engine.config.checks import ConfigError
from ..engine.config.run import RunConfig
from ..engine.data.scan import DatasetSpec
from ..engine.dpconfig.importer import from_diffusion_pipe
from .types import DATASET, LORA, MEMORY, OBJECTIVE

# The TrainPipeline inputs this node also gives (connect them to TrainPipeline's inputs of the same name).
TRAIN_OUTPUTS = (("steps", "INT"), ("epochs", "FLOAT"), ("learning_rate", "FLOAT"), ("warmup_steps", "INT"),
                 ("batch_size", "INT"), ("grad_accum", "INT"), ("save_every", "INT"))
# TrainPipeline widgets the report names, for the user to set by hand (their dropdowns take no connection).
BY_HAND = ("scheduler", "timestep_sampling", "timestep_shift")


class PipeTrainImportDiffusionPipeConfig:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("Read a diffusion-pipe training config (main TOML + dataset TOML) and give its settings as "
                   "PipeTrain inputs, with a report of every key: mapped, or not mapped and why.")
    RETURN_TYPES = (DATASET, LORA, MEMORY, OBJECTIVE) + tuple(t for _, t in TRAIN_OUTPUTS) + ("STRING",)
    RETURN_NAMES = ("dataset", "lora", "memory", "objective") + tuple(n for n, _ in TRAIN_OUTPUTS) + ("report",)
    OUTPUT_TOOLTIPS = ("The dataset folders and buckets, for CacheLatents.", "The LoRA settings, for TrainPipeline.",
                       "The memory settings, for TrainPipeline.", "The loss settings, for TrainPipeline.") + tuple(
        f"TrainPipeline's {n}." for n, _ in TRAIN_OUTPUTS) + ("Every key of both files: mapped or not mapped.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "main_toml": ("STRING", {"default": "", "tooltip":
                          "Path of the diffusion-pipe main config (.toml: output_dir, epochs, [model], [adapter], "
                          "[optimizer] ...). Relative paths inside it are read against its folder."}),
            "dataset_toml": ("STRING", {"default": "", "tooltip":
                             "Path of its dataset config (.toml: resolutions, buckets, [[directory]]). Empty: the "
                             "file the main config's `dataset` key names."}),
        }}

    def load(self, main_toml: str, dataset_toml: str = ""):
        main, data = main_toml.strip(), dataset_toml.strip()
        if not main:
            raise ConfigError("main_toml is empty: give the path of the diffusion-pipe main config (.toml).")
        settings, reports = from_diffusion_pipe(os.path.expanduser(main), os.path.expanduser(data) if data else None)
        run = RunConfig.from_dict(settings["run"])
        dataset = DatasetSpec.from_dict(settings["cache"]["dataset"])
        t = run.train
        hand = ", ".join(f"{n} = {getattr(t, n)!r}" for n in BY_HAND)
        text = reports.text() + f"\n\n[TrainPipeline]\n- set by hand: {hand}; model: {run.model_path or 'pick it'}"
        return (dataset, run.lora, run.memory, run.objective) + tuple(
            getattr(t, n) for n, _ in TRAIN_OUTPUTS) + (text,)
