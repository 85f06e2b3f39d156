"""Entry point: `python -m engine --config <run_dir>/run.json` (cwd = the pack's root).

The DeepSpeed launcher runs this once per rank:
    python -m deepspeed.launcher.runner --num_gpus N --module --no_local_rank engine --config run.json
"""
from __future__ import annotations

import argparse
import sys


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine", description="PipeTrain training engine")
    parser.add_argument("--config", required=True, help="path of the run's run.json")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # set by some launchers
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = _parse(sys.argv[1:])
    from .train import main

    sys.exit(main(args.config))
