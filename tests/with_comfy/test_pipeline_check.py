"""The start-of-run check of an adapter's stage layers against ComfyUI's apply_model
(engine/models/stage_check.py): a real adapter passes on this ComfyUI, a stage layer that computes
something else is refused before any training (naming the adapter, the ComfyUI version and the fix),
and rounding-level differences are not refused.

In one process on tiny models of ComfyUI's own classes (tests/family_configs.py); the check itself
is what engine/train/pipeline.py build_engine runs on global rank 0 of a pipelined run.
"""
from __future__ import annotations

import family_configs as fc
import pytest
import torch
from PipeTrain.engine.config.checks import ConfigError
from trainable import make_trainable

_FAMILY = {f.name: f for f in fc.FAMILIES}


def _setup(family: str):
    """(model made trainable, adapter, its stage layers, objective, a one-item 'dataset' in the cache's
    item format)."""
    from PipeTrain.engine.models import adapter_for
    from PipeTrain.engine.train.objective import DiffusionObjective

    fam = _FAMILY[family]
    model = fc.build(fam)
    latents, conds = fc.batch(fam)
    make_trainable(model, latents, conds, **fam.train)
    item = {"latent": latents[0], "cross_attn": conds[0]["cross_attn"], "extras": conds[0]["extras"]}
    adapter = adapter_for(model)
    return model, adapter, adapter.layers(model), DiffusionObjective(model, seed=0, **fam.train), [item]


def _check(model, adapter, layers, objective, dataset):
    from PipeTrain.engine.models.stage_check import check_stage_layers

    check_stage_layers(adapter, model, layers, objective, dataset, torch.device("cpu"))


class _Off(torch.nn.Module):
    """A stage layer that hands on its first tensor scaled by `factor` (a stale mirror of a forward)."""

    def __init__(self, layer, factor: float):
        super().__init__()
        self.layer, self.factor = layer, factor

    def forward(self, inputs):
        out = self.layer(inputs)
        return (out[0] * self.factor, *out[1:])


@pytest.mark.parametrize("family", ["flux", "wan21_t2v", "hunyuan_video"])
def test_real_adapters_pass(comfy, family, capsys):
    _check(*_setup(family))
    assert "stage layers reproduce ComfyUI" in capsys.readouterr().err  # the run's log says it was checked


@pytest.mark.parametrize("family", ["flux", "wan21_t2v"])
def test_a_wrong_stage_layer_is_refused(comfy, family):
    from PipeTrain.engine.patches.host import comfy_version

    model, adapter, layers, objective, dataset = _setup(family)
    layers[1] = _Off(layers[1], 1.05)  # the first block's output 5% off
    with pytest.raises(ConfigError) as err:
        _check(model, adapter, layers, objective, dataset)
    message = str(err.value)
    assert adapter.name in message and comfy_version() in message and "pipeline_stages to 1" in message
    assert "differs from apply_model" in message


def test_rounding_is_not_refused(comfy):
    model, adapter, layers, objective, dataset = _setup("flux")
    layers[1] = _Off(layers[1], 1.0 + 1e-7)  # float32 rounding of one block's output
    _check(model, adapter, layers, objective, dataset)


def test_the_other_token_order_is_refused(comfy):
    """HunyuanVideo's joint sequence in the order the host does not use (0.3.x: image first, 0.33+:
    text first; ComfyUI changed it between those) is caught, whichever the host is."""
    model, adapter, layers, objective, dataset = _setup("hunyuan_video")
    for layer in layers:
        if hasattr(layer, "image_first"):
            layer.image_first = not layer.image_first
    with pytest.raises(ConfigError, match="hunyuan_video.*differs from apply_model.*pipeline_stages to 1"):
        _check(model, adapter, layers, objective, dataset)


def test_an_adapter_refusal_is_passed_on(comfy, monkeypatch):
    """What the adapter refuses for the cached conditioning stops the run with the adapter's own
    message, before DeepSpeed builds anything (also where ComfyUI could not run the sample either)."""
    model, adapter, layers, objective, dataset = _setup("wan21_t2v")

    def refuse(prepared):
        raise ConfigError("pipeline_stages > 1 for Wan does not reproduce this conditioning")

    monkeypatch.setattr(adapter, "first_stage_inputs", refuse)
    monkeypatch.setattr(model, "apply_model", lambda *a, **k: 1 / 0)
    with pytest.raises(ConfigError, match="does not reproduce this conditioning"):
        _check(model, adapter, layers, objective, dataset)


def test_a_sample_comfyui_cannot_run_skips_the_check(comfy, monkeypatch, capsys):
    """Nothing to compare with: the check says so and lets the run go on (the first step fails the same
    way with pipeline_stages 1)."""
    model, adapter, layers, objective, dataset = _setup("wan21_t2v")
    monkeypatch.setattr(model, "apply_model", lambda *a, **k: 1 / 0)
    _check(model, adapter, layers, objective, dataset)
    assert "pipeline check skipped" in capsys.readouterr().err


class _Toy(torch.nn.Module):
    """A model shaped like a ComfyUI diffusion model: an embedder, a block list, a head, an own parameter."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
                                          for _ in range(3))
        self.head = torch.nn.Linear(8, 4)
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x) * self.scale


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the check of a CPU-resident pipelined model")
def test_a_cpu_model_visits_the_gpu_for_the_check():
    """A pipelined model waits on the CPU: the check runs it on the rank's GPU, each block there only
    for its own call, and every weight is back on the CPU afterwards (the same tensors)."""
    from PipeTrain.engine.models.stage_check import _visiting

    torch.manual_seed(0)
    model, x = _Toy(), torch.randn(2, 5, 4)
    want = model(x)
    params = {n: p for n, p in model.named_parameters()}
    on_gpu = []
    with torch.no_grad(), _visiting(model, torch.device("cuda")):
        # after the check's own hooks: sees the block where it runs
        model.blocks[1].register_forward_pre_hook(lambda m, a: on_gpu.append(next(m.parameters()).is_cuda))
        assert not next(model.blocks[2].parameters()).is_cuda  # not yet its turn
        got = model(x.cuda())
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    assert on_gpu == [True]
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert {n: p for n, p in model.named_parameters()} == params
