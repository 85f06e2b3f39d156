"""The optimizer registry: every optimizer decays matrices only, survives a state_dict round trip
exactly, and the 8-bit/Kahan/offload ones keep what they promise (bytes of state, bf16 accuracy,
where the state lives). Real optimizers on small real tensors; no ComfyUI needed."""
from __future__ import annotations

import io
import re
import sys

import pytest
import torch

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.choices import OPTIMIZER_LR_RANGES, OPTIMIZER_NOTES, OPTIMIZERS
from PipeTrain.engine.config.rules import check_optimizer_settings
from PipeTrain.engine.config.sections import MemorySpec, TrainSpec
from PipeTrain.engine.train.optim import build_scheduler
from PipeTrain.engine.train.optimizers import build_optimizer
from PipeTrain.engine.train.optimizers import OPTIMIZERS as REGISTRY
from PipeTrain.engine.train.optimizers.adamw8bit_kahan import AdamW8bitKahan
from PipeTrain.engine.train.optimizers.blockwise8bit import codebook

LR = {"prodigy": 1.0, "adafactor": 1e-2}


def _train(name: str, **kw) -> TrainSpec:
    return TrainSpec(**{"learning_rate": LR.get(name, 1e-3), "weight_decay": 0.1, **kw})


def _lora_like(dtype=torch.float32, seed=0) -> list[torch.nn.Parameter]:
    """A LoRA pair big enough for the 8-bit paths (>= 4096 values) and a bias."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(8, 640, generator=g) * 0.05
    b = torch.randn(640, 8, generator=g) * 0.01
    bias = torch.randn(640, generator=g) * 0.01
    return [torch.nn.Parameter(t.to(dtype)) for t in (a, b, bias)]


class _Problem:
    """A fixed regression problem: the loss and gradients depend on the weights, as in training."""

    def __init__(self, seed=1):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(64, 640, generator=g)
        self.y = torch.randn(64, 640, generator=g) * 0.1

    def loss(self, params) -> torch.Tensor:
        a, b, bias = (p.float() for p in params)
        return ((self.x @ a.T @ b.T + bias - self.y) ** 2).mean()

    def step(self, params, opt, scheduler=None, clip=1e-3) -> float:
        opt.zero_grad(set_to_none=True)
        loss = self.loss(params)
        loss.backward()
        self.clipped = torch.nn.utils.clip_grad_norm_(params, clip) > clip  # 1e-3: clips every step
        opt.step()
        if scheduler is not None:
            scheduler.step()
        return loss.item()


def test_registry_and_config_list_the_same_optimizers_with_notes_and_ranges():
    assert tuple(REGISTRY) == OPTIMIZERS
    assert set(OPTIMIZER_NOTES) == set(OPTIMIZERS) == set(OPTIMIZER_LR_RANGES)
    for name, note in OPTIMIZER_NOTES.items():
        assert note.endswith(".") and note.count(". ") == 0, f"{name}: one sentence"
    for name in OPTIMIZERS:
        low, high = OPTIMIZER_LR_RANGES[name]
        assert low <= _train(name).learning_rate <= high


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_weight_decay_is_off_for_1d_params(name):
    params = _lora_like()
    opt = build_optimizer(name, params, _train(name, weight_decay=0.3))
    decay_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decay_of[id(params[2])] == 0.0 and decay_of[id(params[0])] == decay_of[id(params[1])] == 0.3
    if name == "prodigy":
        return  # its shared step size couples all tensors: the groups above are the whole contract
    # Behaviour: the same gradients with and without decay move the bias identically.
    runs = []
    for wd in (0.0, 0.3):
        ps = _lora_like()
        opt = build_optimizer(name, ps, _train(name, weight_decay=wd))
        g = torch.Generator().manual_seed(5)
        for _ in range(3):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=g).to(p.dtype) * 1e-2
            opt.step()
        runs.append(ps)
    assert torch.equal(runs[0][2], runs[1][2]), "the 1-D tensor was decayed"
    assert not torch.equal(runs[0][0], runs[1][0]), "the matrix was not decayed"


CASES = [(n, torch.float32) for n in OPTIMIZERS] + [("adamw8bit_kahan", torch.bfloat16),
                                                     ("adamw_cpu_offload", torch.bfloat16)]


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_state_dict_round_trip_then_a_step_equals_an_uninterrupted_step(name, dtype):
    problem, train = _Problem(), _train(name, warmup_steps=2, scheduler="cosine")
    params = _lora_like(dtype)
    opt = build_optimizer(name, params, train)
    scheduler = build_scheduler(opt, train, total_steps=10)
    losses = [problem.step(params, opt, scheduler) for _ in range(5)]
    assert losses[-1] < losses[0] and problem.clipped

    # Save as both backends do (torch.save), read back as PlainTrainer does (weights_only=True).
    buffer = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in params], "opt": opt.state_dict(),
                "sched": scheduler.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    restored = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    opt2 = build_optimizer(name, restored, train)
    scheduler2 = build_scheduler(opt2, train, total_steps=10)
    opt2.load_state_dict(saved["opt"])
    scheduler2.load_state_dict(saved["sched"])

    for _ in range(2):
        assert problem.step(params, opt, scheduler) == problem.step(restored, opt2, scheduler2)
    for p, q in zip(params, restored):
        assert p.dtype == q.dtype == dtype and torch.equal(p, q)


def _state_bytes(opt) -> int:
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


@pytest.mark.parametrize("name,dtype,most", [
    ("adamw", torch.float32, 8.0),
    ("adamw8bit", torch.float32, 2.1),
    ("adamw8bit_kahan", torch.float32, 2.1),
    ("adamw8bit_kahan", torch.bfloat16, 4.1),  # + the bf16 compensation buffer
])
def test_8bit_state_is_8bit(name, dtype, most):
    """Bytes of optimizer state per weight for a LoRA of a 3072-wide model (rank 16)."""
    params = [torch.nn.Parameter(torch.randn(16, 3072).to(dtype) * 0.02),
              torch.nn.Parameter(torch.randn(3072, 16).to(dtype) * 0.02)]
    opt = build_optimizer(name, params, _train(name))
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    per_weight = _state_bytes(opt) / sum(p.numel() for p in params)
    assert most - 0.1 < per_weight <= most + 0.01, per_weight  # + torch's per-tensor step counters
    if name != "adamw":
        moments = [v for s in opt.state.values() for v in s.values()
                   if torch.is_tensor(v) and v.numel() >= params[0].numel()]
        assert {v.dtype for v in moments} - {torch.bfloat16} == {torch.uint8}


def test_codebooks_cover_seven_decades_and_the_maximum():
    signed, unsigned = codebook(signed=True), codebook(signed=False)
    assert len(signed) == 255 and len(unsigned) == 256
    assert signed[0] == -1 and signed[-1] == 1 and unsigned[0] == 0 and unsigned[-1] == 1
    assert 0 < unsigned[1] <= 1e-7 and bool((signed[1:] > signed[:-1]).all())


def test_kahan_keeps_tiny_bf16_updates_that_naive_bf16_adamw_loses():
    """Weights in [1, 1.5) in bfloat16 (spacing 2**-7) with updates of ~2e-4 per step: naive
    rounding drops every update, Kahan summation follows the float32 run."""
    torch.manual_seed(0)
    start = 1.0 + torch.rand(32, 128) * 0.5  # 4096 values: the 8-bit moment path
    grads = [torch.randn(32, 128) * 0.3 + 1.0 for _ in range(120)]  # a steady push: Adam steps ~lr

    def run(dtype, kahan: bool) -> torch.Tensor:
        p = torch.nn.Parameter(start.to(dtype, copy=True))
        opt = AdamW8bitKahan([p], lr=2e-4, weight_decay=0.0, kahan=kahan)
        for g in grads:
            p.grad = g.to(dtype)
            opt.step()
        return p.detach().float()

    reference = run(torch.float32, kahan=True)  # float32: nothing to compensate, plain 8-bit AdamW
    kahan = run(torch.bfloat16, kahan=True)
    naive = run(torch.bfloat16, kahan=False)
    moved = (reference - start).abs().mean()
    assert moved > 5e-3, "the reference should travel several bf16 spacings"
    naive_err, kahan_err = (naive - reference).abs().mean(), (kahan - reference).abs().mean()
    assert naive_err > 0.5 * moved, f"naive bf16 should lose most updates: err {naive_err:.2e} of {moved:.2e}"
    assert kahan_err < 2 ** -8, f"Kahan should stay within a bf16 rounding: err {kahan_err:.2e}"


def test_8bit_kahan_on_float32_weights_follows_adamw_like_bitsandbytes_8bit():
    problem = _Problem()
    runs = {}
    for name in ("adamw", "adamw8bit", "adamw8bit_kahan"):
        params = _lora_like()
        opt = build_optimizer(name, params, _train(name, learning_rate=3e-3))
        losses = [problem.step(params, opt, clip=1.0) for _ in range(40)]
        runs[name] = (params, losses[-1])
    start = _lora_like()

    def drift(name: str) -> float:  # distance from AdamW's weights, relative to how far AdamW moved
        return max(((p - q).norm() / (p - s).norm()).item() for p, q, s in zip(runs["adamw"][0], runs[name][0], start))

    assert runs["adamw8bit_kahan"][1] == pytest.approx(runs["adamw"][1], rel=0.01)
    assert drift("adamw8bit_kahan") < 0.1 and drift("adamw8bit_kahan") < 2 * drift("adamw8bit"), \
        (drift("adamw8bit_kahan"), drift("adamw8bit"))


def test_cpu_offload_keeps_state_in_cpu_ram_and_equals_adamw():
    problem = _Problem()
    reference, offloaded = _lora_like(), _lora_like()
    opt_ref = build_optimizer("adamw", reference, _train("adamw"))
    opt = build_optimizer("adamw_cpu_offload", offloaded, _train("adamw_cpu_offload"))
    for _ in range(10):
        problem.step(reference, opt_ref)
        problem.step(offloaded, opt)
    for p, q in zip(reference, offloaded):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    for p in offloaded:
        state = opt.state[p]
        assert state["master"].device.type == "cpu" and state["master"].dtype == torch.float32
        assert state["master"] is not p and torch.equal(state["master"], p.detach())


def test_cpu_offload_accumulates_bf16_weights_in_float32_masters():
    params = _lora_like(torch.bfloat16)
    opt = build_optimizer("adamw_cpu_offload", params, _train("adamw_cpu_offload"))
    _Problem().step(params, opt)
    for p in params:
        master = opt.state[p]["master"]
        assert master.dtype == torch.float32 and torch.equal(master.to(torch.bfloat16), p.detach())


@pytest.mark.parametrize("name,lr,fix", [
    ("prodigy", 1e-4, "about 1.0"),
    ("adamw", 1.0, "about 1e-4"),
    ("adamw8bit", 0.5, "about 1e-4"),
    ("adafactor", 1e-5, "about 1e-2"),
])
def test_a_learning_rate_that_makes_no_sense_is_a_config_error(name, lr, fix):
    with pytest.raises(ConfigError, match=rf"train\.learning_rate .* memory\.optimizer '{name}'.*{re.escape(fix)}"):
        check_optimizer_settings(MemorySpec(optimizer=name), TrainSpec(learning_rate=lr))
    check_optimizer_settings(MemorySpec(optimizer=name), _train(name))  # a sensible one passes


def test_prodigy_needs_one_pipeline_stage():
    with pytest.raises(ConfigError, match="pipeline_stages"):
        check_optimizer_settings(MemorySpec(optimizer="prodigy", pipeline_stages=2), TrainSpec(learning_rate=1.0))


def test_a_missing_optimizer_package_is_a_config_error(monkeypatch):
    # A mock: uninstalling a package from the shared test environment is not possible here.
    monkeypatch.setitem(sys.modules, "pytorch_optimizer", None)
    with pytest.raises(ConfigError, match="memory.optimizer 'prodigy' needs the package 'pytorch_optimizer'"):
        build_optimizer("prodigy", _lora_like(), _train("prodigy"))
