"""The other image and video classes of ComfyUI 0.33.0's supported_models train a LoRA on the engine's
generic path, with no code of their own in PipeTrain (configs in tests/family_configs_033_more.py;
docs/supported-models.md lists the classes that do not train and why). The tests are those of
tests/with_comfy/test_families_033.py: training through tests/family_harness.py (the loss falls,
checkpointed gradients equal plain ones, the LoRA loads back through ComfyUI's loader), and the
forwards the probe picks giving upstream's training-mode output. A host without the class skips.
"""
import pytest

import family_configs_033_more as more
import test_families_033 as t33
from test_families_033 import _probe_each_mode, comfy  # noqa: F401 (fixtures)

pytestmark = pytest.mark.core


@pytest.mark.parametrize("family", more.FAMILIES, ids=[f.name for f in more.FAMILIES])
def test_family_trains_and_loads_in_comfyui(comfy, family, tmp_path):  # noqa: F811 (the fixture)
    t33.test_family_trains_and_loads_in_comfyui(comfy, family, tmp_path)


@pytest.mark.parametrize("family", more.FAMILIES, ids=[f.name for f in more.FAMILIES])
def test_the_forwards_the_probe_picks_give_upstreams_output(comfy, family):  # noqa: F811
    t33.test_the_forwards_the_probe_picks_give_upstreams_output(comfy, family)


@pytest.mark.parametrize("family,chosen", more.PATCHED, ids=[f.name for f, _ in more.PATCHED])
def test_in_place_blocks_train_only_with_our_out_of_place_forwards(comfy, family, chosen, monkeypatch):  # noqa: F811
    """PixelDiT's and LTXAV's blocks modify tensors autograd saved: the probe picks PipeTrain's out-of-place
    forwards for each block class; with those left out it refuses each class by name, before any step."""
    import family_configs as fc
    from PipeTrain.engine.patches import fixes
    from PipeTrain.engine.patches.trainable import UnsafeBlock
    from trainable import make_trainable

    t33._require(family)
    assert make_trainable(fc.build(family), *fc.batch(family)) == chosen
    fixes.uninstall_all()
    ours = {name for names in chosen.values() for name in names.split(" + ")}
    everything = fixes.all_fixes()
    monkeypatch.setattr(fixes, "all_fixes", lambda: [f for f in everything if f.name not in ours])
    with pytest.raises(UnsafeBlock) as refused:
        make_trainable(fc.build(family), *fc.batch(family))
    for name in chosen:
        assert f"{name} cannot be trained" in str(refused.value)
    assert "modified by an inplace operation" in str(refused.value)


def test_hidream_o1_has_no_block_list_the_engine_finds(comfy):  # noqa: F811
    """HiDream-O1's transformer layers sit two levels down (language_model.layers): the generic path
    finds no block list, so the default LoRA preset matches nothing and says so."""
    import family_configs as fc
    from PipeTrain.engine.config.checks import ConfigError
    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.memory.blocks import block_roots
    from PipeTrain.engine.train.lora import inject_lora

    t33._require(more.HIDREAM_O1)
    dm = fc.build(more.HIDREAM_O1).diffusion_model
    assert block_roots(dm) == [] and len(dm.language_model.layers) == 2
    with pytest.raises(ConfigError, match="matched no linear layer"):
        inject_lora(dm, LoraSpec(rank=4))
