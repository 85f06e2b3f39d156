"""The default stage cut of the transformer adapters (engine/train/pipeline.py default_bounds): DeepSpeed's
equal layer counts, except where that would leave a stage with the embedding or the head alone."""
from __future__ import annotations

import pytest
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.train.pipeline import default_bounds


def _stages(parts):
    return [list(range(a, b)) for a, b in zip(parts, parts[1:])]


@pytest.mark.parametrize("stages,layers", [(2, 59), (2, 42), (8, 42), (4, 12), (2, 6)])
def test_equal_layer_counts_where_every_stage_gets_a_block(stages, layers):
    from deepspeed.runtime.utils import partition_uniform

    parts = default_bounds("uniform", stages, layers)
    assert parts == list(partition_uniform(layers, stages))
    assert parts[0] == 0 and parts[-1] == layers


@pytest.mark.parametrize("stages,layers", [(8, 10), (4, 6), (3, 5)])
def test_blocks_shared_out_when_the_head_or_embedding_would_stand_alone(stages, layers):
    from deepspeed.runtime.utils import partition_uniform

    lone = [s for s in _stages(list(partition_uniform(layers, stages))) if s in ([0], [layers - 1])]
    assert lone, "the case must be one where DeepSpeed's uniform cut leaves a layer alone"
    parts = default_bounds("uniform", stages, layers)
    cut = _stages(parts)
    assert len(cut) == stages and sum(cut, []) == list(range(layers))
    blocks = range(1, layers - 1)
    assert all(any(i in blocks for i in stage) for stage in cut), cut
    sizes = [sum(i in blocks for i in stage) for stage in cut]
    assert max(sizes) - min(sizes) <= 1, sizes


def test_more_stages_than_blocks_is_refused_and_parameters_cut_is_left_to_deepspeed():
    with pytest.raises(ConfigError, match="at most 6 stages"):
        default_bounds("uniform", 8, 8)
    assert default_bounds("parameters", 2, 59) is None
