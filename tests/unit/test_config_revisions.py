"""The run's config revisions (engine/config/revisions.py): what a resume may change, what it may not."""
from __future__ import annotations

import json

import pytest

from PipeTrain.engine.config import global_batch
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.revisions import check_resume, record, result_changes, revisions

BASE = {"run_name": "r", "run_dir": "/a/r", "model_path": "/models/flux.safetensors",
        "cache_dir": "/data/.pipetrain_cache/0123456789abcdef", "resume": False,
        "lora": {"rank": 16, "alpha": 0.0, "dropout": 0.0},
        "train": {"steps": 100, "learning_rate": 1e-3, "seed": 0, "checkpoint_every": 10},
        "memory": {"optimizer": "adamw", "activation_checkpointing": "off"},
        "sample": {"every": 0}, "launch": {"num_gpus": 1}}


def changed(**sections):
    out = json.loads(json.dumps(BASE))
    for key, value in sections.items():
        section, _, name = key.partition("__")
        if name:
            out[section][name] = value
        else:
            out[section] = value
    return out


def test_the_issue_case_lists_every_changed_setting(tmp_path):
    record(tmp_path, BASE, 0)
    new = changed(lora__alpha=64.0, lora__dropout=0.5, train__learning_rate=0.05)
    with pytest.raises(ConfigError) as e:
        check_resume(tmp_path, new)
    for text in ("lora.alpha: 0.0 -> 64.0", "lora.dropout: 0.0 -> 0.5", "train.learning_rate: 0.001 -> 0.05",
                 "accept_changes"):
        assert text in str(e.value)


def test_another_dataset_is_a_change_a_moved_folder_is_not(tmp_path):
    record(tmp_path, BASE, 0)
    assert check_resume(tmp_path, changed(cache_dir="/mnt/copy/.pipetrain_cache/0123456789abcdef",
                                          model_path="/other/models/flux.safetensors", run_dir="/b/r")) == []
    with pytest.raises(ConfigError, match="cache_dir: '0123456789abcdef' -> 'fedcba9876543210'"):
        check_resume(tmp_path, changed(cache_dir="/data/.pipetrain_cache/fedcba9876543210"))


def test_longer_runs_other_gpus_samples_and_checkpointing_are_fine(tmp_path):
    record(tmp_path, changed(train__grad_accum=2), 0)
    assert check_resume(tmp_path, changed(train__steps=500, train__checkpoint_every=50, launch={"num_gpus": 2},
                                          train__grad_accum=1, sample={"every": 10},
                                          memory__activation_checkpointing="on", resume=True)) == []


def test_another_gpu_count_must_keep_the_global_batch(tmp_path):
    """engine/config/global_batch.py: grad_accum is judged by batch_size x grad_accum x replicas."""
    record(tmp_path, changed(launch={"num_gpus": 2}), 0)  # 2 GPUs at grad_accum 1
    assert check_resume(tmp_path, changed(train__grad_accum=2)) == []  # 1 GPU at 2: the same samples per step
    with pytest.raises(ConfigError, match=r"global batch \(train\.batch_size x train\.grad_accum x .*launch\.num_gpus.*"
                                          r"\): 2 -> 1\. To resume on another number of GPUs"):
        check_resume(tmp_path, BASE)  # 1 GPU at grad_accum 1: half the batch
    with pytest.raises(ConfigError, match=r"train\.grad_accum.*: 2 -> 6"):
        check_resume(tmp_path, changed(launch={"num_gpus": 2}, train__grad_accum=3))  # same GPUs, other grad_accum
    assert check_resume(tmp_path, {**BASE, "accept_changes": True}) == [(global_batch.NAME, 2, 1)]
    # the replicas the engine counted win over the config's launch settings, at both starts
    record(tmp_path, BASE, 4, replicas=4)
    assert check_resume(tmp_path, changed(train__grad_accum=4)) == []
    assert check_resume(tmp_path, BASE, replicas=4) == []
    # nodes known only from a hostfile: grad_accum is compared as any setting
    hosts = {"num_gpus": 2, "cluster": {"hostfile": "hosts"}}
    record(tmp_path, changed(launch=hosts, train__grad_accum=1), 8)
    with pytest.raises(ConfigError, match=r"train\.grad_accum: 1 -> 2"):
        check_resume(tmp_path, changed(launch=hosts, train__grad_accum=2))


