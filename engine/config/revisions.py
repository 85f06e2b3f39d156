"""Every revision of a run's config, and which changes a resume may make.

run.json is the run's current config: a resume may rewrite it (the node does, a shell user may).
Each start of a run keeps what it trains with as `<run_dir>/config_history/rev0001.json`, ...
(`{"step": the step it starts from, "config": run.json's content}`), so the settings of every stretch
of steps stay known. A resume whose settings would make it differ from an uninterrupted run is
refused with the list of changed settings, unless run.json says `accept_changes: true`; then the
changes are reported (the engine logs them as an event and in TensorBoard at the step they start).
Plain data, no torch.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..atomic_files import write_text
from . import global_batch
from .base_loras import identity as base_lora_identity
from .checks import ConfigError

HISTORY = "config_history"

# Settings a resume may change without changing what the run computes: how long it runs, when it
# saves, what it shows, where and how it runs. Everything else (LoRA shape, learning rate, seed,
# the dataset's cache, the model ...) must stay as the checkpoint was trained.
SAME_RESULT = (
    "run_name", "run_dir", "comfyui_root", "resume", "accept_changes", "version",
    "train.steps", "train.epochs", "train.save_every", "train.checkpoint_every",
    "memory.activation_checkpointing", "memory.block_swap", "memory.block_swap_sampling",
    "memory.compile_blocks", "memory.compile_mode", "memory.expandable_segments",
    "memory.vram_gib", "memory.vram_margin",  # a resumed fit run reuses its saved plan (engine/memory/fit_probe.py)
    "sample.", "eval.every", "eval.before_start", "eval.early_stop", "launch.", "monitor.",
)
# Settings added after runs existed, with the value that gives their old behaviour: a run from before them
# trained as if set so, and a resume that sets another value is a change. objective.guidance 0 = each item's
# cached guidance, else ComfyUI's default (3.5 for Flux), as PipeTrain trained guidance-distilled models
# before. The EMA settings change no trained weight, but the EMA file a run writes: an EMA turned on or
# changed at a resume is no EMA an uninterrupted run would have (with accept_changes it starts from the
# weights at the resume step, engine/train/ema.py).
BEFORE_THEY_EXISTED = {"base_loras": [], "objective.guidance": 0.0, "train.ema_decay": 0.0, "train.ema_start_step": 0,
                       "lora.kind": "lora", "lora.lokr_factor": -1}
# Sections a resume keeps from the run where the new config leaves a setting out (run.json without the key;
# TrainPipeline without an Objective Options node): a resumed run goes on training what it trained.
KEPT_ON_RESUME = ("objective",)
# Paths whose file name is the identity (the folders around it are node-local): the model file, and a
# cache folder named by its dataset fingerprint.
BY_NAME = ("model_path", "cache_dir", "eval.cache_dir", "lora.init_from")


# What the training cache's manifest says about how it trains but its folder name (the dataset fingerprint)
# leaves out: LoadDataset's caption_dropout changes which steps train on the empty caption, not a stored
# tensor, so the same cache folder can come back with another value. Kept with each revision as "cache".
CACHE_SETTINGS = {"caption_dropout": 0.0, "batch_sizes": []}  # batch_sizes: LoadDataset's batch size per resolution
UNSET_LEFT_OUT = ("batch_sizes",)  # kept only when set, so the revisions of runs without it stay as they were


def cache_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The CACHE_SETTINGS of the config's training cache, from its manifest.json ({} when unreadable: the
    node and the ranks refuse such a cache with their own message); chained datasets' caches (more_cache_dirs)
    under "dataset2", "dataset3", ..."""
    out = _settings_of(config.get("cache_dir", ""))
    for n, folder in enumerate(config.get("more_cache_dirs") or (), start=2):
        out[f"dataset{n}"] = _settings_of(folder)
    return out


def _settings_of(cache_dir: str) -> dict[str, Any]:
    try:
        manifest = json.loads((Path(cache_dir) / "manifest.json").read_text(encoding="utf-8"))
        dataset = manifest.get("dataset") or {}
        out = {name: type(default)(dataset.get(name, default)) for name, default in CACHE_SETTINGS.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return {k: v for k, v in out.items() if v or k not in UNSET_LEFT_OUT}


def _filled(cache: dict[str, Any]) -> dict[str, Any]:
    """A revision's cache settings with the ones left out at their defaults (UNSET_LEFT_OUT), for comparing."""
    unset = {k: CACHE_SETTINGS[k] for k in UNSET_LEFT_OUT}
    return {**unset, **{k: {**unset, **v} if isinstance(v, dict) else v for k, v in cache.items()}}


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"lora.alpha": 0.0, ...}: the config's settings under dotted names."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, name + "."))
        elif name == "base_loras":  # [[file name, strength], ...]: the folders are machine-local
            out[name] = base_lora_identity(value)
        elif name == "more_cache_dirs":  # chained datasets' caches: named by their fingerprints, like cache_dir
            out[name] = [os.path.basename(os.path.normpath(v)) for v in value]
        else:
            out[name] = os.path.basename(os.path.normpath(value)) if name in BY_NAME and value else value
    return out


