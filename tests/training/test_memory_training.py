"""The engine's training loop with each memory option: it learns, and the LoRA equals the one trained
without the option. In-process runs (engine.train.loop.train, DeepSpeed-free backend) on the tiny Wan,
plus one real DeepSpeed launch (2 gloo ranks) with block swap + offloaded checkpointing."""
from __future__ import annotations

import pytest
import torch

import memory_runs
import tiny_wan
from engine_runs import assert_same_lora, run_to_end


@pytest.fixture(scope="module")
def wan(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("memory-wan")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield str(tiny_wan.write_model(root / "tiny_wan.safetensors")), tiny_wan.write_cache(root / "data", items=4)
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def baseline(wan, comfy_root, tmp_path_factory):
    cfg = memory_runs.wan_config(tmp_path_factory.mktemp("memory-base") / "run", comfy_root, *wan, steps=10,
                                 batch_size=4, learning_rate=1e-2)
    return memory_runs.train_in_process(cfg)


def _fell(losses: list[float]) -> bool:
    return sum(losses[-4:]) / 4 < 0.93 * sum(losses[:4]) / 4


def test_baseline_learns(baseline):
    assert _fell(baseline.losses()), baseline.losses()


@pytest.mark.parametrize("changes", [
    dict(block_swap=2),
    dict(block_swap=4, activation_checkpointing="on"),
    dict(activation_checkpointing="on"),
    dict(activation_checkpointing="cpu_offload"),
    dict(block_swap=3, activation_checkpointing="cpu_offload"),
], ids=["swap2", "swap4+on", "on", "cpu_offload", "swap3+cpu_offload"])
def test_option_trains_the_same_lora(baseline, tmp_path, changes):
    run = memory_runs.train_in_process(memory_runs.with_memory(baseline.cfg, tmp_path / "run", **changes))
    assert _fell(run.losses()), run.losses()
    # Same ops in the same order (recompute repeats the forward, swapped weights are exact copies, LoRA
    # dropout's RNG is restored by checkpointing): equal to float32 rounding after 10 Adam steps.
    assert run.losses() == pytest.approx(baseline.losses(), rel=1e-6)
    assert_same_lora(baseline.cfg.run_dir, run.cfg.run_dir, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_deepspeed_ranks_with_block_swap_and_offloaded_checkpointing(baseline, tmp_path):
    """DeepSpeed's initialise moves the whole model and broadcasts it: swapped blocks must survive that.
    2 ranks at gas 2 see the samples 1 process sees at batch 4 only with batch 2 per rank: compare
    with an in-process run of the same split."""
    ref_cfg = memory_runs.with_memory(baseline.cfg, tmp_path / "ref")
    import dataclasses

    ref_cfg = dataclasses.replace(ref_cfg, train=dataclasses.replace(ref_cfg.train, batch_size=1, grad_accum=4, steps=4))
    ref = memory_runs.train_in_process(ref_cfg)
    cfg = memory_runs.with_memory(ref_cfg, tmp_path / "ds", block_swap=3, activation_checkpointing="cpu_offload")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, grad_accum=2),
                              launch=dataclasses.replace(cfg.launch, num_gpus=2, backend="deepspeed"))
    cfg.save(tmp_path / "ds" / "run.json")
    ds = run_to_end(cfg, timeout=240)
    assert ds.of("started")[0]["world_size"] == 2
    assert ds.losses() == pytest.approx(ref.losses(), rel=1e-4, abs=1e-6)
    # allreduce vs accumulation order; Adam amplifies ~1e-7 differences (as in test_engine_training)
    assert_same_lora(ref.cfg.run_dir, ds.cfg.run_dir, rtol=1e-3, atol=1e-5)
