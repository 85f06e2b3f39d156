"""The eval-history bookkeeping (engine/best_step.py): best saved step, early-stop count, best.json."""
from __future__ import annotations

import json

import pytest

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.eval import EvalSpec
from PipeTrain.engine import best_step as bs


def _history(*entries):
    h = []
    for step, loss, file in entries:
        h = bs.record(h, step, loss, file)
    return h


def test_best_is_the_lowest_loss_among_saved_steps():
    h = _history((0, 1.0, None), (5, 0.4, None), (10, 0.6, "lora_000010.safetensors"),
                 (15, 0.5, "lora_000015.safetensors"), (20, 0.7, "lora_final.safetensors"))
    assert bs.best(h) == {"step": 15, "eval_loss": 0.5, "file": "lora_000015.safetensors"}  # step 5 has no file
    assert bs.best(_history((0, 1.0, None))) is None


def test_record_replaces_a_redone_step_and_keeps_order():
    h = _history((10, 0.5, "a"), (5, 0.9, None), (10, 0.3, "b"))
    assert [(e["step"], e["eval_loss"], e["file"]) for e in h] == [(5, 0.9, None), (10, 0.3, "b")]


def test_evals_without_improvement_counts_against_every_earlier_eval():
    h = _history((0, 1.0, None), (1, 0.5, None), (2, 0.6, "x"), (3, 0.5, "y"))
    assert bs.evals_without_improvement(h) == 2  # 0.5 ties the best: no improvement
    assert bs.should_stop(h, 2) and not bs.should_stop(h, 3) and not bs.should_stop(h, 0)
    assert bs.evals_without_improvement(bs.record(h, 4, 0.1, None)) == 0


def test_stop_message_names_the_step_and_best_step():
    h = _history((2, 0.5, "a"), (4, 0.6, "b"))
    assert bs.stop_message(4, 1, h) == "stopped early at step 4: no eval improvement in 1 evals, best step 2"
    h = bs.attach_file(_history((2, 0.5, None), (4, 0.6, None)), 4, "final")
    assert bs.best(h)["file"] == "final"


def test_best_json_round_trip_and_resume_cut(tmp_path):
    h = _history((5, 0.4, "a"), (10, 0.3, "b"), (15, 0.2, "c"))
    content = bs.write(tmp_path, h)
    on_disk = json.loads((tmp_path / bs.FILE).read_text())
    assert on_disk == content and (on_disk["step"], on_disk["file"]) == (15, "c")
    assert bs.read(tmp_path) == h
    assert [e["step"] for e in bs.read(tmp_path, 10)] == [5, 10]  # a resume from step 10 redoes 15
    assert bs.read(tmp_path / "nowhere") == []
    assert not list(tmp_path.glob(".*tmp*"))


@pytest.mark.parametrize("spec,needle", [
    (EvalSpec(cache_dir="c", every=5, early_stop=-1), "early_stop"),
    (EvalSpec(early_stop=2), "connect an eval set"),
    (EvalSpec(cache_dir="c", before_start=True, early_stop=2), "eval_every above 0"),
])
def test_bad_early_stop_is_refused(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        spec.validate()


def test_early_stop_zero_and_valid_pass():
    EvalSpec().validate()
    EvalSpec(cache_dir="c", every=5, early_stop=3).validate()
