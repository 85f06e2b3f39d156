"""Block swap, checkpointing modes and per-block compile on a real ComfyUI Wan model, in-process on the CPU.

On the CPU the "offload side" of a swapped block is a host buffer distinct from the buffer it
visits the device in, so a dispatch mode that sees every aten op (forward, recompute and backward)
can prove the schedule: no compute op ever reads a block's offloaded weights, at most
prefetch + 1 swapped blocks are present at a time, and their device buffers are really freed
(autograd keeps no view of them alive). Gradients with every option equal the plain ones.
"""
from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tiny_wan
from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec

_HOST_OK = {"slice", "view", "clone", "detach", "alias", "copy_", "_unsafe_view", "lift_fresh", "empty"}


@pytest.fixture(scope="module", autouse=True)
def one_thread(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only contend on the shared 2-core machine
    yield
    torch.set_num_threads(before)


def _model(spec: MemorySpec):
    from PipeTrain.engine.train.lora import inject_lora
    from PipeTrain.engine.memory.options import apply_memory_options

    model = tiny_wan.build_base_model(0)
    model.requires_grad_(False)
    model.train()
    torch.manual_seed(0)
    inject_lora(model.diffusion_model, LoraSpec(rank=4, targets="all_linear"))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-zero B everywhere, so every block's gradient path is exercised
        for name, p in model.diffusion_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model, apply_memory_options(model, spec, torch.device("cpu"))


def _step(model):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, *tiny_wan.LATENT, generator=gen)
    ctx = torch.randn(2, *tiny_wan.TEXT, generator=gen)
    out = model.apply_model(x, torch.tensor([0.4, 0.8]), c_crossattn=ctx, transformer_options={})
    loss = out.float().pow(2).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.diffusion_model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


class _WeightUse(TorchDispatchMode):
    """Checks every aten op: offloaded weights are never computed with; counts present swapped blocks."""

    def __init__(self, swapper, live_buffers):
        super().__init__()
        self.swapper = swapper
        self.live = live_buffers
        self.hosts = {s.host.untyped_storage().data_ptr(): p for p, s in swapper.slots.items()}
        self.violations: list[str] = []
        self.max_present = 0
        self.max_live = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name not in _HOST_OK:
            for a in torch.utils._pytree.tree_leaves((args, kwargs)):
                if torch.is_tensor(a) and a.untyped_storage().data_ptr() in self.hosts:
                    self.violations.append(f"{name} read block {self.hosts[a.untyped_storage().data_ptr()]}'s "
                                           "offloaded weights")
        self.max_present = max(self.max_present, len(self.swapper.resident()))
        self.max_live = max(self.max_live, sum(r() is not None for r in self.live))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("checkpointing", ["off", "on", "cpu_offload"])
def test_block_swap_uses_each_block_only_while_present_and_frees_it(checkpointing, monkeypatch):
    from PipeTrain.engine.memory import block_swap

    live: list[weakref.ref] = []
    load = block_swap._Slot.load

    def tracked_load(slot, stream):  # instrument only: the real load runs, its buffer is watched
        load(slot, stream)
        live.append(weakref.ref(slot.dev.untyped_storage()))  # alive while any tensor (a view too) holds it

    monkeypatch.setattr(block_swap._Slot, "load", tracked_load)
    model, plan = _model(MemorySpec(block_swap=3, activation_checkpointing=checkpointing))
    swapper = plan.swapper
    assert sorted(swapper.slots) == [1, 2, 3]  # the last 3 of the 4 Wan blocks
    first = model.diffusion_model.blocks[1].self_attn.q.base_layer.weight
    assert first.untyped_storage().data_ptr() == swapper.slots[1].host.untyped_storage().data_ptr()
    lora = model.diffusion_model.blocks[1].self_attn.q.lora_A["default"].weight
    assert lora.untyped_storage().data_ptr() != swapper.slots[1].host.untyped_storage().data_ptr()

    _step(model)  # first step: warm-up of the schedule
    swapper.trace.clear()
    swapper.late_loads = 0
    check = _WeightUse(swapper, live)
    with check:
        _step(model)
    assert not check.violations, check.violations[:5]
    assert check.max_present <= 2, f"{check.max_present} swapped blocks present at once (prefetch 1 allows 2)"
    assert check.max_live <= 3, f"{check.max_live} device copies alive at once: autograd kept released blocks"
    uses = [p for what, p in swapper.trace if what == "use"]
    # Forward 1, 2, 3, backward 3 (kept), 2, 1; with checkpointing nothing else is needed.
    assert uses[:3] == [1, 2, 3] and uses[3:] == [2, 1], swapper.trace
    assert swapper.late_loads == 0, swapper.trace  # every use was prefetched in time
    assert swapper.resident() == [1]  # prefetched for the next forward at the end of backward


@pytest.mark.parametrize("spec", [
    MemorySpec(block_swap=2),
    MemorySpec(block_swap=4, activation_checkpointing="on"),
    MemorySpec(activation_checkpointing="on"),
    MemorySpec(activation_checkpointing="cpu_offload"),
    MemorySpec(block_swap=3, activation_checkpointing="cpu_offload"),
], ids=["swap2", "swap4+on", "on", "cpu_offload", "swap3+cpu_offload"])
def test_gradients_equal_without_memory_options(spec):
    ref_loss, ref = _step(_model(MemorySpec())[0])
    model, plan = _model(spec)
    for _ in range(2):  # the second step runs on the schedule the first one left behind
        loss, grads = _step(model)
        assert loss == ref_loss
        assert grads.keys() == ref.keys() and len(ref) == 80
        for k in ref:  # same ops in the same order on the CPU: equal to float rounding
            torch.testing.assert_close(grads[k], ref[k], rtol=1e-6, atol=1e-8)
    if spec.activation_checkpointing == "cpu_offload":
        assert plan.offloader.offloaded >= 2 * 4, "the block inputs were not offloaded"


