"""Batch size per resolution (LoadDataset's batch_sizes, engine/data/batch_sizes.py): the setting and its
refusals, which items get which size, and the sample stream of runs of different lengths
(engine/train/sample_order.py), which with one size everywhere is the stream of before."""
from __future__ import annotations

import pytest

from pack import load_pack

load_pack()
import PipeTrain.nodes.load_dataset as load_node  # noqa: E402
from PipeTrain.engine.config.checks import ConfigError  # noqa: E402
from PipeTrain.engine.data.batch_sizes import check_varied_batches, item_batches, parse_batch_sizes  # noqa: E402
from PipeTrain.engine.data.messages import DatasetError  # noqa: E402
from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec  # noqa: E402
from PipeTrain.engine.train.sample_order import SampleStream  # noqa: E402

pytestmark = pytest.mark.core  # also on ComfyUI 0.33
SPEC = DatasetSpec(folders=(FolderSpec("/data/set"),), resolution=512, extra_resolutions=(1024,),
                   aspect_ratios=(1.0, 2.0))


def test_the_setting_is_parsed_kept_in_json_and_bad_values_name_the_fix(tmp_path):
    assert parse_batch_sizes("512:4, 1024:1") == ((512, 4), (1024, 1)) and parse_batch_sizes(" ") == ()
    spec = DatasetSpec.from_dict({**SPEC.to_dict(), "batch_sizes": [[512, 4], [1024, 1]]})
    assert spec.batch_sizes == ((512, 4), (1024, 1)) and spec.to_dict()["batch_sizes"] == [[512, 4], [1024, 1]]
    assert "batch_sizes" not in SPEC.to_dict()  # unset: the JSON (and trust_cache's comparison) as before
    with pytest.raises(DatasetError, match="write resolution:batch pairs, e.g. '512:4, 1024:1'"):
        parse_batch_sizes("512=4, big")
    (tmp_path / "a.png").write_bytes(b"")  # never read: the setting is refused first
    with pytest.raises(DatasetError, match=r"batch_sizes sets 768:2, but the dataset trains at 512 only: give a batch "
                                           r"size for one of those, or add 768 to extra_resolutions"):
        load_node.PipeTrainLoadDataset().load(folders=str(tmp_path), resolution=512, repeats=1, batch_sizes="768:2")
    with pytest.raises(DatasetError, match="sets resolution 512 twice"):
        DatasetSpec.from_dict({**SPEC.to_dict(), "batch_sizes": [[512, 4], [512, 2]]}).check()
    with pytest.raises(DatasetError, match="use a batch size from 1 to"):
        DatasetSpec.from_dict({**SPEC.to_dict(), "batch_sizes": [[512, 0]]}).check()
    with pytest.raises(ConfigError, match="set pipeline_stages to 1, or clear batch_sizes"):
        check_varied_batches(True, 2)
    check_varied_batches(True, 1)
    check_varied_batches(False, 4)


def test_each_item_gets_the_batch_size_of_the_resolution_it_is_cached_at():
    dataset = {**SPEC.to_dict(), "batch_sizes": [[512, 4], [1024, 1]]}
    sizes = [(512, 512), (704, 384), (1024, 1024), (1472, 704), (640, 640)]
    assert item_batches(dataset, sizes) == [4, 4, 1, 1, 0]  # a size of no resolution: the run's batch_size
    assert item_batches({**dataset, "batch_sizes": [[1024, 2]]}, sizes) == [0, 0, 2, 2, 0]
    assert item_batches(SPEC.to_dict(), sizes) == [0] * 5  # unset (or a cache made before it existed)


def _epoch(stream: SampleStream, epoch: int) -> list[int]:
    return [stream.item_at(epoch * len(stream) + p) for p in range(len(stream))]


def test_one_batch_size_everywhere_gives_the_stream_of_before():
    repeats, buckets = [1, 2, 1, 3, 1], ["a", "a", "b", "b", "a"]
    before = SampleStream(repeats, seed=5, buckets=buckets, batch=2)
    for batches in ([0] * 5, [2] * 5, [2, 0, 2, 0, 0]):
        now = SampleStream(repeats, seed=5, buckets=buckets, batch=2, batches=batches)
        assert not now.varied and len(now) == len(before)
        assert [now.item_at(p) for p in range(60)] == [before.item_at(p) for p in range(60)]
        assert [now.micro_positions(s, m, r, 2, 2) for s in range(3) for m in range(2) for r in range(2)] == \
            [SampleStream.positions(s, m, r, 2, 2, 2) for s in range(3) for m in range(2) for r in range(2)]
    assert before.steps_for_epochs(2, 2, 1, 1) == 8 == 2 * len(before) // 2  # by samples, as before


def test_runs_of_different_sizes_one_per_micro_step_each_item_by_its_repeats():
    # items 0-3 at 512 (batch 3), items 4-5 at 1024 (batch 1); item 1 repeated twice
    repeats, buckets = [1, 2, 1, 1, 1, 1], ["s512"] * 4 + ["s1024"] * 2
    batches = [3, 3, 3, 3, 1, 1]
    stream = SampleStream(repeats, seed=9, buckets=buckets, batch=2, batches=batches)
    assert stream.varied and stream.runs_per_epoch == 2 + 2  # 5 samples at 512 -> 2 runs of 3 (one filled)
    assert stream.steps_for_epochs(1, 2, 1, 2) == 2  # 4 runs, one per micro step, 2 replicas
    for epoch in range(3):
        runs = [stream.micro_positions(s, 0, 0, 1, 1) for s in range(epoch * 4, epoch * 4 + 4)]
        assert sorted(len(r) for r in runs) == [1, 1, 3, 3]
        items = [[stream.item_at(p) for p in run] for run in runs]
        for run in items:  # one bucket per micro-batch, at its own size
            assert {buckets[i] for i in run} == {"s512"} and len(run) == 3 or len(run) == 1 and run[0] >= 4
        flat = [i for run in items for i in run]
        assert all(flat.count(i) >= r for i, r in enumerate(repeats)) and flat == _epoch(stream, epoch)
    # a pure function of (seed, step): another stream, and N ranks at gas 1 = one rank at gas N
    again = SampleStream(repeats, seed=9, buckets=buckets, batch=2, batches=batches)
    one = [again.micro_positions(s, m, 0, 1, 2) for s in range(4) for m in range(2)]
    two = [stream.micro_positions(s, 0, r, 2, 1) for s in range(4) for r in range(2)]
    assert one == two
    assert [again.item_at(p) for p in range(40)] == [stream.item_at(p) for p in range(40)]
    other = SampleStream(repeats, seed=10, buckets=buckets, batch=2, batches=batches)
    assert [other.item_at(p) for p in range(40)] != [stream.item_at(p) for p in range(40)]


def test_the_headless_cache_config_takes_batch_sizes_and_refuses_bad_ones(tmp_path):
    from headless_config import cache_config_error

    error = cache_config_error(tmp_path)
    assert "dataset: batch_sizes sets 768:2, but the dataset trains at 64 only" in error(batch_sizes=[[768, 2]])
    assert "dataset.batch_sizes must be a list of [resolution, batch] pairs" in error(batch_sizes="64:2")
    assert "no VAE" in error(batch_sizes=[[64, 2]])  # good: the next missing setting is the VAE
