"""Issue 9's CPU part: 4 DeepSpeed gloo processes as a pipeline x data-parallel grid.

Per optimizer step, a single process with grad_accum 4 sees stream positions 4s..4s+3; a grid of 2
data-parallel replicas with grad_accum 2 sees exactly the same samples (SampleStream.positions), so
both grids below must train like one plain process: losses within rel 1e-5, saved LoRA within
rtol 1e-4 / atol 1e-6 (only float summation order differs). Slow: 4 processes on a small machine.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tiny_wan
from engine_runs import final_lora, run_to_end
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec


@pytest.fixture(scope="module")
def wan_files(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("tiny-wan-grid")
    model = tiny_wan.write_model(root / "tiny_wan.safetensors")
    return str(model), tiny_wan.write_cache(root / "data")


def _run(run_dir: Path, comfy_root: str, wan_files, processes: int, memory: MemorySpec, grad_accum: int):
    cfg = RunConfig(run_name=run_dir.name, run_dir=str(run_dir), comfyui_root=comfy_root, model_path=wan_files[0],
                    cache_dir=wan_files[1], lora=LoraSpec(rank=4, targets="attention_mlp"), memory=memory,
                    train=TrainSpec(steps=2, learning_rate=1e-3, batch_size=1, grad_accum=grad_accum, seed=1),
                    launch=LaunchSpec(num_gpus=processes))
    cfg.validate()
    return run_to_end(cfg, timeout=600)


@pytest.mark.slow
def test_four_process_grids_train_like_one_process(tmp_path, comfy_root, wan_files):
    plain = _run(tmp_path / "plain", comfy_root, wan_files, 1, MemorySpec(), 4)
    # tiny Wan has 6 pipeline layers (embedding, 4 blocks, head); every stage needs a LoRA'd block.
    grids = {"2 stages x 2 replicas": _run(tmp_path / "pp2dp2", comfy_root, wan_files, 4,
                                           MemorySpec(pipeline_stages=2), 2),
             "4 stages x 1 replica": _run(tmp_path / "pp4", comfy_root, wan_files, 4,
                                          MemorySpec(pipeline_stages=4, pipeline_split="2,3,4"), 4)}
    reference = final_lora(plain.cfg.run_dir)
    for name, run in grids.items():
        layout = run.of("started")[0]["ranks"]
        stages = {r["stage"] for r in layout}
        replicas = {r["replica"] for r in layout}
        assert len(stages) * len(replicas) == 4, f"{name}: ranks laid out as {layout}"
        assert plain.losses() == pytest.approx(run.losses(), rel=1e-5, abs=1e-7), name
        lora = final_lora(run.cfg.run_dir)
        assert lora.keys() == reference.keys(), f"{name}: the saved LoRA misses some stage's weights"
        for k in reference:
            torch.testing.assert_close(lora[k], reference[k], rtol=1e-4, atol=1e-6, msg=f"{name}: {k}")
