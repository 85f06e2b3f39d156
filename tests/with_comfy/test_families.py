"""Every family of ComfyUI 0.3.75 trains a LoRA on the engine's generic path, and the saved LoRA loads
through ComfyUI's own loader (tests/family_harness.py; configs in tests/family_configs.py).

Image families: t2i, guidance-embedded and edit modes. Video families: t2v, i2v by first-frame
concat latents and CLIP vision, Wan 2.2 A14B experts on their noise ranges.
"""
import pytest

import family_configs as fc
import family_harness

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


@pytest.mark.parametrize("family", fc.IMAGE, ids=[f.name for f in fc.IMAGE])
def test_image_family_trains_and_loads_in_comfyui(comfy, family, tmp_path):
    family_harness.check(family, family_harness.run_family(family, tmp_path))


@pytest.mark.parametrize("family", fc.VIDEO, ids=[f.name for f in fc.VIDEO])
def test_video_family_trains_and_loads_in_comfyui(comfy, family, tmp_path):
    family_harness.check(family, family_harness.run_family(family, tmp_path))
