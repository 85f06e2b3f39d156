"""Memory settings at the boundaries: run.json (old booleans still load), config errors that name the
setting, the MemoryOptions node (tooltips, saved workflows with the old boolean), the launcher env."""
from __future__ import annotations

import json
import os

import pytest

import memory_runs
import tiny_wan
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.choices import OPTIMIZERS
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import MemorySpec
from PipeTrain.nodes.memory_options import PipeTrainMemoryOptions


@pytest.fixture(scope="module")
def run_json(comfy_root, tmp_path_factory) -> dict:
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("memory-config")
    model = tiny_wan.write_model(root / "tiny_wan.safetensors")
    memory_runs.wan_config(root / "run", comfy_root, str(model), tiny_wan.write_cache(root / "data", items=1))
    return json.loads((root / "run" / "run.json").read_text())


def _with_memory(data: dict, **memory) -> dict:
    return {**data, "memory": {**data["memory"], **memory}}


@pytest.mark.parametrize("old, new", [(True, "on"), (False, "off")])
def test_run_json_with_the_old_boolean_still_loads(run_json, old, new):
    assert RunConfig.from_dict(_with_memory(run_json, activation_checkpointing=old)).memory.activation_checkpointing == new


def test_new_settings_round_trip(run_json):
    data = _with_memory(run_json, activation_checkpointing="cpu_offload", block_swap=3, compile_blocks=True,
                        expandable_segments=True, base_dtype="float8_e5m2")
    cfg = RunConfig.from_dict(data)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.memory.block_swap == 3 and cfg.memory.base_dtype == "float8_e5m2"
    assert cfg.memory.compile_mode == "default"  # run.json from before the setting
    graphs = RunConfig.from_dict(_with_memory(run_json, compile_blocks=True, compile_mode="cuda_graphs"))
    assert RunConfig.from_dict(graphs.to_dict()).memory.compile_mode == "cuda_graphs"
    assert (cfg.memory.plan, cfg.memory.vram_gib, cfg.memory.vram_margin) == ("manual", 0.0, 0.1)  # before them
    fit = RunConfig.from_dict(_with_memory(run_json, plan="fit", vram_gib=24, vram_margin=0.2))
    saved = fit.to_dict()["memory"]
    assert (saved["plan"], saved["vram_gib"], saved["vram_margin"]) == ("fit", 24.0, 0.2)
    assert RunConfig.from_dict(fit.to_dict()).memory == fit.memory and fit.memory.vram_gib == 24.0


@pytest.mark.parametrize("memory, names", [
    (dict(activation_checkpointing="sometimes"), "memory.activation_checkpointing"),
    (dict(block_swap=-1), "memory.block_swap"),
    (dict(block_swap=2, pipeline_stages=2), "memory.block_swap is 2 with pipeline_stages 2: block swap needs"),
    (dict(base_dtype="float8"), "memory.base_dtype"),
    (dict(block_swap="2"), "memory.block_swap must be a whole number"),
    (dict(compile_mode="max"), "memory.compile_mode is 'max'"),
    (dict(compile_mode="cuda_graphs"), "compile_blocks is off: turn compile_blocks on"),
    (dict(compile_mode="cuda_graphs", compile_blocks=True, block_swap=2), "cannot be used with block_swap"),
    (dict(plan="fit", pipeline_stages=2), "memory.plan is 'fit' with pipeline_stages 2"),
    (dict(vram_margin=0.9), "memory.vram_margin is 0.9"),
])
def test_bad_memory_settings_name_the_setting(run_json, memory, names):
    data = _with_memory(run_json, **memory)
    if memory.get("pipeline_stages") == 2:
        data["launch"] = {**data["launch"], "num_gpus": 2, "backend": "deepspeed"}
    with pytest.raises(ConfigError, match=names):
        RunConfig.from_dict(data)


