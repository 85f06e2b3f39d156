"""The held-out eval set (engine/train/eval_set.py) with the real engine and real gloo ranks: its numbers
repeat exactly, it never changes training, 2 ranks and a 2-stage pipeline report what 1 process
reports, the eval loss falls as the LoRA learns the set, and bad settings are refused clearly."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from engine_runs import assert_same_lora, make_config, run_all_to_end
from PipeTrain.engine.cache.reader import CachedDataset
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec
from PipeTrain.engine.config.eval import EVAL_QUANTILES, EvalSpec

pytestmark = pytest.mark.slow
FP32 = MemorySpec(base_dtype="float32")  # on a GPU 'auto' is half precision: compare like with like
LR_TOO_HIGH = 0.05  # Adam steps of this size take the tiny model's LoRA past any improvement on the first step
DROPOUT = LoraSpec(rank=4, targets="attention_mlp", dropout=0.1)  # training draws from the global RNG


def _with_eval(cfg: RunConfig, cache: str, every: int, before_start: bool = True) -> RunConfig:
    return RunConfig.from_dict(dataclasses.replace(cfg, eval=EvalSpec(cache_dir=cache, every=every,
                                                                      before_start=before_start)).to_dict())


def _evals(run) -> dict[int, dict]:
    return {e["step"]: e for e in run.of("eval")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, comfy_root, demo_base, cache_dir):
    """One process at gas 2 with and without eval (the training set as eval set); 2 ranks at gas 1
    with eval (the same samples); a 1-step run with another training seed."""
    root = tmp_path_factory.mktemp("eval_runs")

    def config(name, processes=1, grad_accum=2, **kw):
        train = {"steps": 10, "learning_rate": 4e-3, **kw}
        return make_config(root / name, comfy_root, demo_base, cache_dir, processes=processes, grad_accum=grad_accum,
                           lora=DROPOUT, memory=FP32, **train)

    names = ("plain", "one", "two", "seed1")
    runs = run_all_to_end(config("no_eval"), _with_eval(config("one"), cache_dir, every=5),
                          _with_eval(config("two", processes=2, grad_accum=1), cache_dir, every=5),
                          _with_eval(config("seed1", seed=1, steps=1), cache_dir, every=0), timeout=900)
    return dict(zip(names, runs))


def test_eval_repeats_leaves_training_unchanged_and_falls(runs, cache_dir):
    """Eval on the training set itself: the same numbers whatever the training seed, training bit for
    bit the same as without eval (losses and LoRA), and the eval loss falls as the LoRA learns."""
    one = runs["one"]
    evals = _evals(one)
    assert sorted(evals) == [0, 5, 10]
    for ev in evals.values():
        assert ev["quantiles"] == list(EVAL_QUANTILES) and len(ev["losses"]) == len(EVAL_QUANTILES)
        assert ev["loss"] == pytest.approx(sum(ev["losses"]) / len(ev["losses"]))
        assert ev["items"] == len(CachedDataset(cache_dir))
    sigmas = evals[0]["sigmas"]
    assert sigmas == sorted(sigmas) and len(set(sigmas)) == len(sigmas), "noise levels not increasing"
    # LoRA B starts at 0, so before training every seed has the base model: the eval noise is its own.
    other = _evals(runs["seed1"])
    assert sorted(other) == [0]
    assert (other[0]["loss"], other[0]["losses"]) == (evals[0]["loss"], evals[0]["losses"])

    assert one.losses() == runs["plain"].losses(), "eval changed the training losses"
    assert_same_lora(runs["plain"].cfg.run_dir, one.cfg.run_dir, rtol=0, atol=0)

    assert evals[10]["loss"] < 0.9 * evals[0]["loss"], f"eval loss did not fall: {evals[0]['loss']} -> " \
                                                       f"{evals[10]['loss']}"
    log = (Path(one.cfg.run_dir) / "train.log").read_text()
    assert "eval at step 10: loss" in log and "q0.5 (sigma" in log
    assert any(p.name.startswith("events.out") for p in (Path(one.cfg.run_dir) / "tensorboard").iterdir())


def test_two_ranks_report_what_one_process_reports(runs):
    """Each rank scores a share of the (item, noise level) pairs; the all-reduced sums equal 1 process."""
    one, two = runs["one"], runs["two"]
    assert two.of("started")[0]["world_size"] == 2
    a, b = _evals(one), _evals(two)
    assert sorted(a) == sorted(b) == [0, 5, 10]
    assert b[0]["losses"] == pytest.approx(a[0]["losses"], rel=1e-6, abs=1e-9)  # same model, other summation order
    for step in (5, 10):  # trained 2 ways (allreduce vs accumulation): float noise only
        assert b[step]["losses"] == pytest.approx(a[step]["losses"], rel=1e-3, abs=1e-6)


def test_two_stage_pipeline_reports_what_one_process_reports(tmp_path, comfy_root):
    """pipeline_stages 2 (2 gloo ranks): the eval runs through DeepSpeed's eval_batch on the stages."""
    import tiny_wan
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy
    from PipeTrain.engine.config.launch import LaunchSpec

    import_comfy(comfy_root)
    model = str(tiny_wan.write_model(tmp_path / "tiny_wan.safetensors"))
    cache = tiny_wan.write_cache(tmp_path / "data")

    def config(name, processes, stages):
        return RunConfig(run_name=name, run_dir=str(tmp_path / name), comfyui_root=comfy_root, model_path=model,
                         cache_dir=cache, lora=LoraSpec(rank=4, targets="attention_mlp"),
                         memory=MemorySpec(pipeline_stages=stages),
                         train=TrainSpec(steps=2, learning_rate=1e-3, batch_size=1, seed=1),
                         launch=LaunchSpec(num_gpus=processes), eval=EvalSpec(cache_dir=cache, every=2,
                                                                              before_start=True))

    one, piped = run_all_to_end(config("one", 1, 1), config("piped", 2, 2), timeout=900)
    a, b = _evals(one), _evals(piped)
    assert sorted(a) == sorted(b) == [0, 2]
    assert piped.losses() == pytest.approx(one.losses(), rel=1e-5, abs=1e-7)  # training untouched by the eval
    for step in (0, 2):
        assert b[step]["losses"] == pytest.approx(a[step]["losses"], rel=1e-5, abs=1e-8)


