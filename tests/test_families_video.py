"""Every video family of ComfyUI 0.3.75 (t2v, i2v by first-frame concat latents and CLIP vision,
Wan 2.2 A14B experts on their noise ranges) trains a LoRA on the
engine's generic path, and the saved LoRA loads through ComfyUI's own loader (tests/family_harness.py)."""
import pytest

import family_configs as fc
import family_harness


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


@pytest.mark.parametrize("family", fc.VIDEO, ids=[f.name for f in fc.VIDEO])
def test_family_trains_and_loads_in_comfyui(comfy, family, tmp_path):
    family_harness.check(family, family_harness.run_family(family, tmp_path))