def test_accepted_changes_are_returned_and_every_start_is_kept(tmp_path):
    assert check_resume(tmp_path, BASE) == []  # a run that never started has nothing to differ from
    record(tmp_path, BASE, 0)
    new = {**changed(train__learning_rate=5e-4), "accept_changes": True}
    assert check_resume(tmp_path, new) == [("train.learning_rate", 1e-3, 5e-4)]
    record(tmp_path, new, 40)
    assert [p.name for p in revisions(tmp_path)] == ["rev0001.json", "rev0002.json"]
    assert json.loads(revisions(tmp_path)[0].read_text())["config"]["train"]["learning_rate"] == 1e-3
    assert check_resume(tmp_path, {**new, "accept_changes": False}) == []  # compared with the newest start


def test_result_changes_ignores_equal_values():
    assert result_changes(BASE, json.loads(json.dumps(BASE))) == []


def test_a_caption_dropout_changed_in_the_same_cache_is_a_change(tmp_path):
    """caption_dropout lives in the cache's manifest, not in run.json, and leaves the cache folder (the
    dataset fingerprint) as it was: each revision keeps it, and a resume that finds another value is refused,
    naming where it is set; revisions kept before it have none and compare nothing."""
    cache = tmp_path / "cache" / "0123456789abcdef"
    cache.mkdir(parents=True)

    def manifest(dropout):
        (cache / "manifest.json").write_text(json.dumps({"dataset": {"caption_dropout": dropout}}))

    config = {**BASE, "cache_dir": str(cache)}
    run = tmp_path / "run"
    manifest(0.25)
    rev = record(run, config, 0)
    assert json.loads(rev.read_text())["cache"] == {"caption_dropout": 0.25}
    assert check_resume(run, config) == []
    manifest(0.5)
    with pytest.raises(ConfigError, match=r"cache.caption_dropout \(LoadDataset's caption_dropout, kept in the "
                                          r"cache\): 0.25 -> 0.5"):
        check_resume(run, config)
    assert check_resume(run, {**config, "accept_changes": True}) == [("cache.caption_dropout", 0.25, 0.5)]
    old = json.loads(rev.read_text())
    del old["cache"]
    rev.write_text(json.dumps(old))  # a revision from before the cache's settings were kept
    assert check_resume(run, config) == []


def test_batch_sizes_and_a_chained_cache_changed_between_starts_are_changes(tmp_path):
    """batch_sizes (LoadDataset's batch size per resolution) lives in the cache's manifest like caption_dropout,
    and so do the settings of every chained dataset's cache (more_cache_dirs)."""
    first, second = tmp_path / "a" / "0123456789abcdef", tmp_path / "b" / "fedcba9876543210"

    def manifest(folder, **dataset):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "manifest.json").write_text(json.dumps({"dataset": dataset}))

    manifest(first, caption_dropout=0.0)
    manifest(second, caption_dropout=0.1)
    config = {**BASE, "cache_dir": str(first), "more_cache_dirs": [str(second)]}
    run = tmp_path / "run"
    rev = record(run, config, 0)
    assert json.loads(rev.read_text())["cache"] == {"caption_dropout": 0.0, "dataset2": {"caption_dropout": 0.1}}
    assert check_resume(run, config) == []
    manifest(first, caption_dropout=0.0, batch_sizes=[[512, 4]])
    manifest(second, caption_dropout=0.2)
    with pytest.raises(ConfigError, match=r"cache.batch_sizes \(LoadDataset's batch_sizes, kept in the cache\): "
                                          r"\[\] -> \[\[512, 4\]\]"):
        check_resume(run, config)
    assert check_resume(run, {**config, "accept_changes": True}) == [
        ("cache.batch_sizes", [], [[512, 4]]), ("cache.dataset2.caption_dropout", 0.1, 0.2)]
