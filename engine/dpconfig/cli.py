"""`python -m engine import-dp` and `python -m engine export-dp` (engine/__main__.py hands these over):

    python -m engine import-dp --main train.toml [--dataset dataset.toml] --out run.json [--cache-config cache.json]
    python -m engine export-dp run.json --out-dir dp_configs [--cache-config cache.json] [--model-type wan]

Both print the report (every key mapped or not mapped), write temp-then-rename, and refuse to replace an
existing file unless --force. Exit codes: 0 written, 2 a setting to fix (the message says which).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..config.checks import ConfigError
from ..atomic_files import write_text

PACK_ROOT = Path(__file__).resolve().parents[2]


def default_comfyui_root() -> str:
    """The ComfyUI that hosts the pack (<ComfyUI>/custom_nodes/PipeTrain), else ""."""
    root = PACK_ROOT.parents[1]
    return str(root) if (root / "comfy" / "sd.py").is_file() else ""


def _write_all(files: dict[Path, str], force: bool) -> None:
    taken = [str(p) for p in files if p.exists()]
    if taken and not force:
        raise ConfigError(f"{', '.join(taken)} already exist(s): choose another output, or add --force to replace.")
    for path, text in files.items():
        write_text(path, text)


def import_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m engine import-dp",
                                description="diffusion-pipe main + dataset TOML -> PipeTrain run.json + cache config")
    p.add_argument("--main", required=True, help="diffusion-pipe's main TOML")
    p.add_argument("--dataset", default="", help="its dataset TOML (default: the main TOML's `dataset` key)")
    p.add_argument("--out", required=True, help="the run.json to write")
    p.add_argument("--cache-config", default="", help="the cache config to write (default: cache.json beside --out)")
    p.add_argument("--comfyui-root", default=default_comfyui_root(), help="the ComfyUI folder (default: the one "
                   "hosting this pack)")
    p.add_argument("--model", default="", help="the single-file ComfyUI model (overrides the TOML's model file)")
    p.add_argument("--cache-dir", default="", help="the finished cache folder (python -m engine cache prints it)")
    p.add_argument("--eval-cache-dir", default="", help="the eval set's cache folder (with eval_datasets)")
    p.add_argument("--run-name", default="", help="run name (default: the main TOML's file name)")
    p.add_argument("--num-gpus", type=int, default=0, help="GPUs (default: pipeline_stages)")
    p.add_argument("--force", action="store_true", help="replace existing output files")
    args = p.parse_args(argv)
    from .importer import from_diffusion_pipe

    try:
        settings, reports = from_diffusion_pipe(args.main, args.dataset or None, comfyui_root=args.comfyui_root,
                                                cache_dir=_absolute(args.cache_dir), run_name=args.run_name,
                                                model_path=_absolute(args.model),
                                                eval_cache_dir=_absolute(args.eval_cache_dir), num_gpus=args.num_gpus)
        out = Path(args.out)
        cache = Path(args.cache_config) if args.cache_config else out.with_name("cache.json")
        _write_all({out: json.dumps(settings["run"], indent=2, sort_keys=True),
                    cache: json.dumps(settings["cache"], indent=2, sort_keys=True)}, args.force)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    print(reports.text())
    print(f"\nwrote {out} and {cache}")
    return 0


def export_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m engine export-dp",
                                description="PipeTrain run.json -> diffusion-pipe main + dataset TOML")
    p.add_argument("run_json", help="the run's run.json")
    p.add_argument("--out-dir", required=True, help="folder for main.toml and dataset.toml")
    p.add_argument("--cache-config", default="", help="the cache config the run was cached with (default: the "
                   "dataset recorded in the run's cache manifest)")
    p.add_argument("--model-type", default="", help="diffusion-pipe's [model] type (default: from the cache "
                   "config's clip_type)")
    p.add_argument("--force", action="store_true", help="replace existing output files")
    args = p.parse_args(argv)
    from .exporter import to_diffusion_pipe

    try:
        run = _read_json(args.run_json, "run.json")
        dataset = _read_json(args.cache_config, "cache config") if args.cache_config else None
        out = Path(args.out_dir)
        # diffusion-pipe reads `dataset` against its working folder: an absolute path works from anywhere
        main_text, data_text, reports = to_diffusion_pipe(run, dataset, args.model_type,
                                                          dataset_file=str((out / "dataset.toml").absolute()))
        _write_all({out / "main.toml": main_text, out / "dataset.toml": data_text}, args.force)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    print(reports.text())
    print(f"\nwrote {out / 'main.toml'} and {out / 'dataset.toml'}")
    return 0


def _absolute(path: str) -> str:
    return os.path.abspath(path) if path else ""


def _read_json(path: str, what: str):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read the {what} {path}: {e}") from None


COMMANDS = {"import-dp": import_main, "export-dp": export_main}
