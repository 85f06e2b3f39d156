"""memory.plan 'fit' on the real engine loop (in-process, CPU, the tiny Wan): the probe measures the run's
own model, the plan is an event and a file, the first step is measured against it, and a cap below the
weights stops the run before step 1 with the planner's message. The CPU "VRAM" is the meter's count of
bytes allocated (engine/memory/meter.py), so caps are a few MiB."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

import memory_runs
import tiny_wan
from PipeTrain.engine.events import EventTail
from PipeTrain.engine.train.fit_setup import PLAN_FILE, NothingFits

MIB = 2**20


@pytest.fixture(scope="module")
def wan(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("fit-wan")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield str(tiny_wan.write_model(root / "tiny_wan.safetensors")), tiny_wan.write_cache(root / "data", items=4)
    torch.set_num_threads(before)


def _config(wan, comfy_root, run_dir: Path, vram_gib: float, steps: int = 4):
    base = memory_runs.wan_config(run_dir, comfy_root, *wan, steps=steps, batch_size=4, learning_rate=1e-2)
    return memory_runs.with_memory(base, run_dir, plan="fit", vram_gib=vram_gib, vram_margin=0.0)


def _event(run, kind: str) -> dict:
    found = [e for e in run.events if e["event"] == kind]
    assert len(found) == 1, [e["event"] for e in run.events]
    return found[0]


@pytest.fixture(scope="module")
def generous(wan, comfy_root, tmp_path_factory):
    """A 1 GiB cap: far above anything the tiny model needs."""
    return memory_runs.train_in_process(_config(wan, comfy_root, tmp_path_factory.mktemp("fit-big") / "run", 1.0))


def test_a_generous_cap_keeps_the_fastest_settings(generous):
    plan = _event(generous, "memory_plan")
    assert plan["chosen"]["checkpointing"] == "off" and plan["chosen"]["block_swap"] == 0, plan["chosen"]
    assert plan["chosen"]["optimizer"] == "adamw" and not plan["chosen"]["fp8"]  # float32 was asked for: kept
    saved = json.loads((Path(generous.cfg.run_dir) / PLAN_FILE).read_text())
    assert saved["chosen"] == plan["chosen"] and saved["figures"]["blocks"] == tiny_wan.WAN_CONFIG["num_layers"]
    acts = saved["figures"]["activation_gib"]
    assert acts["on"] < acts["off"], acts  # checkpointing measured as saving memory on this model
    assert all(math.isfinite(x) for x in generous.losses())


def _need(figures: dict, mode: str) -> float:
    return (figures["weights_gib"] + figures["trainable_gib"] + figures["optimizer_state_gib"]["adamw"]
            + figures["activation_gib"][mode])


def test_a_cap_below_the_measured_peak_turns_savings_on_and_the_run_stays_under_it(generous, wan, comfy_root,
                                                                                   tmp_path):
    figures = json.loads((Path(generous.cfg.run_dir) / PLAN_FILE).read_text())["figures"]
    cap = (_need(figures, "off") + _need(figures, "on")) / 2  # between the two measured needs
    run = memory_runs.train_in_process(_config(wan, comfy_root, tmp_path / "run", cap))
    chosen = _event(run, "memory_plan")["chosen"]
    assert chosen["checkpointing"] != "off" or chosen["block_swap"] > 0, chosen
    assert chosen["peak_gib"] <= cap
    check = _event(run, "memory_plan_check")
    assert check["step"] == 1 and 0 < check["measured_peak_gib"] <= cap, (check, cap)
    assert len(run.losses()) == 4 and all(math.isfinite(x) for x in run.losses())
    assert not [e for e in run.events if e["event"] == "warning"]


def test_a_cap_below_the_weights_stops_before_step_1(generous, wan, comfy_root, tmp_path):
    figures = json.loads((Path(generous.cfg.run_dir) / PLAN_FILE).read_text())["figures"]
    cap = 0.001  # ~1 MiB: even with every block swapped, the rest of the weights does not fit
    assert cap < figures["weights_gib"] - figures["blocks"] * figures["largest_block_gib"]
    cfg = _config(wan, comfy_root, tmp_path / "run", cap)
    with pytest.raises(NothingFits) as err:
        memory_runs.train_in_process(cfg)
    message = str(err.value)
    assert f"nothing fits in {cap} GiB per GPU" in message
    assert "smallest need measured is" in message and "vram_gib" in message and "pipeline_stages" in message
    events = EventTail(cfg.run_dir).read_new()
    assert not [e for e in events if e["event"] in ("started", "step")]
    plan = [e for e in events if e["event"] == "memory_plan"]
    assert plan and plan[0]["chosen"] is None and plan[0]["message"] == message


def test_a_resumed_fit_run_reuses_its_saved_plan(generous, tmp_path):
    """The saved plan is what the checkpoint trained with: a resume takes it as it is, even with a budget
    that would now fit nothing (vram_gib is no result-changing setting)."""
    run_dir = tmp_path / "run"
    shutil.copytree(generous.cfg.run_dir, run_dir)
    cfg = memory_runs.with_memory(generous.cfg, run_dir, vram_gib=0.001)
    cfg = dataclasses.replace(cfg, resume=True, train=dataclasses.replace(cfg.train, steps=6))
    cfg.save(run_dir / "run.json")
    before = len(EventTail(run_dir).read_new())
    run = memory_runs.train_in_process(cfg)
    new = run.events[before:]
    plans = [e for e in new if e["event"] == "memory_plan"]
    assert len(plans) == 1 and plans[0]["reused"] is True, plans
    assert plans[0]["chosen"] == _event(generous, "memory_plan")["chosen"]
    steps = [e["step"] for e in new if e["event"] == "step"]
    assert steps == [5, 6], steps


def test_an_fp8_base_when_only_it_fits_without_swapping_and_the_file_loads_again_in_fp8(wan, comfy_root, tmp_path):
    """base_dtype auto (float32 on a CPU) leaves the precision to the plan: with a budget that checkpointing
    plus fp8 block weights fit and block swap cannot reach, the run loads the file again in fp8 and trains."""
    def config(name: str, vram_gib: float, steps: int):
        cfg = _config(wan, comfy_root, tmp_path / name, vram_gib, steps=steps)
        return memory_runs.with_memory(cfg, tmp_path / name, base_dtype="auto")

    probe = memory_runs.train_in_process(config("probe", 1.0, steps=1))
    f = _event(probe, "memory_plan")["figures"]
    swap_saving = (f["blocks"] - 2) * f["largest_block_gib"]  # the tiny Wan's blocks are all alike
    assert f["fp8_saving_gib"] > swap_saving, f
    cap = round(_need(f, "on") - (f["fp8_saving_gib"] + swap_saving) / 2, 6)
    run = memory_runs.train_in_process(config("fp8", cap, steps=3))
    chosen = _event(run, "memory_plan")["chosen"]
    assert (chosen["checkpointing"], chosen["fp8"], chosen["block_swap"]) == ("on", True, 0), chosen
    assert all(math.isfinite(x) for x in run.losses()) and len(run.losses()) == 3
    check = _event(run, "memory_plan_check")
    assert check["measured_peak_gib"] < _need(f, "on"), (check, _need(f, "on"))  # the weights shrank
    history = json.loads(next((Path(run.cfg.run_dir) / "config_history").glob("rev*.json")).read_text())
    assert history["config"]["memory"]["base_dtype"] == "auto"  # what the user set; the plan is memory_plan.json


@pytest.mark.slow
def test_deepspeed_ranks_plan_together(generous, tmp_path):
    """Two launched ranks (gloo) probe, take the maximum of each other's figures and train the one plan."""
    from engine_runs import run_to_end

    figures = json.loads((Path(generous.cfg.run_dir) / PLAN_FILE).read_text())["figures"]
    cap = (_need(figures, "off") + _need(figures, "on")) / 2
    cfg = memory_runs.with_memory(generous.cfg, tmp_path / "ds", vram_gib=cap)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=2),
                              launch=dataclasses.replace(cfg.launch, num_gpus=2, backend="deepspeed"))
    cfg.save(tmp_path / "ds" / "run.json")
    ds = run_to_end(cfg, timeout=240)
    assert ds.of("started")[0]["world_size"] == 2
    plans = ds.of("memory_plan")
    assert len(plans) == 1 and plans[0]["chosen"]["checkpointing"] == "on", plans
    assert len(ds.losses()) == 2 and all(math.isfinite(x) for x in ds.losses())
