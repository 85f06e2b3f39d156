"""Entry point (cwd = the pack's root).

    python -m engine --config <run_dir>/run.json     train: one rank of a run
    python -m engine cache --config cache.json       cache: encode a dataset (engine/cache/cli.py)
    python -m engine import-dp --main X.toml ...     diffusion-pipe configs -> run.json (engine/dpconfig/cli.py)
    python -m engine export-dp run.json --out-dir D  run.json -> diffusion-pipe configs

The per-node launcher (engine/launch/local_ranks.py; DeepSpeed's on several machines) runs the training
entry once per rank (engine/launch/launcher.py builds the command; DeepSpeed's own does the same by hand:
python -m deepspeed.launcher.runner --num_gpus N --module --no_local_rank engine --config run.json)
and the cache mode starts its own ranks the same way, with `cache ... --worker`.
"""
from __future__ import annotations

import argparse
import sys
import time

PROCESS_START = time.time()  # before torch and ComfyUI are imported: the setup phases start here


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine", description="PipeTrain training engine")
    parser.add_argument("mode", nargs="?", default="train", choices=("train", "cache"),
                        help="train (the default: --config is a run.json) or cache (--config is a cache config)")
    parser.add_argument("--config", required=True, help="path of the run's run.json, or of the cache config")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # cache: one launched rank
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # set by some launchers
    return parser.parse_args(argv)


if __name__ == "__main__":
    if sys.argv[1:2] in (["import-dp"], ["export-dp"]):  # config conversion: its own arguments, no torch
        from .dpconfig.cli import COMMANDS

        sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:]))
    args = _parse(sys.argv[1:])
    if args.mode == "cache":
        from .cache.cli import main as cache_main

        sys.exit(cache_main(args.config, worker=args.worker))
    from .train.loop import main

    sys.exit(main(args.config, process_start=PROCESS_START))