def test_block_swap_larger_than_the_model_names_the_block_count():
    with pytest.raises(ConfigError, match=r"block_swap is 5 but this model has 4 blocks"):
        _model(MemorySpec(block_swap=5))


def test_sampling_without_swap_holds_every_block_then_the_schedule_resumes():
    """block_swap_sampling off: all swapped blocks stay on the device while sampling (no per-block copies),
    the output is the swapped one, and training afterwards gives the plain gradients again."""
    ref_loss, ref = _step(_model(MemorySpec())[0])
    model, plan = _model(MemorySpec(block_swap=3, activation_checkpointing="on"))
    _step(model)
    x = torch.randn(1, *tiny_wan.LATENT, generator=torch.Generator().manual_seed(5))
    ctx = torch.randn(1, *tiny_wan.TEXT, generator=torch.Generator().manual_seed(6))

    def sample():
        with torch.no_grad():
            return model.apply_model(x, torch.tensor([0.5]), c_crossattn=ctx, transformer_options={})

    swapped = sample()
    assert plan.for_sampling(keep_swapping=True).__class__.__name__ == "nullcontext"
    with plan.for_sampling(keep_swapping=False):
        assert sorted(plan.swapper.resident()) == [1, 2, 3]
        loads = sum(1 for what, _ in plan.swapper.trace if what == "load")
        held = sample()
        assert sorted(plan.swapper.resident()) == [1, 2, 3], "a block was released while sampling"
        assert sum(1 for what, _ in plan.swapper.trace if what == "load") == loads, "blocks were copied per use"
    assert torch.equal(held, swapped)
    assert plan.swapper.resident() == [1], "after sampling only the prefetched first swapped block is loaded"
    loss, grads = _step(model)
    assert loss == ref_loss
    for k in ref:
        torch.testing.assert_close(grads[k], ref[k], rtol=1e-6, atol=1e-8)


def test_swapped_weights_are_hidden_from_whole_model_moves():
    """What DeepSpeed's initialise does (module.to(device)) must not copy the swapped weights."""
    model, plan = _model(MemorySpec(block_swap=2))
    with plan.hidden():
        model.diffusion_model.to(torch.float64)  # a whole-model conversion, as observable as a device move
    swapped = model.diffusion_model.blocks[3].ffn[0].base_layer.weight
    kept = model.diffusion_model.blocks[0].ffn[0].base_layer.weight
    assert swapped.dtype == torch.float32 and kept.dtype == torch.float64
    assert swapped.untyped_storage().data_ptr() == plan.swapper.slots[3].host.untyped_storage().data_ptr()


def test_compiled_blocks_keep_attention_eager_and_give_the_same_gradients():
    """Per-block torch.compile through dynamo + AOT autograd ('aot_eager': inductor's C++ build on
    the CPU takes ~45 s, the GPU benchmark runs inductor); attention is a graph break each time."""
    from torch._dynamo.utils import counters

    from PipeTrain.engine.memory.compile import compile_blocks

    ref_loss, ref = _step(_model(MemorySpec())[0])
    model, _ = _model(MemorySpec(activation_checkpointing="on"))
    torch._dynamo.reset()
    counters.clear()
    try:
        assert compile_blocks(model.diffusion_model, backend="aot_eager") == 4
        for _ in range(2):
            loss, grads = _step(model)
            torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
            for k in ref:  # a compiled graph may fuse/reorder float ops
                torch.testing.assert_close(grads[k], ref[k], rtol=1e-4, atol=1e-6)
        breaks = [k for k in counters["graph_break"] if "attention" in k and "compiler.disable" in k]
        assert breaks, dict(counters["graph_break"])  # dynamo traced the blocks and stopped at attention
    finally:
        torch._dynamo.reset()


def test_cuda_graph_mode_starts_a_graph_step_at_each_model_call(monkeypatch):
    """compile_mode 'cuda_graphs': every call of the diffusion model begins a new CUDA-graph replay
    generation (the previous call's block outputs are consumed by then). On the CPU the graphs are skipped;
    the H200 figures are in docs/benchmarks.md. Counts the real function's calls (a spy, not a stand-in)."""
    from PipeTrain.engine.memory.compile import TORCH_MODES, compile_blocks

    real, marks = torch.compiler.cudagraph_mark_step_begin, []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: (marks.append(1), real())[1])
    ref_loss, ref = _step(_model(MemorySpec())[0])
    model, _ = _model(MemorySpec())
    torch._dynamo.reset()
    try:
        compile_blocks(model.diffusion_model, backend="aot_eager", mode=TORCH_MODES["cuda_graphs"])
        for calls in (1, 2):
            loss, grads = _step(model)
            assert len(marks) == calls
            torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
            for k in ref:
                torch.testing.assert_close(grads[k], ref[k], rtol=1e-4, atol=1e-6)
    finally:
        torch._dynamo.reset()
