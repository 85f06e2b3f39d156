"""from_diffusion_pipe(): a diffusion-pipe main TOML (+ dataset TOML) -> a PipeTrain run.json dict and a cache
config dict, with the report of every key. The run.json dict passes RunConfig's own validation (what
`python -m engine` runs on it); files it names are checked where the run starts, as for every run.json.
"""
from __future__ import annotations

import os
import re
from typing import Any

from ..config.checks import ConfigError
from ..config.run import RunConfig
from ..data.messages import DatasetError
from ..data.scan import DatasetSpec
from .dataset_keys import DatasetKeys
from .main_keys import MainKeys
from .report import Report, Reports
from .values import Draft, Where, load_toml


def run_name_from(path: str | os.PathLike) -> str:
    """A valid PipeTrain run name from the main TOML's file name (engine/config/choices.py RUN_NAME_RE)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.splitext(os.path.basename(str(path)))[0]).lstrip("._-")
    return stem[:100] or "diffusion_pipe"


def from_diffusion_pipe(main_toml: str | os.PathLike, dataset_toml: str | os.PathLike | None = None, *,
                        comfyui_root: str = "", cache_dir: str = "", run_name: str = "", model_path: str = "",
                        eval_cache_dir: str = "", num_gpus: int = 0) -> tuple[dict[str, Any], Reports]:
    """({"run": run.json dict, "cache": cache config dict}, reports). The keyword arguments are what a
    diffusion-pipe config does not say (diffusion-pipe takes the GPU count from its command line: num_gpus
    0 = pipeline_stages GPUs; model_path overrides the TOML's model file)."""
    where, draft = Where(main_toml), Draft()
    main_report = Report(os.path.basename(str(main_toml)))
    draft.set("train.steps", 0)  # diffusion-pipe counts epochs; max_steps sets steps
    MainKeys(load_toml(main_toml, "main TOML"), where, draft, main_report, eval_cache_dir).run()

    dataset_path = str(dataset_toml) if dataset_toml else draft.dataset_toml
    if not dataset_path:
        raise ConfigError(f"{main_toml}: no dataset TOML: set dataset = '<file>.toml' in it, or give the dataset "
                          "TOML as well.")
    data_where = Where(dataset_path)
    data_report = Report(os.path.basename(dataset_path))
    DatasetKeys(load_toml(dataset_path, "dataset TOML"), data_where, draft, data_report).run()

    if not draft.output_dir:
        raise where.fail("output_dir", "is missing: add output_dir = '<folder for training runs>'.")
    name = run_name or run_name_from(main_toml)
    run = {"run_name": name, "run_dir": os.path.join(draft.output_dir, name), "comfyui_root": comfyui_root,
           "model_path": model_path or draft.get("model_path", ""), "cache_dir": cache_dir, **draft.run}
    run.setdefault("launch", {})["num_gpus"] = num_gpus or draft.get("memory.pipeline_stages", 1)
    run = _validated_run(run, main_toml)
    cache = {"comfyui_root": comfyui_root, **draft.cache}
    try:
        DatasetSpec.from_dict(cache["dataset"]).check()
    except (DatasetError, TypeError) as e:
        raise ConfigError(f"{dataset_path}: the dataset these settings make is refused: {e}") from None
    return {"run": run, "cache": cache}, Reports([main_report, data_report], next_steps(run, cache))


def _validated_run(run: dict[str, Any], main_toml: str | os.PathLike) -> dict[str, Any]:
    try:
        return RunConfig.from_dict(run).to_dict()
    except ConfigError as e:
        raise ConfigError(f"{main_toml}: the PipeTrain run these settings make is refused: {e}") from None


def next_steps(run: dict[str, Any], cache: dict[str, Any]) -> list[str]:
    """What the user still has to give before the run can start."""
    notes = []
    if not run["model_path"]:
        notes.append("no single-file model: give the ComfyUI model file (--model, or the TrainPipeline node's model)")
    if not cache.get("vae") and not cache.get("checkpoint"):
        notes.append("no VAE file: set \"vae\" in the cache config to the ComfyUI VAE file")
    if not cache.get("clip") and not cache.get("checkpoint"):
        notes.append("no text encoder file: set \"clip\" in the cache config to the ComfyUI text encoder file(s)")
    if not run["comfyui_root"]:
        notes.append("no ComfyUI folder: set comfyui_root in run.json and the cache config (--comfyui-root)")
    if not run["cache_dir"]:
        notes.append("run `python -m engine cache --config <cache config>`, then set cache_dir in run.json to the "
                     "folder it prints (or import again with --cache-dir)")
    if cache.get("dataset", {}).get("more"):
        notes.append(f"the [[directory]] entries make {len(cache['dataset']['more']) + 1} datasets, each cached on its "
                     "own: set cache_dir to the first cache folder `python -m engine cache` prints and "
                     "more_cache_dirs to the others, in that order")
    return notes
