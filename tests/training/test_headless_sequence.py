"""The headless launcher given several run.json files (a Wan 2.2 experts pair is two run folders): each run starts
when the one before it has finished, and every file is checked before the first run starts, so a mistake in the
second does not surface after the first has trained for hours. Real DeepSpeed ranks (gloo on CPU)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine_runs import build_cache, kill_engine_processes, make_config

pytestmark = [pytest.mark.slow, pytest.mark.core]
REPO = Path(__file__).resolve().parents[2]


def _headless(*configs: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.launch.launcher", *map(str, configs)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def _events(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "events.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


def test_run_jsons_run_one_after_the_other_and_each_is_checked_before_the_first_starts(tmp_path, comfy_root,
                                                                                      demo_base):
    cache = build_cache(comfy_root, demo_base)
    first = make_config(tmp_path / "high_noise", comfy_root, demo_base, cache, steps=2, min_t=0.875)
    second = make_config(tmp_path / "low_noise", comfy_root, demo_base, cache, steps=2, max_t=0.875)
    a, b = Path(first.run_dir) / "run.json", Path(second.run_dir) / "run.json"
    try:
        broken = tmp_path / "broken.json"  # the second run's model file is missing
        dataclasses.replace(second, model_path=str(tmp_path / "missing.safetensors")).save(broken)
        out = _headless(a, broken)
        assert out.returncode == 2 and f"{broken}: model file" in out.stderr, out.stdout + out.stderr
        twice = _headless(a, a)
        assert twice.returncode == 2 and f"{a} and {a} both train in" in twice.stderr, twice.stderr
        assert not _events(Path(first.run_dir), "started"), "a run started although a later file was wrong"

        out = _headless(a, b)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        done_first, started_second = _events(Path(first.run_dir), "done"), _events(Path(second.run_dir), "started")
        assert done_first[-1]["step"] == 2 and _events(Path(second.run_dir), "done")[-1]["step"] == 2
        assert started_second[0]["time"] >= done_first[-1]["time"], "the second run did not wait for the first"
        assert out.stdout.count("training in ") == 2, out.stdout
    finally:
        kill_engine_processes(str(tmp_path))
