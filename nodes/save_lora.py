"""PipeTrainSaveLoRA: put a run's LoRA into models/loras/pipetrain/ and optionally apply it."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath

from ..engine import best_step
from ..engine.atomic_files import write_bytes
from ..engine.config.checks import ConfigError, invisible_characters, portable_name_problem
from ..engine.lora_files import ema_file
from ..engine.version import __version__
from . import compat
from .types import RUN

SUBFOLDER = "pipetrain"
PLAIN, EMA, BEST = "plain", "ema", "best"
WEIGHTS = (PLAIN, EMA, BEST)  # which of a run's LoRA files SaveLoRA copies


def safe_lora_target(loras_root: str, name: str, what: str = "LoRA", folder: str = "loras") -> Path:
    """models/loras/pipetrain/<name>.safetensors, refusing names that would leave that folder or that
    some OS cannot store (ComfyUI and its model folders are often shared between Linux and Windows).
    `what` and `folder` name the file kind and model folder in the messages (Save Model: "model",
    "diffusion_models")."""
    hidden = invisible_characters(name)
    if hidden:
        raise ConfigError(f"{what} name {name!r} is not allowed: it contains the invisible or control character(s) "
                          f"{', '.join(hidden)} (a line break, or one that reorders or hides text). Type a plain "
                          "name like 'my_style'.")
    clean = name.strip().replace("\\", "/")
    if clean.lower().endswith(".safetensors"):
        clean = clean[: -len(".safetensors")]
    if not clean.strip("/"):
        raise ConfigError(f"{what} name {name!r} is not allowed: it is empty. Give a name like 'my_style' "
                          "('.safetensors' is added).")
    parts = PurePosixPath(clean).parts
    if not parts or clean.startswith("/") or ":" in clean or any(p in ("..", ".") for p in clean.split("/")):
        raise ConfigError(f"{what} name {name!r} is not allowed: use a plain name like 'my_style' (sub-folders "
                          "such as 'people/anna' are fine; no '..', drive letters or absolute paths).")
    for part in parts:
        problem = portable_name_problem(part)
        if problem:
            raise ConfigError(f"{what} name {name!r} is not allowed: {part!r} {problem}. Use a plain name like "
                              "'my_style' (letters, digits, '_', '-', sub-folders with '/').")
    base = (Path(loras_root) / SUBFOLDER).resolve()
    target = base.joinpath(*parts).with_name(parts[-1] + ".safetensors").resolve()
    if base not in target.parents:
        raise ConfigError(f"{what} name {name!r} would be written outside models/{folder}/{SUBFOLDER}: pick a plain "
                          "name.")
    if target.is_dir():
        raise ConfigError(f"{what} name {name!r}: {target} is a folder: pick another name.")
    return target


def pair_names(name: str, pair: bool) -> list[str]:
    """The LoRA names Save LoRA writes for `name`: name itself, or for a Wan 2.2 experts pair
    <name>_high_noise and <name>_low_noise ('.safetensors' typed at the end stays at the end)."""
    if not pair:
        return [name]
    stem = name.strip()
    if stem.lower().endswith(".safetensors"):
        stem = stem[: -len(".safetensors")]
    return [f"{stem}_high_noise", f"{stem}_low_noise"]


def source_file(run, weights: str) -> Path:
    """The run's LoRA file of the chosen weights (plain, ema or best), refused with the fix when it is missing."""
    if weights not in WEIGHTS:
        raise ConfigError(f"weights is {weights!r}: choose one of {', '.join(WEIGHTS)}.")
    if weights == BEST:  # the saved step with the lowest eval loss (<run>/best.json, engine/best_step.py)
        found = best_step.best(best_step.read(Path(run.run_dir)))
        if found is None:
            raise ConfigError(f"run {run.run_name!r} has no eval history with a saved LoRA step, so there is no best "
                              "step: set eval_every and connect an eval set (eval_cache) to Train Pipeline, or "
                              "choose weights 'plain'.")
        source = Path(run.lora_path).parent / found["file"]
        if not source.is_file():
            raise ConfigError(f"the best step's LoRA file {source} (step {found['step']}) is missing: was it deleted? "
                              "Choose weights 'plain', or train again.")
        return source
    if weights == EMA:
        source = Path(getattr(run, "ema_path", "") or ema_file(run.lora_path))
        if not source.is_file():
            raise ConfigError(f"run {run.run_name!r} kept no EMA weights ({source.name} is not in its lora folder): "
                              "set weights to 'plain', or train with Train Pipeline's ema_decay above 0 (e.g. 0.999).")
        return source
    source = Path(run.lora_path)
    if not source.is_file():
        raise ConfigError(f"the run's LoRA file {source} is missing: was the run folder deleted? Train again.")
    return source


