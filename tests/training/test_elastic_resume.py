"""Elastic resume: a checkpoint continues on another number of ranks (real DeepSpeed gloo ranks, CPU).

The sample order is a function of (seed, step) (engine/train/sample_order.py), so a run resumed on
another world size with the same global batch (batch_size x grad_accum x data-parallel replicas)
repeats the uninterrupted run; a resume that changes the global batch is refused unless accepted. A
pipelined run's checkpoint (per stage) also resumes data parallel (engine/train/elastic.py)."""
from __future__ import annotations

import dataclasses

import pytest

from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec
from engine_runs import EngineRun, assert_same_lora, make_config, rewound_copy, run_to_end

pytestmark = pytest.mark.slow

FP32 = MemorySpec(base_dtype="float32")  # on a GPU 'auto' is half precision: compare like with like


def _resumed_on(full: EngineRun, to, processes: int, **train):
    """A copy of `full`'s folder rewound to its step-3 checkpoint, to resume on `processes` ranks."""
    run_dir = rewound_copy(full.cfg.run_dir, to, "step000006", "step000003")
    cfg = dataclasses.replace(full.cfg, run_dir=str(run_dir), resume=True,
                              launch=dataclasses.replace(full.cfg.launch, num_gpus=processes))
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory, comfy_root, demo_base, cache_dir):
    """6 steps on 2 ranks x gas 1, a checkpoint at step 3 and 6; warmup + cosine so the schedule must resume."""
    run_dir = tmp_path_factory.mktemp("elastic") / "two"
    return run_to_end(make_config(run_dir, comfy_root, demo_base, cache_dir, processes=2, steps=6, grad_accum=1,
                                  checkpoint_every=3, scheduler="cosine", warmup_steps=2, memory=FP32))


def test_two_rank_checkpoint_resumed_on_one_rank_equals_uninterrupted(two_rank_run, tmp_path):
    """2 ranks x gas 1 resumed as 1 rank x gas 2: the same global batch, the same samples and noise."""
    resumed = run_to_end(_resumed_on(two_rank_run, tmp_path / "one", processes=1, grad_accum=2))
    started = resumed.of("started")[0]
    assert (started["step"], started["world_size"]) == (3, 1)
    assert [e["step"] for e in resumed.of("step")] == [4, 5, 6]
    assert resumed.losses() == pytest.approx(two_rank_run.losses()[3:], rel=1e-4, abs=1e-6)
    # allreduce over 2 ranks vs accumulation on one sums in another order; Adam amplifies ~1e-7 noise
    assert_same_lora(two_rank_run.cfg.run_dir, resumed.cfg.run_dir, rtol=1e-3, atol=1e-5)
    # it says so: an event and a train.log line
    (moved,) = resumed.of("world_changed")
    assert (moved["step"], moved["replicas"], moved["before"]) == (3, 1, 2)
    assert "continues on 1 data-parallel replica instead of 2" in resumed.log()
    assert not resumed.of("config_changed")  # grad_accum 1 -> 2 at half the replicas changes no result


def test_a_changed_global_batch_is_refused_unless_accepted(two_rank_run, tmp_path):
    """2 ranks x gas 1 resumed on 1 rank x gas 1 halves the global batch: refused before the model loads."""
    cfg = _resumed_on(two_rank_run, tmp_path / "half", processes=1)
    refused = EngineRun(cfg)
    assert refused.wait(timeout=300) != 0
    message = " ".join(e.get("message", "") for e in refused.of("error"))
    for text in ("global batch", "train.grad_accum", "launch.num_gpus", "4 -> 2", "accept_changes"):
        assert text in message, message
    assert not refused.of("started")

    accepted = run_to_end(dataclasses.replace(cfg, accept_changes=True))
    assert [e["step"] for e in accepted.of("step")] == [4, 5, 6]
    (logged,) = accepted.of("config_changed")
    assert [(c["before"], c["after"]) for c in logged["changes"]] == [(4, 2)]
    assert "global batch" in logged["changes"][0]["setting"]


@pytest.fixture(scope="module")
def wan_files(comfy_root, tmp_path_factory):
    """The tiny Wan model (a pipeline adapter's family) and its cache (tests/tiny_wan.py)."""
    import tiny_wan
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("tiny-wan")
    return str(tiny_wan.write_model(root / "tiny_wan.safetensors")), tiny_wan.write_cache(root / "data")


def _wan(run_dir, comfy_root: str, wan_files, stages: int, grad_accum: int, resume: bool = False) -> RunConfig:
    """4 steps of the tiny Wan model on 2 ranks, a checkpoint every 2; batch 1, warmup + cosine."""
    cfg = RunConfig(run_name=run_dir.name, run_dir=str(run_dir), comfyui_root=comfy_root, model_path=wan_files[0],
                    cache_dir=wan_files[1], lora=LoraSpec(rank=4, targets="attention_mlp"),
                    memory=MemorySpec(pipeline_stages=stages),
                    train=TrainSpec(steps=4, learning_rate=1e-3, batch_size=1, grad_accum=grad_accum, seed=1,
                                    scheduler="cosine", warmup_steps=1, checkpoint_every=2),
                    launch=LaunchSpec(num_gpus=2), resume=resume)
    cfg.validate()
    return cfg


def test_two_stage_pipeline_checkpoint_resumed_as_two_way_data_parallel(tmp_path, comfy_root, wan_files):
    """2 stages x gas 2 (1 replica) resumed as 2 replicas x gas 1 on the same 2 ranks: the same global batch."""
    full = run_to_end(_wan(tmp_path / "piped", comfy_root, wan_files, stages=2, grad_accum=2))
    run_dir = rewound_copy(full.cfg.run_dir, tmp_path / "dp", "step000004", "step000002")
    resumed = run_to_end(_wan(run_dir, comfy_root, wan_files, stages=1, grad_accum=1, resume=True))
    assert [e["step"] for e in resumed.of("step")] == [3, 4]
    assert resumed.losses() == pytest.approx(full.losses()[2:], rel=1e-4, abs=1e-6)
    assert_same_lora(full.cfg.run_dir, run_dir, rtol=1e-3, atol=1e-5)
    (moved,) = resumed.of("world_changed")
    assert (moved["replicas"], moved["before"]) == (2, 1)
