"""Checks the pipeline adapter tests share (tests/with_comfy/test_pipeline_<family>.py): a tiny family's
model, ComfyUI's own prediction, the adapter's stage layers run one after another on one process, their
output and LoRA gradients against ComfyUI's, an input that must reach the output, the inputs an adapter
refuses, that exactly one adapter takes a model, and a plain run against a 2-stage pipeline of real
DeepSpeed gloo ranks.
"""
from __future__ import annotations

import dataclasses

import family_configs as fc
import pytest
import torch
from engine_runs import (
    assert_same_lora,
    loss_and_lora_grads,
    pipeline_config,
    run_all_to_end,
    trainable_lora,
)
from PipeTrain.engine.config.checks import ConfigError


def family_model(name: str, **changes):
    """ComfyUI's own model of tiny family `name` (tests/family_configs.py), config changed by `changes`, seed 0."""
    import comfy.supported_models

    family = next(f for f in fc.FAMILIES if f.name == name)
    model = getattr(comfy.supported_models, family.supported)(dict(family.config, **changes)).get_model({})
    fc.init_weights(model.diffusion_model, seed=0)
    return model


def reference(model, prepared):
    """ComfyUI's prediction: apply_model with the transformer_options the engine passes."""
    from PipeTrain.engine.train.objective import transformer_options

    return model.apply_model(prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma),
                             **prepared.kwargs)


def run_layers(model, prepared, name: str | None = None, contiguous: bool = True):
    """The adapter's layers in sequence (what the stages compute), fed contiguous first-stage inputs as
    engine/train/pipeline.py does. name: the adapter adapter_for must pick for this model; contiguous: every
    tensor a layer hands on is contiguous (DeepSpeed sends it as is; engine/train/pipeline.py's _BoundarySafe
    copies a strided one, which an adapter that hands on only contiguous tensors never needs)."""
    from PipeTrain.engine.models import adapter_for

    adapter = adapter_for(model)
    assert name is None or adapter.name == name, adapter.name
    acts = tuple(t.contiguous() for t in adapter.first_stage_inputs(prepared))
    for layer in adapter.layers(model):
        acts = layer(acts)
        if contiguous:
            assert all(t.is_contiguous() for t in ((acts,) if torch.is_tensor(acts) else acts)), type(layer).__name__
    return acts


def assert_layers_equal_reference(model, prepared, name: str | None = None, expected=reference,
                                  contiguous: bool = True):
    """Running the adapter's layers one after another (run_layers) gives `expected`'s output
    (apply_model) bit for bit."""
    with torch.no_grad():
        want = expected(model, prepared)
        got = run_layers(model, prepared, name, contiguous)
    assert torch.equal(got, want)


def with_lora(model) -> tuple:
    """A rank-4 LoRA on every linear of the blocks (engine.train.lora.inject_lora, "all_linear"), its lora_B
    drawn at random (engine_runs.trainable_lora): (target names, {name: LoRA parameter})."""
    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.train.lora import inject_lora

    targets = inject_lora(model.diffusion_model, LoraSpec(rank=4, targets="all_linear"))
    return targets, trainable_lora(model)


def lora_grads(model, prepared, lora: dict, name: str | None = None, expected=reference, checkpointing: str = "off",
               contiguous: bool = True):
    """((loss, {name: gradient}) through `expected` (apply_model), the same through run_layers (with
    `name` and `contiguous`)). checkpointing: the engine's activation checkpointing ("on",
    "cpu_offload") wrapped around every block between the two, as engine/memory/options.py does before the
    stages exist; with CPU offload the blocks must really run checkpointed."""
    from PipeTrain.engine.memory.activation_checkpointing import enable_checkpointing

    want = loss_and_lora_grads(model, prepared, lora, lambda: expected(model, prepared))
    offloader = None if checkpointing == "off" else enable_checkpointing(model.diffusion_model, checkpointing)
    got = loss_and_lora_grads(model, prepared, lora, lambda: run_layers(model, prepared, name, contiguous))
    assert offloader is None or offloader.offloaded > 0  # the blocks ran checkpointed
    return want, got


def assert_same_lora_grads(want, got, loss_rtol: float | None = None):
    """The same loss (bit for bit, or within loss_rtol) and LoRA gradients; every reference gradient
    is non-zero (each LoRA trains), so equal gradients are not trivially equal."""
    (want_loss, want_grads), (loss, grads) = want, got
    if loss_rtol is None:
        assert torch.equal(loss, want_loss)
    else:
        torch.testing.assert_close(loss, want_loss, rtol=loss_rtol, atol=0)
    assert grads.keys() == want_grads.keys()
    assert all(g is not None and g.abs().sum() > 0 for g in want_grads.values())
    for n in want_grads:
        torch.testing.assert_close(grads[n], want_grads[n], msg=n)