def test_quantiles_follow_the_runs_timestep_distribution():
    """The eval noise levels are quantiles of the draws training makes (range, logit-normal)."""
    from PipeTrain.engine.train.eval_set import quantile_time
    from PipeTrain.engine.train.objective import draw_time

    for method, lo, hi in (("uniform", 0.0, 1.0), ("uniform", 0.875, 1.0), ("logit_normal", 0.0, 1.0),
                           ("logit_normal", 0.0, 0.875)):
        gen = torch.Generator().manual_seed(0)
        draws = torch.tensor([draw_time(gen, method, lo, hi) for _ in range(20_000)])
        for q in EVAL_QUANTILES:
            t = quantile_time(method, q, lo, hi)
            assert lo <= t <= hi
            assert (draws <= t).float().mean().item() == pytest.approx(q, abs=0.015), (method, lo, hi, q)


def _cfg_dict(tmp_path, comfy_root, demo_base, cache_dir, eval_fields: dict) -> dict:
    cfg = make_config(tmp_path / "bad", comfy_root, demo_base, cache_dir, steps=1)
    data = json.loads(json.dumps(cfg.to_dict()))
    data["eval"].update(eval_fields)
    return data


@pytest.mark.parametrize("fields,needle", [
    ({"every": -1}, "eval_every"),
    ({"every": 10}, "connect an eval set"),
    ({"before_start": True}, "eval_cache"),
    ({"cache_dir": "/nonexistent/eval_cache", "every": 5}, "eval set's Cache Latents again"),
    ({"cache_dir": "", "every": 5, "quantiles": [0.5]}, "unknown setting"),
])
def test_bad_eval_settings_are_refused_before_launch(tmp_path, comfy_root, demo_base, cache_dir, fields, needle):
    with pytest.raises(ConfigError, match=needle):  # validation, then the file checks the node and ranks run
        RunConfig.from_dict(_cfg_dict(tmp_path, comfy_root, demo_base, cache_dir, fields)).check_files()


