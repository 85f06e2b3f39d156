"""Every image family of ComfyUI 0.3.75 (t2i, guidance-embedded and edit modes) trains a LoRA on the
engine's generic path, and the saved LoRA loads through ComfyUI's own loader (tests/family_harness.py)."""
import pytest

import family_configs as fc
import family_harness


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


@pytest.mark.parametrize("family", fc.IMAGE, ids=[f.name for f in fc.IMAGE])
def test_family_trains_and_loads_in_comfyui(comfy, family, tmp_path):
    family_harness.check(family, family_harness.run_family(family, tmp_path))
