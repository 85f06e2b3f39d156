"""Manual pipeline split points (memory.pipeline_split) and activation checkpointing inside stages.

The fast tests check the validation messages and that checkpointing reaches the blocks the stage
layers run; the slow one runs 2 DeepSpeed gloo processes with a hand-placed split and
checkpointing on, and compares losses and the saved LoRA with a plain single-process run.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainable import ensure_trainable

import tiny_wan
from engine_runs import assert_same_lora, run_all_to_end
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec


@pytest.fixture(scope="module")
def wan_files(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("tiny-wan-split")
    model = tiny_wan.write_model(root / "tiny_wan.safetensors")
    return str(model), tiny_wan.write_cache(root / "data")


@pytest.mark.parametrize("split, stages, expected", [
    ("3,2", 3, "strictly increasing"),
    ("0", 2, "start at 1"),
    ("2", 3, "3 pipeline stages need 2"),
    ("2,4", 2, "2 pipeline stages need 1"),
    ("two", 2, "not a list of whole numbers"),
    ("2", 1, "pipeline_stages is 1"),
])
def test_bad_split_points_are_refused_naming_the_setting(split, stages, expected):
    with pytest.raises(ConfigError, match="memory.pipeline_split") as err:
        MemorySpec(pipeline_stages=stages, pipeline_split=split).validate()
    assert expected in str(err.value)


def test_split_points_become_stage_bounds_and_out_of_range_names_the_layer_count():
    from PipeTrain.engine.train.pipeline import stage_bounds

    MemorySpec(pipeline_stages=3, pipeline_split=" 2, 5").validate()
    assert stage_bounds(" 2, 5", 3, 8) == [0, 2, 5, 8]
    assert stage_bounds("", 3, 8) is None  # DeepSpeed cuts uniformly
    with pytest.raises(ConfigError, match=r"pipeline_split '2,8'.* 8 pipeline layers"):
        stage_bounds("2,8", 3, 8)


def test_checkpointing_applies_inside_stage_layers(wan_files):
    """With the memory engine's per-block checkpointing on, the adapter's block layers keep fewer
    saved tensors for backward and still give the same output and LoRA-free input gradient."""
    import comfy.sd

    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.memory.activation_checkpointing import enable_checkpointing
    from PipeTrain.engine.train.sample_order import SampleStream, collate
    from PipeTrain.engine.models import adapter_for
    from PipeTrain.engine.train.objective import DiffusionObjective

    def run(checkpointed: bool):
        model = comfy.sd.load_diffusion_model(wan_files[0]).model
        dataset = CachedDataset(wan_files[1])
        prepared = DiffusionObjective(model, seed=3).prepare(
            *collate(dataset, SampleStream([1] * len(dataset), 3), [0], torch.device("cpu")))
        ensure_trainable(model, prepared)  # as the engine does: before checkpointing wraps the blocks
        if checkpointed:
            enable_checkpointing(model.diffusion_model, "on")
        adapter = adapter_for(model)
        layers = adapter.layers(model)
        acts = tuple(a.requires_grad_() if a.is_floating_point() else a for a in adapter.first_stage_inputs(prepared))
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            for layer in layers:
                acts = layer(acts)
        acts.sum().backward()
        return acts.detach(), sum(saved), prepared.xt.grad

    plain_out, plain_saved, plain_grad = run(False)
    ckpt_out, ckpt_saved, ckpt_grad = run(True)
    assert torch.equal(ckpt_out, plain_out)
    torch.testing.assert_close(ckpt_grad, plain_grad)
    assert ckpt_saved < plain_saved * 0.8, f"checkpointing kept {ckpt_saved} of {plain_saved} saved elements"


def _config(run_dir: Path, comfy_root: str, wan_files, processes: int, memory: MemorySpec) -> RunConfig:
    cfg = RunConfig(run_name=run_dir.name, run_dir=str(run_dir), comfyui_root=comfy_root, model_path=wan_files[0],
                    cache_dir=wan_files[1], lora=LoraSpec(rank=4, targets="attention_mlp"), memory=memory,
                    train=TrainSpec(steps=2, learning_rate=1e-3, batch_size=1, grad_accum=2, seed=1),
                    launch=LaunchSpec(num_gpus=processes))
    cfg.validate()
    return cfg


@pytest.mark.slow
def test_manual_split_with_checkpointing_trains_like_one_plain_process(tmp_path, comfy_root, wan_files):
    # tiny Wan: layer 0 embedding, 1-4 blocks, 5 head. "2": stage 1 = embedding + block 0.
    plain, piped = run_all_to_end(
        _config(tmp_path / "plain", comfy_root, wan_files, 1, MemorySpec()),
        _config(tmp_path / "piped", comfy_root, wan_files, 2,
                MemorySpec(pipeline_stages=2, pipeline_split="2", activation_checkpointing="on")))
    log = (Path(piped.cfg.run_dir) / "train.log").read_text(errors="replace")
    assert "stage 1/2: layers 0-1 of 6 (memory.pipeline_split)" in log, "the split points were not used"
    assert "stage 2/2: layers 2-5 of 6" in log
    assert plain.losses() == pytest.approx(piped.losses(), rel=1e-5, abs=1e-7)
    assert_same_lora(plain.cfg.run_dir, piped.cfg.run_dir, rtol=1e-4, atol=1e-6)
