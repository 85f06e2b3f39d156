"""PipeTrainSaveModel: put a full fine-tune's model into models/diffusion_models/pipetrain/ and load it."""
from __future__ import annotations

import os
from pathlib import Path

from ..engine import model_files
from ..engine.atomic_files import write_safetensors
from ..engine.config.checks import ConfigError
from ..engine.version import __version__
from . import compat
from .save_lora import safe_lora_target
from .types import RUN


PLAIN, EMA = "plain", "ema"


def source_model(run, weights: str = PLAIN) -> Path:
    """The run's newest diffusion-model file (model_final, else the newest model_step), or the EMA model beside
    it, refused with the fix."""
    source = model_files.newest_model(run.run_dir)
    if source is None:
        raise ConfigError(f"run {run.run_name!r} wrote no model file (no {model_files.FOLDER}/ folder in "
                          f"{run.run_dir}): it trained a LoRA, so save it with PipeTrain Save LoRA, or train with "
                          "Configure LoRA's adapter 'full' to fine-tune the whole model.")
    if weights == EMA:
        averaged = model_files.newest_model(run.run_dir, ema=True)
        if averaged is None:
            raise ConfigError(f"run {run.run_name!r} kept no EMA weights (no {source.stem}_ema.safetensors beside "
                              f"{source.name}): set weights to 'plain', or train with Train Options' ema_decay "
                              "above 0 (e.g. 0.999).")
        return averaged
    if weights != PLAIN:
        raise ConfigError(f"weights is {weights!r}: choose {PLAIN} or {EMA}.")
    return source


class PipeTrainSaveModel:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("Copy a full fine-tune's trained diffusion model to models/diffusion_models/pipetrain/<name>"
                   ".safetensors (listed by Load Diffusion Model) in bf16 or fp8, and output it loaded as a MODEL "
                   "for a test sampler.")
    RETURN_TYPES = ("MODEL", "STRING")
    RETURN_NAMES = ("model", "model_name")
    FUNCTION = "save"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "run": (RUN, {"tooltip": "The finished run from PipeTrain Train Pipeline, trained with Configure "
                              "LoRA's adapter 'full'."}),
                "name": ("STRING", {"default": "my_model", "tooltip":
                         "File name under models/diffusion_models/pipetrain/ ('.safetensors' is added)."}),
                "overwrite": ("BOOLEAN", {"default": False, "tooltip":
                              "Replace an existing model file of that name. Off: an existing file is an error, "
                              "never silently replaced."}),
                "dtype": (list(model_files.SAVE_DTYPES), {"default": "bfloat16", "tooltip":
                          "bfloat16: the trained weights as the run saved them. float8_e4m3fn: the linear and "
                          "conv weight matrices in fp8 (half the size; ComfyUI computes in a higher precision), "
                          "norms, biases and embeddings stay bfloat16."}),
            },
            "optional": {  # saved UI workflows store widget values by position: add new inputs at the end only
                "weights": ([PLAIN, EMA], {"default": PLAIN, "tooltip":
                            "Which weights to save: plain = the model as trained at the last step; ema = the "
                            "exponential moving average of its trained weights (needs Train Options' ema_decay "
                            "above 0), often smoother."}),
            },
        }

    def save(self, run, name, overwrite, dtype="bfloat16", weights=PLAIN):
        from safetensors import safe_open
        from safetensors.torch import load_file


        source = source_model(run, weights)
        root = compat.first_folder("diffusion_models")
        target = safe_lora_target(root, name, what="model", folder="diffusion_models")
        if target.exists() and not overwrite:  # checked before reading a file of many gigabytes
            raise ConfigError(f"{target} already exists: choose another name, or turn on overwrite to replace it.")
        with safe_open(str(source), framework="pt") as f:
            metadata = dict(f.metadata() or {})
        metadata.update({"pipetrain_version": __version__, "pipetrain_steps": str(run.steps),
                         "pipetrain_run": run.run_name, "pipetrain_base_model": run.model_name,
                         "pipetrain_dtype": dtype, "pipetrain_weights": weights})
        tensors = model_files.in_save_dtype(load_file(str(source)), dtype)
        write_safetensors(target, tensors, metadata)  # temp file, then rename
        del tensors
        model_name = os.path.relpath(target, Path(root).resolve())
        return {"ui": {"text": [f"saved {model_name} ({dtype})"]},
                "result": (compat.load_diffusion_model(str(target)), model_name)}