def result_changes(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(setting, before, after) for each setting that differs and changes what the run computes. A setting
    only one side has (added in a later PipeTrain) ran at its default then, and is not compared, unless
    its old behaviour has a value of its own (BEFORE_THEY_EXISTED)."""
    a, b = {**BEFORE_THEY_EXISTED, **flat(before)}, flat(after)
    changed = []
    for name in sorted(set(a) & set(b)):
        if a.get(name) == b.get(name) or any(name == s or (s.endswith(".") and name.startswith(s))
                                             for s in SAME_RESULT):
            continue
        changed.append((name, a.get(name), b.get(name)))
    return changed


def revisions(run_dir: str | os.PathLike) -> list[Path]:
    folder = Path(run_dir) / HISTORY
    return sorted(folder.glob("rev*.json")) if folder.is_dir() else []


def last_revision(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The newest kept revision ({"step", "config"}), or None for a run that never started."""
    kept = revisions(run_dir)
    if not kept:
        return None
    try:
        return json.loads(kept[-1].read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"the run's config history {kept[-1]} cannot be read ({e}): restore it, or start a "
                          "new run.") from e


def last_replicas(run_dir: str | os.PathLike) -> int | None:
    """The data-parallel replicas of the run's last start: as the engine recorded them, else as that start's
    config launches them (engine/config/global_batch.py); None for a run that never started."""
    last = last_revision(run_dir)
    return None if last is None else last.get("replicas") or global_batch.replicas_of(last["config"])


def check_resume(run_dir: str | os.PathLike, config: dict[str, Any], before: dict[str, Any] | None = None,
                 replicas: int | None = None) -> list[tuple[str, Any, Any]]:
    """The result-changing settings this resume changes since the last start ([] for none). `before`:
    the config to compare with when the run kept no history (its run.json from an older PipeTrain).
    `replicas`: this start's data-parallel replicas where known (the engine), else as `config` launches them;
    train.grad_accum is judged through the global batch (engine/config/global_batch.py).
    Raises ConfigError listing them unless config['accept_changes'] is true."""
    last = last_revision(run_dir)
    if last is None and before is None:
        return []
    previous = last["config"] if last is not None else before
    replicas_then = last_replicas(run_dir) if last is not None else global_batch.replicas_of(previous)
    changed = global_batch.judged(result_changes(previous, config), previous, config,
                                  (replicas_then, replicas or global_batch.replicas_of(config)))
    if last is not None and isinstance(last.get("cache"), dict):  # revisions kept before it have no "cache"
        changed += result_changes({"cache": _filled(last["cache"])}, {"cache": _filled(cache_settings(config))})
    if changed and not config.get("accept_changes"):
        listed = "; ".join(f"{_shown(name)}: {old!r} -> {new!r}" for name, old, new in changed)
        hint = global_batch.HINT if any(name == global_batch.NAME for name, _, _ in changed) else ""
        raise ConfigError(f"resuming {run_dir} with changed settings would train differently from an uninterrupted "
                          f"run: {listed}.{hint} Set them back to resume it, start a new run for new settings, or "
                          "turn on accept_changes (TrainPipeline's input, or \"accept_changes\": true in run.json) "
                          "to continue with them.")
    return changed


def _shown(name: str) -> str:
    """A setting's name in messages; the cache's own ones say where they are set."""
    return f"{name} (LoadDataset's {name[6:]}, kept in the cache)" if name.startswith("cache.") else name


def trained_section(run_dir: str | os.PathLike, section: str, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `section` settings the run trained with at its last start (its newest revision, else `before`:
    the run.json of a run from a PipeTrain that kept no history); a setting that config lacks has the value
    of its old behaviour (BEFORE_THEY_EXISTED) or is left out (its default is that behaviour)."""
    last = last_revision(run_dir)
    previous = last["config"] if last is not None else (before or {})
    old = {name.partition(".")[2]: value for name, value in BEFORE_THEY_EXISTED.items()
           if name.startswith(section + ".")}
    given = previous.get(section)
    return {**old, **(given if isinstance(given, dict) else {})}


def keep_run_settings(data: dict[str, Any]) -> dict[str, Any]:
    """A resumed run.json (`data`, with a checkpoint to resume from) with every KEPT_ON_RESUME setting it
    leaves out taken from what the run trained with; any other run.json as it is."""
    run_dir = data.get("run_dir")
    resumed = data.get("resume") and isinstance(run_dir, str)
    if not resumed or not (Path(run_dir) / "checkpoints" / "latest").exists():
        return data
    out = dict(data)
    for section in KEPT_ON_RESUME:
        given = data.get(section)
        if given is None or isinstance(given, dict):
            out[section] = {**trained_section(run_dir, section, before=data), **(given or {})}
    return out


def record(run_dir: str | os.PathLike, config: dict[str, Any], step: int, replicas: int | None = None) -> Path:
    """Keep `config` as the next revision, starting at `step`, with the data-parallel `replicas` it trains on
    where known (temp-then-rename); returns its path."""
    folder = Path(run_dir) / HISTORY
    folder.mkdir(parents=True, exist_ok=True)
    kept = revisions(run_dir)
    number = int(kept[-1].stem[3:]) + 1 if kept else 1
    path = folder / f"rev{number:04d}.json"
    write_text(path, json.dumps({"step": step, "config": config, "cache": cache_settings(config),
                                **({"replicas": replicas} if replicas else {})}, indent=2,
                                sort_keys=True))
    return path
