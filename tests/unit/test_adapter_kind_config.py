"""lora.kind and lora.lokr_factor (engine/train/adapter_kinds.py): refused with the fix when wrong, carried
through run.json and the Configure LoRA node; the one test for trained adapter weights."""
import re

import pytest

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec

pytestmark = pytest.mark.core


@pytest.mark.parametrize("spec,needle", [
    (LoraSpec(kind="lycoris"), "lora.kind is 'lycoris': choose one of lora, loha, lokr, dora"),
    (LoraSpec(kind="lokr", lokr_factor=0), "lora.lokr_factor is 0: use -1 (automatic)"),
    (LoraSpec(kind="loha", dropout=0.05), "kind 'loha' has no input dropout: set dropout to 0"),
])
def test_bad_adapter_settings_are_refused_with_the_fix(spec, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        spec.validate()


@pytest.mark.parametrize("kind", ["lora", "loha", "lokr", "dora"])
def test_every_kind_validates_and_survives_run_json(kind):
    spec = LoraSpec(kind=kind, lokr_factor=4, dropout=0.1 if kind in ("lora", "dora") else 0.0)
    spec.validate()
    data = RunConfig(run_name="r", run_dir="x", comfyui_root="c", model_path="m", cache_dir="d", lora=spec).to_dict()
    assert RunConfig.from_dict(data).lora == spec


def test_configure_lora_node_passes_the_kind_and_defaults_to_lora():
    from PipeTrain.nodes.configure_lora import PipeTrainConfigureLoRA

    node = PipeTrainConfigureLoRA()
    optional = PipeTrainConfigureLoRA.INPUT_TYPES()["optional"]
    assert optional["adapter"][0] == ["lora", "loha", "lokr", "dora", "full"] and optional["adapter"][1]["tooltip"]
    (plain,) = node.configure(16, 0.0, 0.0, "attention", "", "none", "float32")
    assert plain.kind == "lora" and plain.lokr_factor == -1
    (lokr,) = node.configure(16, 0.0, 0.0, "attention", "", "none", "float32", adapter="lokr", lokr_factor=8)
    assert (lokr.kind, lokr.lokr_factor) == ("lokr", 8)
    with pytest.raises(ConfigError, match="no input dropout"):
        node.configure(16, 0.0, 0.05, "attention", "", "none", "float32", adapter="lokr")


def test_adapter_weights_of_every_kind_are_found_and_nothing_else():
    from PipeTrain.engine.train.adapter_kinds import comfy_key, is_adapter_param

    trained = ["blocks.0.attn.q.lora_A.default.weight", "blocks.0.attn.q.lora_magnitude_vector.default.weight",
               "blocks.0.mlp.0.hada_w2_b.default", "single_blocks.1.linear1.lokr_w1.default"]
    frozen = ["blocks.0.attn.q.base_layer.weight", "blocks.0.adaln_lora.1.weight", "blocks.0.lora_gate.weight"]
    assert [is_adapter_param(n) for n in trained + frozen] == [True] * 4 + [False] * 3
    assert [comfy_key(n) for n in trained] == [
        "diffusion_model.blocks.0.attn.q.lora_A.weight", "diffusion_model.blocks.0.attn.q.dora_scale",
        "diffusion_model.blocks.0.mlp.0.hada_w2_b", "diffusion_model.single_blocks.1.linear1.lokr_w1"]