def test_node_refuses_an_eval_cache_of_another_vae_and_a_bad_noise_range(cache_dir):
    from PipeTrain.nodes.train_pipeline import eval_spec

    cache = CachedDataset(cache_dir).spec()
    other_vae = dataclasses.replace(cache, latent_shape=(16, *cache.latent_shape[1:]))
    with pytest.raises(ConfigError, match="eval_cache holds 16-channel latents"):
        eval_spec(other_vae, cache, every=10, before_start=True)
    assert eval_spec(None, cache, every=10, before_start=True) == EvalSpec()  # unconnected: no eval
    assert eval_spec(cache, cache, every=10, before_start=False) == EvalSpec(cache_dir=cache.cache_dir, every=10)
    with pytest.raises(ConfigError, match="eval_early_stop is 2 but Train Pipeline has no eval_cache"):
        eval_spec(None, cache, every=10, before_start=True, early_stop=2)
    with pytest.raises(ConfigError, match="eval_every above 0"):
        eval_spec(cache, cache, every=0, before_start=True, early_stop=2)
    with pytest.raises(ConfigError, match="min_t/max_t"):
        TrainSpec(min_t=0.9, max_t=0.5).validate()


def test_early_stop_ends_two_ranks_together_and_save_lora_takes_the_best_step(tmp_path, comfy_root, demo_base,
                                                                                cache_dir):
    """A learning rate that makes the LoRA worse: the eval loss never beats the base model's (step 0), so
    eval.early_stop 2 ends both ranks at step 4 of 12 as a finished run; best.json names the better of the
    two saved steps, and Save LoRA's weights 'best' copies that file."""
    from types import SimpleNamespace

    from PipeTrain.engine import best_step
    from PipeTrain.engine.lora_files import lora_step_file
    from PipeTrain.nodes.save_lora import source_file

    cfg = make_config(tmp_path / "stop", comfy_root, demo_base, cache_dir, processes=2, steps=12,
                      learning_rate=LR_TOO_HIGH, save_every=2, memory=FP32)
    cfg = RunConfig.from_dict(dataclasses.replace(cfg, eval=EvalSpec(cache_dir=cache_dir, every=2, before_start=True,
                                                                     early_stop=2)).to_dict())
    run, = run_all_to_end(cfg, timeout=600)
    evals = _evals(run)
    assert sorted(evals) == [0, 2, 4], f"not stopped after 2 evals without improvement: {sorted(evals)}"
    assert evals[2]["loss"] > evals[0]["loss"] and evals[4]["loss"] > evals[0]["loss"]
    assert [e["step"] for e in run.of("step")] == [1, 2, 3, 4]
    stop, = run.of("early_stop")
    assert stop["step"] == 4 and "best step" in stop["message"]
    done, = run.of("done")
    assert done["step"] == 4 and done["lora"].endswith("lora_final.safetensors")

    recorded = json.loads((Path(cfg.run_dir) / best_step.FILE).read_text())
    assert [e["step"] for e in recorded["history"]] == [0, 2, 4]
    better = 2 if evals[2]["loss"] <= evals[4]["loss"] else 4
    assert recorded["step"] == better
    assert recorded["file"] == (lora_step_file(2) if better == 2 else "lora_final.safetensors")
    run_result = SimpleNamespace(run_dir=cfg.run_dir, lora_path=done["lora"], run_name=cfg.run_name)
    assert source_file(run_result, "best") == Path(cfg.run_dir) / "lora" / recorded["file"]
    assert (Path(cfg.run_dir) / "lora" / recorded["file"]).is_file()
    (Path(cfg.run_dir) / best_step.FILE).unlink()
    with pytest.raises(ConfigError, match="has no eval history with a saved LoRA step"):
        source_file(run_result, "best")
