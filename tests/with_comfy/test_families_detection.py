"""ComfyUI's own model detection on saved tiny files, for the one family group where detection
infers every width (Wan; ENVIRONMENT.md). The other groups' detection pins full-size widths (the
smallest detectable Flux is 546 M parameters, ~35 s on this CPU): their training tests build the
same classes through comfy.supported_models directly, and the engine runs that load a file use
tests/tiny_detected.py, which replaces exactly the pinned values (checked here too). The keys a
newer host's classes require beyond the 0.3.75 recipe (tools/tiny_config.py) must be the values
the host's detection reads from the same tensors."""
import pytest
import torch

import family_configs as fc
import tiny_detected
from tools.tiny_config import PARAMS_MODELS, params_fields

pytestmark = pytest.mark.core

# dim 128: detection infers num_heads = dim // 128
_WAN = dict(fc._WAN, dim=128, ffn_dim=256, num_heads=1, num_layers=1, text_dim=4096)  # umT5 width is fixed
CASES = [  # (config, expected supported_models class, expected model_base class, image_to_video)
    (_WAN, "WAN21_T2V", "WAN21", False),
    (dict(_WAN, model_type="i2v", in_dim=36), "WAN21_I2V", "WAN21", True),
    (dict(_WAN, in_dim=48, out_dim=48), "WAN22_T2V", "WAN22", True),
    (dict(_WAN, in_dim=36), "WAN21_T2V", "WAN21", False),  # Wan 2.2 A14B i2v expert: no img_emb
]


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


@pytest.mark.slow
@pytest.mark.parametrize("config,supported,base,i2v", CASES,
                         ids=["wan21_t2v", "wan21_i2v", "wan22_5b", "wan22_a14b_i2v"])
def test_wan_files_are_detected_as_the_classes_the_family_tests_build(comfy, tmp_path, config, supported, base, i2v):
    import comfy.sd
    import comfy.supported_models as sm
    from safetensors.torch import save_file

    family = fc.Family("wan", supported, config, (), 0, "t2v")
    model = fc.build(family)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.diffusion_model.state_dict().items()}, str(path))
    loaded = comfy.sd.load_diffusion_model(str(path)).model
    assert type(loaded.model_config) is getattr(sm, supported)
    assert type(loaded).__name__ == base and loaded.image_to_video == i2v
    x = dict(loaded.diffusion_model.state_dict())
    for k, v in model.diffusion_model.state_dict().items():
        assert torch.equal(x[k].float(), v.float()), k


# Families with a parameter dataclass (Flux, Chroma, Flux 2, the HunyuanVideo class): where the host
# requires more than the recipe gives, tools/tiny_config.py fills it.
FILLED = [f for f in fc.FAMILIES if f.recipe.get("image_model") in PARAMS_MODELS]


@pytest.mark.parametrize("family", FILLED, ids=[f.name for f in FILLED])
def test_filled_keys_are_what_detection_reads_from_the_tensors(comfy, family):
    import comfy.model_detection

    config = family.config
    added = {k: v for k, v in config.items() if k not in family.recipe}
    assert set(added) <= params_fields(config["image_model"])  # only what the host's class takes
    # detection reads shapes only: the tiny state dict stands for a file (widths it pins aside)
    detected = comfy.model_detection.detect_unet_config(fc.build(family).diffusion_model.state_dict(), "")
    assert {k: detected.get(k, "<not set>") for k in added} == added


# Families whose tiny files the engine tests load through ComfyUI (tests/tiny_detected.py's pins).
LOADED = {"chroma": "Chroma", "qwen_image": "QwenImage", "omnigen2": "Omnigen2", "flux2": "Flux2", "ltxv": "LTXV",
          "z_image": "Lumina2"}  # Z-Image's tiny width is not 3840: the Lumina2 class, the same NextDiT


@pytest.mark.parametrize("name", sorted(LOADED))
def test_tiny_detected_files_load_as_the_family_models(comfy, tmp_path, monkeypatch, name):
    import comfy.model_detection
    import comfy.sd

    monkeypatch.setattr(comfy.model_detection, "detect_unet_config",
                        tiny_detected.tiny_detection(comfy.model_detection.detect_unet_config))
    family = next(f for f in fc.FAMILIES if f.name == name)
    loaded = comfy.sd.load_diffusion_model(str(tiny_detected.write_model(tmp_path / "m.safetensors", name))).model
    assert type(loaded.model_config).__name__ == LOADED[name]
    config = family.config
    assert {k: loaded.model_config.unet_config.get(k) for k in config.keys() - family.recipe.keys()} == \
        {k: config[k] for k in config.keys() - family.recipe.keys()}
    want = fc.build(family).diffusion_model.state_dict()  # write_model's seed: the same weights
    got = loaded.diffusion_model.state_dict()
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k].float(), v.float()), k
