"""ComfyUI's own model detection on saved tiny files, for the one family group where detection
infers every width (Wan; ENVIRONMENT.md). The other groups' detection pins full-size widths (the
smallest detectable Flux is 546 M parameters, ~35 s on this CPU), so they have no detection test:
their training tests build the same classes through comfy.supported_models directly."""
import pytest
import torch

import family_configs as fc

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
    from PipeTrain.engine.comfy_bootstrap import import_comfy

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