def assert_input_reaches_output(model, prepared, key: str, change=lambda value: value + 1.0,
                                name: str | None = None) -> None:
    """Changing prepared.kwargs[key] to change(it) changes run_layers' prediction (the input is not dropped)."""
    with torch.no_grad():
        base = run_layers(model, prepared, name)
        prepared.kwargs[key] = change(prepared.kwargs[key])
        moved = run_layers(model, prepared, name)
    assert (base - moved).abs().max() > 1e-4, key


def assert_lora_grads_equal_reference(model, prepare, name: str, roots, checkpointing: str = "off") -> None:
    """A LoRA on every block linear (with_lora, a target under each prefix in `roots`), then prepare(model)'s
    inputs: backward through run_layers gives apply_model's loss and LoRA gradients (assert_same_lora_grads)."""
    targets, lora = with_lora(model)
    for root in roots:
        assert any(t.startswith(root) for t in targets), root
    want, got = lora_grads(model, prepare(model), lora, name, checkpointing=checkpointing)
    assert_same_lora_grads(want, got)


def assert_only_adapter(models, name: str, others) -> None:
    """adapter_for picks `name` for every model and no other adapter matches them; `name`'s adapter
    matches none of the tiny models (ComfyUI's own classes) of the families `others`."""
    from PipeTrain.engine.models import ADAPTERS, adapter_for

    for model in models:
        assert adapter_for(model).name == name
        assert [n for n, a in ADAPTERS.items() if a.matches(model)] == [name]
    others = list(others)
    assert others
    for family in others:
        assert not ADAPTERS[name].matches(fc.build(family)), family.name


def assert_refused(model, prepared, match: str, **changes) -> None:
    """The adapter's first_stage_inputs refuses `prepared` with its kwargs changed by `changes` (None
    removes a key) with a ConfigError matching `match`."""
    from PipeTrain.engine.models import adapter_for

    for key, value in changes.items():
        if value is None:
            prepared.kwargs.pop(key)
        else:
            prepared.kwargs[key] = value
    with pytest.raises(ConfigError, match=match):
        adapter_for(model).first_stage_inputs(prepared)


def assert_text_only_inputs(model, prepare) -> None:
    """A text-to-image adapter refuses concat channels (naming the fix) and a conditioning without
    text (cross_attn); prepare(model, batch=1) makes apply_model's inputs."""
    prepared = prepare(model, batch=1)
    assert_refused(model, prepared, "concat channels.*pipeline_stages to 1", c_concat=torch.zeros_like(prepared.xt))
    assert_refused(model, prepare(model, batch=1), "cross_attn", c_crossattn=None)


def assert_layers_refused(model, other, match: str) -> None:
    """adapter_for(model)'s layers() refuses the model `other` with a ConfigError matching `match`."""
    from PipeTrain.engine.models import adapter_for

    with pytest.raises(ConfigError, match=match):
        adapter_for(model).layers(other)


def two_process_runs(tmp_path, comfy_root, files, grad_accum: int = 1, **memory):
    """Two engine runs of engine_runs.pipeline_config over files = (model file, cache dir), side by side:
    one plain process, and a 2-stage pipeline on 2 DeepSpeed gloo ranks (memory: changes to its MemorySpec)."""
    cfg = pipeline_config(tmp_path / "piped", comfy_root, files, 2, 2, grad_accum)
    plain, piped = run_all_to_end(pipeline_config(tmp_path / "plain", comfy_root, files, 1, 1, grad_accum),
                                  dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, **memory)))
    return plain, piped


def assert_pipelined_like_plain(plain, piped):
    """Two engine runs (engine_runs.run_to_end), one plain process and a pipeline: the same losses
    (rel 1e-5), gradient norms over every stage (rel 1e-4) and saved LoRA (rtol 1e-4, atol 1e-5:
    summation-order noise); returns the LoRA."""
    assert plain.losses() == pytest.approx(piped.losses(), rel=1e-5, abs=1e-7)
    assert plain.grad_norms() == pytest.approx(piped.grad_norms(), rel=1e-4)
    return assert_same_lora(plain.cfg.run_dir, piped.cfg.run_dir, rtol=1e-4, atol=1e-5)


def assert_every_lora_trained(lora: dict) -> None:
    """Every lora_B moved from zero: no stage's LoRA was left out."""
    b = [k for k in lora if k.endswith("lora_B.weight")]
    moved = [k for k in b if lora[k].abs().sum() > 0]
    assert len(moved) == len(b), "a stage's LoRA never trained"
