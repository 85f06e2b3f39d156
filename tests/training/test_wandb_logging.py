"""W&B logging through the real engine (engine/train/loop.py main, in this process, the plain backend on the
CPU): every step's loss, learning rate and gradient norm and every eval loss reach W&B with the values of
events.jsonl, the run's config is run.json, and the run is finished. Once against a stand-in `wandb` module
(always), once with the real package in offline mode where it is installed (an optional extra: not in
requirements-dev.txt, a 100 MB install with its dependencies)."""
from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import signal
import struct
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from engine_runs import make_config
from PipeTrain.engine.config.eval import EvalSpec
from PipeTrain.engine.config.monitor import MonitorSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.sections import MemorySpec
from PipeTrain.engine.events import read_events

pytestmark = pytest.mark.slow
STEPS = 3


def _run_main(tmp_path, comfy_root, demo_base, cache_dir, mode: str) -> tuple[RunConfig, list[dict]]:
    """A 3-step run with W&B on and an eval every 2 steps (and before the start), through loop.main."""
    from PipeTrain.engine.train.loop import main

    cfg = make_config(tmp_path / "run", comfy_root, demo_base, cache_dir, steps=STEPS,
                      memory=MemorySpec(base_dtype="float32"))
    cfg = dataclasses.replace(cfg, launch=LaunchSpec(num_gpus=1, backend="plain"),
                              eval=EvalSpec(cache_dir=cache_dir, every=2, before_start=True),
                              monitor=MonitorSpec(wandb_project="pipetrain-test", wandb_mode=mode))
    cfg.save(Path(cfg.run_dir) / "run.json")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # main() installs its Cancel handlers; give pytest its own back
        assert main(str(Path(cfg.run_dir) / "run.json")) == 0
    finally:
        torch.set_num_threads(threads)
        for s, h in handlers.items():
            signal.signal(s, h)
    return cfg, read_events(cfg.run_dir)


def _expected(events: list[dict]) -> tuple[dict[int, dict], dict[int, float]]:
    steps = {e["step"]: {"train/loss": e["loss"], "train/lr": e["lr"], "train/grad_norm": e["grad_norm"]}
             for e in events if e["event"] == "step"}
    evals = {e["step"]: e["loss"] for e in events if e["event"] == "eval"}
    assert sorted(steps) == [1, 2, 3] and sorted(evals) == [0, 2, 3], (steps, evals)
    return steps, evals


def test_every_step_and_eval_reach_wandb_and_the_run_finishes(tmp_path, comfy_root, demo_base, cache_dir,
                                                              monkeypatch):
    runs = []

    class Run:
        name, url = "stand-in", None

        def __init__(self, **init):
            self.init, self.logged, self.finished = init, [], []

        def log(self, data, step):
            self.logged.append((step, dict(data)))

        def finish(self, exit_code=None):
            self.finished.append(exit_code)

    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # libraries that look for it (accelerate) find it
    module.init = lambda **kw: runs.append(Run(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", module)
    cfg, events = _run_main(tmp_path, comfy_root, demo_base, cache_dir, "online")
    steps, evals = _expected(events)
    (run,) = runs
    assert run.init["config"] == RunConfig.load(Path(cfg.run_dir) / "run.json").to_dict()
    assert run.init["name"] == cfg.run_name and run.init["dir"] == cfg.run_dir
    assert {s: d for s, d in run.logged if "train/loss" in d} == steps
    assert {s: d["eval/loss"] for s, d in run.logged if "eval/loss" in d} == evals
    assert all(f"eval/loss_q{q}" in d for s, d in run.logged if "eval/loss" in d for q in (0.1, 0.5, 0.9))
    assert run.finished == [0]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                    reason="the wandb package is not installed (an optional extra: pip install wandb)")
def test_an_offline_wandb_run_holds_the_loss_history(tmp_path, comfy_root, demo_base, cache_dir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg, events = _run_main(tmp_path, comfy_root, demo_base, cache_dir, "offline")
    steps, evals = _expected(events)
    (log,) = (Path(cfg.run_dir) / "wandb").glob("offline-run-*/run-*.wandb")  # W&B's files in the run folder
    records = _finished_records(log)
    history = {}
    for step, values in _history(records):
        history.setdefault(step, {}).update(values)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert {s: {k: v[k] for k in ("train/loss", "train/lr", "train/grad_norm")}
            for s, v in history.items() if "train/loss" in v} == steps, kinds
    assert {s: v["eval/loss"] for s, v in history.items() if "eval/loss" in v} == evals, kinds


def _finished_records(path: Path, wait_s: float = 60.0) -> list:
    """The run file's records once it holds the run's exit record. W&B's own service process writes the file
    (wandb-core, beside the training process): on a loaded machine it may still be writing when finish()
    has returned, so wait for the record it writes last rather than reading a file half written."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            records = list(_records(path))
        except DecodeError:  # the last record is being written
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def _history(records: list):
    """(step, {key: value}) of each history record."""
    import json

    for parsed in records:
        if parsed.WhichOneof("record_type") == "history":
            values = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in parsed.history.item}
            yield values.pop("_step"), values


def _records(path: Path):
    """The records of W&B's run file: W&B's protobuf schema (wandb.proto, shipped with the package) in
    LevelDB's log framing (32 KiB blocks; each chunk a 7-byte header: crc32, length, type 1 full / 2 first /
    3 middle / 4 last) after a 7-byte file header."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, record = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B", data[:7]
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            continue
        record = chunk if kind in (1, 2) else record + chunk
        if kind in (1, 4):
            parsed = wandb_internal_pb2.Record()
            parsed.ParseFromString(record)
            yield parsed
