"""The EMA of the LoRA weights (engine/train/ema.py) and its settings (train.ema_decay, ema_start_step):
the update formula by hand, the start step, its state, the refused values, the resume rule, the file
names and SaveLoRA's choice of weights. The gradient norm's helper (engine/train/grad_norm.py)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.revisions import result_changes
from PipeTrain.engine.config.sections import TrainSpec
from PipeTrain.engine.lora_files import ema_file, is_ema_file
from PipeTrain.engine.train.ema import EMA_FILE, WeightEma, ema_update, start_ema, write_state
from PipeTrain.engine.train.grad_norm import last_grad_norm, total_norm


def test_the_update_is_decay_times_the_average_plus_the_rest_times_the_weights():
    average = torch.tensor([1.0, 2.0, -4.0])
    ema_update(average, torch.tensor([3.0, 2.0, 0.0]), 0.75)
    assert average.tolist() == [1.5, 2.0, -3.0]  # 0.75 * 1 + 0.25 * 3, ..., 0.75 * -4 + 0.25 * 0
    ema_update(average, torch.tensor([0.0, 0.0, 0.0], dtype=torch.bfloat16), 0.5)  # weights in bf16: fp32 average
    assert average.dtype == torch.float32 and average.tolist() == [0.75, 1.0, -1.5]


def test_up_to_the_start_step_the_copy_is_the_weights_then_it_averages():
    w = torch.nn.Parameter(torch.tensor([0.0, 8.0]))
    ema = WeightEma({"a.lora_A.default.weight": w}, decay=0.5, start_step=2)
    for step, value in ((1, [2.0, 4.0]), (2, [4.0, 0.0]), (3, [8.0, 2.0]), (4, [0.0, 0.0])):
        with torch.no_grad():
            w.copy_(torch.tensor(value))
        ema.update(step)
    # step 2: the weights [4, 0]; step 3: 0.5 * [4, 0] + 0.5 * [8, 2] = [6, 1]; step 4: 0.5 * [6, 1] = [3, 0.5]
    assert ema.tensors()["a.lora_A.default.weight"].tolist() == [3.0, 0.5]
    from_zero = WeightEma({"w": torch.nn.Parameter(torch.tensor([2.0]))}, decay=0.5, start_step=0)
    from_zero.params["w"].data.fill_(4.0)
    from_zero.update(1)  # start 0: the first step averages with the untrained weights
    assert from_zero.tensors()["w"].tolist() == [3.0]


def test_the_state_goes_to_a_checkpoint_and_back(tmp_path):
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    ema = WeightEma({"w": w}, decay=0.9, start_step=0)
    ema.average["w"].fill_(7.0)
    write_state(tmp_path / "step000004", ema.tensors())
    assert (tmp_path / "step000004" / EMA_FILE).is_file()
    assert not [p for p in (tmp_path / "step000004").iterdir() if p.name.startswith(".")]  # no temp file left
    events = SimpleNamespace(seen=[], emit=lambda kind, **f: events.seen.append((kind, f)))
    train = TrainSpec(ema_decay=0.9)
    again = start_ema(train, {"w": w}, tmp_path / "step000004", 4, events)
    assert again.tensors()["w"].tolist() == [7.0, 7.0] and events.seen == []
    fresh = start_ema(train, {"w": w}, tmp_path / "other", 4, events)  # a checkpoint without EMA: from the weights
    assert fresh.tensors()["w"].tolist() == [1.0, 2.0]
    assert events.seen[0][0] == "warning" and "starts from the weights of step 4" in events.seen[0][1]["message"]
    assert start_ema(TrainSpec(), {"w": w}, None, 0, events) is None
    with pytest.raises(ValueError, match="has no v .*other LoRA targets"):
        start_ema(train, {"w": w, "v": w}, tmp_path / "step000004", 4, events)


@pytest.mark.parametrize("decay,start,needle", [
    (1.0, 0, "ema_decay is 1.0: use 0 .* below 1 such as 0.999"), (-0.1, 0, "ema_decay is -0.1"),
    (0.99, -1, "ema_start_step is -1: use 0"), (0.0, 50, "ema_start_step is 50 but ema_decay is 0"),
])
def test_bad_ema_settings_are_refused_with_the_fix(decay, start, needle):
    with pytest.raises(ConfigError, match=needle):
        TrainSpec(ema_decay=decay, ema_start_step=start).validate()
    TrainSpec(ema_decay=0.999, ema_start_step=100).validate()


def test_ema_settings_changed_on_resume_are_changes_also_for_runs_from_before_them():
    before = {"train": {"steps": 10, "learning_rate": 1e-3}}  # a run.json from before the EMA settings
    assert result_changes(before, {"train": {"steps": 20, "learning_rate": 1e-3, "ema_decay": 0.0,
                                             "ema_start_step": 0}}) == []
    assert result_changes(before, {"train": {"steps": 20, "ema_decay": 0.99, "ema_start_step": 0}}) == [
        ("train.ema_decay", 0.0, 0.99)]
    on = {"train": {"ema_decay": 0.99, "ema_start_step": 5}}
    assert result_changes(on, {"train": {"ema_decay": 0.999, "ema_start_step": 5}}) == [
        ("train.ema_decay", 0.99, 0.999)]


def test_ema_files_are_named_beside_the_plain_ones():
    assert ema_file("/r/lora/lora_final.safetensors").name == "lora_final_ema.safetensors"
    assert ema_file("lora_step000100.safetensors").name == "lora_step000100_ema.safetensors"
    assert is_ema_file("lora_step000100_ema.safetensors") and not is_ema_file("lora_final.safetensors")


def test_save_lora_copies_the_chosen_weights_and_says_how_to_get_missing_ones(tmp_path):
    from PipeTrain.nodes.runs import RunResult
    from PipeTrain.nodes.save_lora import PipeTrainSaveLoRA, source_file

    plain = tmp_path / "lora_final.safetensors"
    plain.write_bytes(b"x")
    run = RunResult(run_dir=str(tmp_path), run_name="r", lora_path=str(plain), steps=1, total_steps=1,
                    final_loss=0.1, model_name="m", status="done")
    assert source_file(run, "plain") == plain
    with pytest.raises(ConfigError, match="kept no EMA weights .*set weights to 'plain', or train with Train "
                                          "Pipeline's ema_decay"):
        source_file(run, "ema")
    ema_file(plain).write_bytes(b"y")
    assert source_file(run, "ema") == ema_file(plain)
    with pytest.raises(ConfigError, match="weights is 'newest'"):
        source_file(run, "newest")
    optional = PipeTrainSaveLoRA.INPUT_TYPES()["optional"]
    # weights was appended after strength; model_low_noise (Wan 2.2 experts) after it
    assert list(optional)[-2:] == ["weights", "model_low_noise"] and optional["weights"][1]["default"] == "plain"


def test_the_gradient_norm_is_over_every_gradient_as_one_vector():
    a, c = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))  # lora.dtype bfloat16: summed in fp32
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0], dtype=torch.bfloat16)
    assert total_norm([a, b, c]).item() == 5.0  # c has no gradient: zero
    assert total_norm([c]).item() == 0.0
    assert last_grad_norm(SimpleNamespace(pipetrain_grad_norm=torch.tensor(2.5))) == 2.5
    assert math.isnan(last_grad_norm(SimpleNamespace()))
