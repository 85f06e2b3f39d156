"""Which samples each rank sees: deterministic, resumable, and the same set for N ranks as for gas N."""
import pytest

from PipeTrain.engine.train.sample_order import SampleStream, steps_for_epochs
from PipeTrain.engine.events import EventLog, EventTail
from PipeTrain.engine.train.optim import lr_multiplier


def test_every_item_once_per_epoch_with_repeats():
    stream = SampleStream([1, 2, 1], seed=3)
    epoch = [stream.item_at(p) for p in range(len(stream))]
    assert sorted(epoch) == [0, 1, 1, 2]
    again = SampleStream([1, 2, 1], seed=3)
    assert [again.item_at(p) for p in range(8)] == [stream.item_at(p) for p in range(8)]


def test_n_ranks_at_gas_1_equal_one_rank_at_gas_n():
    one = [p for m in range(2) for p in SampleStream.positions(5, m, 0, 1, grad_accum=2, batch=3)]
    two = [p for r in range(2) for p in SampleStream.positions(5, 0, r, 2, grad_accum=1, batch=3)]
    assert one == two == list(range(30, 36))


def test_steps_for_epochs():
    assert steps_for_epochs(2, samples_per_epoch=10, samples_per_step=4) == 5
    assert steps_for_epochs(0.1, samples_per_epoch=10, samples_per_step=4) == 1


@pytest.mark.parametrize("name,expected_end", [("constant", 1.0), ("linear", 0.0), ("cosine", 0.0)])
def test_lr_multiplier(name, expected_end):
    f = lr_multiplier(name, warmup=4, total=20)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == pytest.approx(1.0)
    assert f(20) == pytest.approx(expected_end, abs=1e-9)


def test_event_tail_returns_only_complete_lines(tmp_path):
    log = EventLog(tmp_path)
    tail = EventTail(tmp_path)
    log.emit("step", step=1)
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"event": "st')  # a writer mid-line
    assert [e["step"] for e in tail.read_new()] == [1]
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('ep", "step": 2}\n')
    assert [e["step"] for e in tail.read_new()] == [2]
    assert EventTail(tmp_path, start_at_end=True).read_new() == []