def _file_bytes(tensors: dict, metadata: dict) -> bytes:
    from safetensors.torch import save

    return save(tensors, metadata=metadata)


class PipeTrainSaveLoRA:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("Copy the trained LoRA (or the EMA of its weights) to models/loras/pipetrain/<name>.safetensors "
                   "(listed by LoraLoader) and, when a MODEL is connected, output it with the LoRA applied for a test "
                   "sampler. A Wan 2.2 experts run (Train Pipeline with Wan 2.2 Experts) saves a pair, "
                   "<name>_high_noise and <name>_low_noise.")
    # Saved workflows link outputs by position: the low-noise expert's MODEL is appended last.
    RETURN_TYPES = ("MODEL", "STRING", "MODEL")
    RETURN_NAMES = ("model", "lora_name", "model_low_noise")
    FUNCTION = "save"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "run": (RUN, {"tooltip": "The finished run from PipeTrain Train Pipeline."}),
                "name": ("STRING", {"default": "my_lora", "tooltip":
                         "File name under models/loras/pipetrain/ ('.safetensors' is added). A Wan 2.2 experts run "
                         "saves <name>_high_noise and <name>_low_noise."}),
                "overwrite": ("BOOLEAN", {"default": False, "tooltip":
                              "Replace an existing LoRA of that name. Off: a different existing file is an error, "
                              "never silently replaced."}),
            },
            "optional": {
                "model": ("MODEL", {"tooltip": "Optional: the base MODEL to apply the new LoRA to, for testing. For a "
                                    "Wan 2.2 experts run: the high-noise expert, which gets the high-noise LoRA."}),
                "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.05, "tooltip":
                             "LoRA strength used for the MODEL output (both MODEL outputs of an experts pair)."}),
                # Saved UI workflows store widget values by position: add new inputs at the end only.
                "weights": (list(WEIGHTS), {"default": PLAIN, "tooltip":
                            "Which weights to save: plain = the LoRA as trained at the last step; ema = their "
                            "exponential moving average (needs Train Pipeline's ema_decay above 0), often smoother; "
                            "best = the saved step with the lowest eval loss (needs an eval set and eval_every). "
                            "Same file format either way."}),
                "model_low_noise": ("MODEL", {"tooltip":
                                    "Optional, for a Wan 2.2 experts run: the low-noise expert's MODEL, which gets the "
                                    "low-noise LoRA and comes out as model_low_noise. Unused for a single run."}),
            },
        }

    def save(self, run, name, overwrite, model=None, strength=1.0, weights=PLAIN, model_low_noise=None):
        loras_root = compat.first_folder("loras")
        low = getattr(run, "low_noise", None)
        runs = [run] if low is None else [run, low]
        # every file is read and every name checked before the first is written: a pair is saved whole or not at all
        files = [self._prepared(one, target_name, weights, loras_root, overwrite)
                 for one, target_name in zip(runs, pair_names(name, low is not None))]
        for target, data, write, _ in files:
            if write:
                write_bytes(target, data)
        names = [os.path.relpath(target, Path(loras_root).resolve()) for target, *_ in files]
        out_model = compat.load_lora_onto_model(model, str(files[0][0]), strength) if model is not None else None
        out_low = None
        if low is not None and model_low_noise is not None:
            out_low = compat.load_lora_onto_model(model_low_noise, str(files[1][0]), strength)
        source = files[-1][3]
        shown = f"saved {' and '.join(names)}" + (" (EMA weights)" if weights == EMA else "") + (
            f" (best eval step, {source.name})" if weights == BEST and low is None else
            " (best eval steps)" if weights == BEST else "")
        return {"ui": {"text": [shown]}, "result": (out_model, names[0], out_low)}

    @staticmethod
    def _prepared(run, name: str, weights: str, loras_root: str, overwrite: bool):
        """(target, file bytes, whether to write, source) of one run's LoRA; ConfigError for a name that is taken."""
        from safetensors import safe_open
        from safetensors.torch import load_file

        source = source_file(run, weights)
        target = safe_lora_target(loras_root, name)
        with safe_open(str(source), framework="pt") as f:
            metadata = dict(f.metadata() or {})
        steps = metadata.get("pipetrain_steps", str(run.steps)) if weights == BEST else str(run.steps)
        metadata.update({"pipetrain_version": __version__, "pipetrain_steps": steps,
                         "pipetrain_run": run.run_name, "pipetrain_base_model": run.model_name})
        data = _file_bytes(load_file(str(source)), metadata)
        if target.exists() and not overwrite:
            same = hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(data).digest()
            if not same:
                raise ConfigError(f"{target} already exists: choose another name, or turn on overwrite to replace it.")
            return target, data, False, source
        return target, data, True, source