def test_every_input_has_a_tooltip_and_new_ones_are_optional():
    inputs = PipeTrainMemoryOptions.INPUT_TYPES()
    assert set(inputs["required"]) == {"activation_checkpointing", "optimizer", "base_dtype", "pipeline_stages"}
    assert {"block_swap", "compile_blocks", "expandable_segments", "compile_mode"} <= set(inputs["optional"])
    # saved workflows store widgets by position: the fit plan's inputs came after compile_mode
    assert list(inputs["optional"])[-4:] == ["compile_mode", "plan", "vram_gib", "vram_margin"]
    for section in inputs.values():
        for name, (_, options) in section.items():
            assert len(options.get("tooltip", "")) > 40, name
    from PipeTrain.engine.config.choices import OPTIMIZER_NOTES

    tip = inputs["required"]["optimizer"][1]["tooltip"]
    for name, note in OPTIMIZER_NOTES.items():  # the optimizer engineer's cost notes
        assert name in OPTIMIZERS and note in tip


@pytest.mark.parametrize("saved, mode", [(False, "off"), (True, "on"), ("cpu_offload", "cpu_offload")])
def test_saved_workflows_with_the_old_boolean_still_validate_and_run(saved, mode):
    assert PipeTrainMemoryOptions.VALIDATE_INPUTS(activation_checkpointing=saved) is True
    (spec,) = PipeTrainMemoryOptions().configure(saved, "adamw", "auto", 1)  # optional inputs left out
    assert spec == MemorySpec(activation_checkpointing=mode)


def test_the_fit_plan_inputs_reach_the_memory_settings():
    (spec,) = PipeTrainMemoryOptions().configure("off", "adamw", "auto", 1, plan="fit", vram_gib=24, vram_margin=0.15)
    assert (spec.plan, spec.vram_gib, spec.vram_margin) == ("fit", 24.0, 0.15)
    with pytest.raises(ConfigError, match="memory.plan is 'fit' with pipeline_stages 2"):
        PipeTrainMemoryOptions().configure("off", "adamw", "auto", 2, plan="fit")


def test_node_refuses_bad_values_with_the_setting_named():
    assert "activation_checkpointing" in PipeTrainMemoryOptions.VALIDATE_INPUTS(activation_checkpointing="maybe")
    with pytest.raises(ConfigError, match="block_swap"):
        PipeTrainMemoryOptions().configure("on", "adamw", "auto", 2, block_swap=4)


def test_example_workflows_memory_nodes_are_valid():
    from pathlib import Path

    graphs = sorted((Path(__file__).parents[2] / "example_workflows").glob("**/*_api.json"))
    nodes = [n for g in graphs for n in json.loads(g.read_text()).values()
             if n.get("class_type") == "PipeTrainMemoryOptions"]
    assert nodes, graphs
    for node in nodes:
        assert PipeTrainMemoryOptions.VALIDATE_INPUTS(node["inputs"]["activation_checkpointing"]) is True
        PipeTrainMemoryOptions().configure(**node["inputs"])


def test_expandable_segments_reaches_the_ranks_environment(run_json, monkeypatch):
    from PipeTrain.engine.launch.launcher import launcher_env

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512,expandable_segments:False")
    on = RunConfig.from_dict(_with_memory(run_json, expandable_segments=True))
    env = launcher_env(on, cuda=True)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512,expandable_segments:True"
    off = RunConfig.from_dict(run_json)
    assert launcher_env(off, cuda=True)["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512,expandable_segments:False"


def test_the_compile_cache_lies_beside_the_run_folders_unless_set(run_json, monkeypatch):
    """torch.compile's cache goes next to the run folders (kept after a reboot), or where the user points it."""
    from PipeTrain.engine.launch.launcher import COMPILE_CACHE, launcher_env

    cfg = RunConfig.from_dict(run_json)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    want = os.path.join(os.path.dirname(os.path.abspath(cfg.run_dir)), COMPILE_CACHE)
    assert launcher_env(cfg, cuda=True)["TORCHINDUCTOR_CACHE_DIR"] == want
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    assert launcher_env(cfg, cuda=True)["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere"
    # torch puts its own default into the environment of a process that compiled (a ComfyUI server): not a choice
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert launcher_env(cfg, cuda=True)["TORCHINDUCTOR_CACHE_DIR"] == want
