"""The fit-to-VRAM planner on numbers alone (engine/memory/fit_plan.py), the memory plan's settings and the
CPU meter the CPU tests plan with (engine/memory/meter.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.sections import MemorySpec
from PipeTrain.engine.memory.fit_plan import GIB, Figures, plan, predict
from PipeTrain.engine.memory.meter import PeakMeter, device_bytes

# A 14B-like model in round numbers: 20 GiB of frozen weights, 16 of them in 16 blocks of 1 GiB.
FIGURES = Figures(weights=20 * GIB, block_weights=(GIB,) * 16, trainable=GIB // 4,
                  optimizer_state={"adamw": 2 * GIB, "adamw8bit": GIB // 2},
                  activations={"off": 30 * GIB, "on": 3 * GIB}, seconds={"off": 10.0, "on": 13.0},
                  copy_bytes_per_s=GIB / 0.1, fp8_saving=8 * GIB)


def test_everything_fits_keeps_the_fastest_settings():
    result = plan(FIGURES, budget=80 * GIB, margin=0.1, optimizer="adamw")
    c = result.chosen
    assert (c.checkpointing, c.block_swap, c.fp8, c.optimizer) == ("off", 0, False, "adamw")
    assert c.peak == 20 * GIB + GIB // 4 + 2 * GIB + 30 * GIB and c.seconds == 10.0
    assert "checkpointing off, block_swap 0, optimizer adamw" in result.message


def test_checkpointing_is_chosen_when_it_is_faster_than_the_swapping_off_would_need():
    # 40 GiB: off needs 52.25; with all 16 blocks swapped it still needs 52.25 - 14 = 38.25 GiB and
    # 3.2 s of copies per step, under 10 s: block swap 15 fits (39.25 <= 40 * 0.99) and wins on time.
    result = plan(FIGURES, budget=40 * GIB, margin=0.01, optimizer="adamw")
    assert (result.chosen.checkpointing, result.chosen.block_swap) == ("off", 15)
    # with a slow copy the same swap takes 32 s a step: checkpointing (13 s, 25.25 GiB) is faster
    slow = dataclasses.replace(FIGURES, copy_bytes_per_s=GIB / 1.0)
    result = plan(slow, budget=40 * GIB, margin=0.01, optimizer="adamw")
    assert (result.chosen.checkpointing, result.chosen.block_swap, result.chosen.fp8) == ("on", 0, False)


def test_block_swap_takes_the_smallest_n_that_fits():
    # checkpointing on, no swap: 20 + 0.25 + 2 + 3 = 25.25 GiB. Usable 22 GiB: each swapped block beyond the
    # two in flight saves 1 GiB; 5 swapped -> 25.25 - 3 = 22.25 (no), 6 -> 21.25 (yes). fp8 would fit at once
    # (17.25) but is 5% slower, while 6 swapped blocks copy in 1.2 s, hidden behind the 13 s step.
    no_fp8 = dataclasses.replace(FIGURES, fp8_saving=0)
    result = plan(no_fp8, budget=22 * GIB, margin=0.0, optimizer="adamw")
    assert (result.chosen.checkpointing, result.chosen.block_swap) == ("on", 6), result.chosen
    assert result.chosen.peak == int(21.25 * GIB)
    assert predict(no_fp8, "on", 5, False, "adamw").peak > 22 * GIB


def test_fp8_and_8bit_state_when_block_swap_alone_is_too_slow():
    slow = dataclasses.replace(FIGURES, copy_bytes_per_s=GIB / 2.0)  # a swapped block costs 4 s a step
    result = plan(slow, budget=22 * GIB, margin=0.0, optimizer="adamw")
    c = result.chosen
    # 6 swapped blocks: 24 s a step; fp8 (8 GiB less): 17.25 GiB, 13.65 s; 8-bit state changes nothing
    # there, so the first of the equally fast is kept: the run's own optimizer.
    assert (c.checkpointing, c.block_swap, c.fp8, c.optimizer) == ("on", 0, True, "adamw")
    assert c.seconds == pytest.approx(13.0 * 1.05)
    # only the 8-bit optimizer's 1.5 GiB makes the difference: 25.25 - 1.5 = 23.75 GiB
    tight = dataclasses.replace(slow, fp8_saving=0)
    result = plan(tight, budget=24 * GIB, margin=0.0, optimizer="adamw")
    assert (result.chosen.optimizer, result.chosen.block_swap, result.chosen.fp8) == ("adamw8bit", 0, False)


def test_no_fp8_without_checkpointing_and_no_8bit_for_other_optimizers():
    figures = dataclasses.replace(FIGURES, optimizer_state={**FIGURES.optimizer_state, "adafactor": GIB // 4})
    result = plan(figures, budget=1000 * GIB, margin=0.0, optimizer="adafactor")
    assert not any(c.fp8 and c.checkpointing == "off" for c in result.tried)
    assert {c.optimizer for c in result.tried} == {"adafactor"}


def test_nothing_fits_names_the_budget_the_smallest_need_and_the_fixes():
    result = plan(FIGURES, budget=8 * GIB, margin=0.25, optimizer="adamw")
    assert result.chosen is None
    least = min(result.tried, key=lambda c: c.peak)
    # on + fp8 + 8-bit + all 16 swapped: 20 - 8 - 14 * 0.5 + 0.25 + 0.5 + 3 = 8.75 GiB
    assert least.peak == int(8.75 * GIB) and least.block_swap == 16 and least.fp8
    m = result.message
    assert m.startswith("nothing fits in 8.0 GiB per GPU, 25% kept free: 6.0 GiB usable")
    assert "smallest need measured is 8.75 GiB" in m and "activations 3.0 GiB" in m
    for fix in ("smaller buckets", "pipeline_stages", "larger vram_gib"):
        assert fix in m


def test_a_mode_that_ran_out_of_memory_is_no_candidate_and_is_reported():
    oom = dataclasses.replace(FIGURES, activations={"off": None, "on": 3 * GIB})
    result = plan(oom, budget=80 * GIB, margin=0.0, optimizer="adamw")
    assert result.chosen.checkpointing == "on" and result.chosen.seconds == 13.0
    assert "off: the probe step ran out of memory" in result.unmeasured
    assert "cpu_offload: not measured" in result.unmeasured


def test_a_mode_measured_faster_than_a_cheaper_one_is_timing_noise():
    noisy = dataclasses.replace(FIGURES, seconds={"off": 10.0, "on": 9.0})
    assert plan(noisy, budget=80 * GIB, margin=0.0, optimizer="adamw").chosen.checkpointing == "off"


def test_plan_record_is_json_ready():
    record = plan(FIGURES, budget=24 * GIB, margin=0.1, optimizer="adamw").to_dict()
    assert record["budget_gib"] == 24.0 and record["usable_gib"] == pytest.approx(21.6, abs=1e-5)
    assert set(record["chosen"]) >= {"checkpointing", "block_swap", "fp8", "optimizer", "peak_gib", "seconds", "label"}


@pytest.mark.parametrize("changes, words", [
    (dict(plan="auto"), "memory.plan is 'auto': choose one of manual, fit"),
    (dict(vram_gib=-1.0), "memory.vram_gib is -1.0: use 0"),
    (dict(vram_margin=0.6), "memory.vram_margin is 0.6: use a share of the budget between 0 and 0.5"),
    (dict(plan="fit", pipeline_stages=2), "memory.plan is 'fit' with pipeline_stages 2"),
    (dict(plan="fit", compile_blocks=True, compile_mode="cuda_graphs"), "set compile_mode to 'default'"),
])
def test_memory_plan_settings_are_validated(changes, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        MemorySpec(**changes).validate()


def test_fit_settings_are_accepted():
    MemorySpec(plan="fit", vram_gib=24.0, vram_margin=0.1).validate()
    MemorySpec(plan="fit", vram_gib=0.0, vram_margin=0.0).validate()


def test_the_cpu_meter_measures_a_known_allocation():
    meter = PeakMeter(torch.device("cpu"))
    held = torch.zeros(3 << 20, dtype=torch.uint8)  # before the start: not counted
    with meter.measuring():
        a = torch.empty(5 << 20, dtype=torch.uint8)
        b = torch.empty(2 << 20, dtype=torch.uint8)
        del a
        c = torch.empty(4 << 20, dtype=torch.uint8)  # 6 MiB live now, 7 MiB was the peak
        del b, c
    assert meter.peak == 7 << 20
    assert held.numel() == 3 << 20


def test_the_cpu_meter_counts_from_its_own_start_after_earlier_recordings():
    """The profiler's running total carries on across recordings: a tensor allocated while measuring and
    freed outside never comes off it. Each measurement counts from its own start all the same."""
    meter = PeakMeter(torch.device("cpu"))
    with meter.measuring():
        kept = torch.empty(6 << 20, dtype=torch.uint8)
    del kept  # freed while nothing records
    for _ in range(2):
        with meter.measuring():
            a = torch.empty(2 << 20, dtype=torch.uint8)
            del a
        assert meter.peak == 2 << 20


def test_device_bytes_counts_each_storage_once_and_leaves_out_excluded_buffers():
    layer = torch.nn.Linear(256, 256)  # 256 KiB weight + 1 KiB bias, float32
    tied = torch.nn.Module()
    tied.a, tied.b = layer, layer
    assert device_bytes(tied, torch.device("cpu")) == (256 * 256 + 256) * 4
    assert device_bytes(tied, torch.device("cpu"), exclude=(layer.weight,)) == 256 * 4


def test_a_fit_run_whose_model_does_not_fit_the_gpu_to_probe_says_what_to_do(tmp_path):
    """A CUDA out-of-memory error cannot be caused on this machine: raised by hand where the load would."""
    from PipeTrain.engine.config.run import RunConfig
    from PipeTrain.engine.train.fit_setup import NothingFits, whole_model_load

    cfg = RunConfig(run_name="r", run_dir=str(tmp_path), comfyui_root=str(tmp_path), cache_dir=str(tmp_path),
                    model_path=str(tmp_path / "wan14b.safetensors"),
                    memory=MemorySpec(plan="fit"))
    with pytest.raises(NothingFits, match="wan14b.safetensors did not fit there .* set plan to 'manual'"):
        with whole_model_load(cfg, torch.device("cpu")):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    manual = dataclasses.replace(cfg, memory=MemorySpec())
    with pytest.raises(torch.cuda.OutOfMemoryError):  # plan manual: the error as it was
        with whole_model_load(manual, torch.device("cpu")):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
