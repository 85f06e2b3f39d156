"""The behavioural probe: does a block train correctly with the forward its class has now?

Decided from what the block does, not from its source text, so a ComfyUI release that changes a
block neither stops a family that still trains fine nor lets one train with wrong gradients:

1. `capture` runs the model's forward once (no grad, on a small input the caller gives) and keeps a
   copy of the inputs the first block of each class receives; it stops the forward as soon as
   every class was seen.
2. `probe` runs one block on fresh copies of those inputs, with a small LoRA-like update on each of
   its linear layers and gradients on every float input, twice: plainly, and under non-reentrant
   activation checkpointing (as engine/memory/activation_checkpointing.py runs it). The block is safe when both runs
   finish their backward, it wrote into none of its inputs, and the checkpointed output and
   gradients equal the plain ones. Given a reference output (upstream's own), the plain output
   must equal it too: that is how an out-of-place forward of ours is admitted.

A LoRA-like update matters: it saves each linear layer's input for its own gradient, which is
what an in-place residual update then corrupts (a frozen linear alone saves nothing of the kind).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..linear_layers import is_linear

PROBE_RANK = 2
_SEED = 1234


class _Stop(BaseException):
    """Raised from a pre-hook once every wanted block class has been captured (a BaseException, so
    a caller's `except Exception` fallback does not swallow it)."""


@dataclass
class Captured:
    block: nn.Module
    args: tuple
    kwargs: dict


@dataclass
class Outcome:
    safe: bool
    reason: str = ""              # why not, in words for the user
    output: list | None = None    # the plain run's float outputs (detached)


def _map(obj, fn):
    """Apply fn to every tensor inside tuples, lists, dicts and dataclasses (others kept as they are)."""
    if torch.is_tensor(obj):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_map(v, fn) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map(v, fn) for v in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _map(getattr(obj, f.name), fn)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def _tensors(obj) -> list[torch.Tensor]:
    found = []
    _map(obj, lambda t: found.append(t) or t)
    return found


def capture(run_forward, wanted: dict[type, nn.Module]) -> dict[type, Captured]:
    """Inputs of the first call of each wanted block (class -> block instance), from one forward."""
    got: dict[type, Captured] = {}

    def keep(module, args, kwargs):
        cls = type(module)
        if cls not in got and wanted.get(cls) is module:
            got[cls] = Captured(module, _map(args, lambda t: t.detach().clone()),
                                _map(kwargs, lambda t: t.detach().clone()))
            if len(got) == len(wanted):
                raise _Stop
    handles = [block.register_forward_pre_hook(keep, with_kwargs=True) for block in wanted.values()]
    try:
        with torch.no_grad():
            run_forward()
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return got


class _ProbeLoRA:
    """A rank-2 update on every linear layer of a block, through forward hooks (removed after).

    Its weights are drawn from a fixed seed in the layer input's dtype, so every run of the probe
    (upstream, a fix, plain, checkpointed) sees the very same numbers."""

    def __init__(self, block: nn.Module):
        self.params: list[torch.Tensor] = []
        self._weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._handles = [m.register_forward_hook(self._hook) for m in block.modules() if is_linear(m)]
        self._order = {id(m): i for i, m in enumerate(m for m in block.modules() if is_linear(m))}

    def _hook(self, module, args, output):
        x = args[0] if args else None
        if not torch.is_tensor(x) or not torch.is_tensor(output) or not x.is_floating_point():
            return None
        key = id(module)
        if key not in self._weights:
            gen = torch.Generator().manual_seed(_SEED + self._order[key])
            a = torch.randn(PROBE_RANK, x.shape[-1], generator=gen) / x.shape[-1] ** 0.5
            b = torch.randn(output.shape[-1], PROBE_RANK, generator=gen) * 0.1
            pair = tuple(t.to(x.device, x.dtype).requires_grad_(True) for t in (a, b))
            self._weights[key] = pair
            self.params.extend(pair)
        a, b = self._weights[key]
        return output + torch.nn.functional.linear(torch.nn.functional.linear(x, a), b).to(output.dtype)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _loss_weights(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(_SEED)
    return [torch.randn(o.shape, generator=gen).to(o.device) for o in outputs]


def _run(cap: Captured, checkpointed: bool) -> tuple[list, list, bool]:
    """One forward + backward of the block: (float outputs, gradients, wrote into an input)."""
    torch.manual_seed(_SEED)
    leaves = []

    def feed(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().clone()
        if not t.is_floating_point():
            return t
        leaf = t.requires_grad_(True)
        leaves.append(leaf)
        return leaf.clone()  # a non-leaf, like a block input in training: in-place writes show in its version
    args, kwargs = _map(cap.args, feed), _map(cap.kwargs, feed)
    fed = _tensors((args, kwargs))
    versions = [t._version for t in fed]
    lora = _ProbeLoRA(cap.block)
    try:
        def call():
            return cap.block(*args, **kwargs)
        out = checkpoint(call, use_reentrant=False, preserve_rng_state=True) if checkpointed else call()
        wrote = any(t._version != v for t, v in zip(fed, versions))
        outputs = [o for o in _tensors(out) if o.is_floating_point()]
        loss = sum((o.float() * w).sum() for o, w in zip(outputs, _loss_weights(outputs)))
        params = lora.params + leaves
        grads = torch.autograd.grad(loss, params, allow_unused=True) if torch.is_tensor(loss) and loss.requires_grad \
            else [None] * len(params)
    finally:
        lora.remove()
    return [o.detach() for o in outputs], list(grads), wrote


def reference_output(cap: Captured) -> list[torch.Tensor]:
    """The block's output under no grad, with the probe's LoRA-like update (upstream's math)."""
    lora = _ProbeLoRA(cap.block)
    try:
        with torch.no_grad():
            torch.manual_seed(_SEED)
            out = cap.block(*_map(cap.args, lambda t: t.detach().clone()), **_map(cap.kwargs, lambda t: t.detach().clone()))
    finally:
        lora.remove()
    return [o.detach() for o in _tensors(out) if o.is_floating_point()]


_HALF = (torch.float16, torch.bfloat16)


def tolerance(cap: Captured) -> float:
    """How far two runs of the same math may drift apart, relative to a tensor's scale.

    It is set by the precision the block computes in, not the dtype a result is stored in (an fp32
    input gradient computed through bf16 layers carries bf16 rounding), and on a GPU by its kernels'
    run-to-run variation (atomics in backward): 2e-2 for half precision, 1e-3 for fp32 on a GPU,
    1e-5 on a CPU. What the probe guards against is far above these: an in-place write is caught
    by the version counters, and a recompute from an overwritten input or a forward that is not
    upstream's math differs by whole percents or more.
    """
    tensors = list(cap.block.parameters()) + list(cap.block.buffers()) + _tensors((cap.args, cap.kwargs))
    floats = [t for t in tensors if t.is_floating_point()]
    if any(t.dtype in _HALF for t in floats):
        return 2e-2
    return 1e-3 if any(t.device.type != "cpu" for t in floats) else 1e-5


def differs(got: list, want: list, tol: float = 1e-5) -> float | None:
    """The largest difference relative to the reference's scale, or None when all agree within tol."""
    if len(got) != len(want):
        return float("inf")
    worst = None
    for g, w in zip(got, want):
        if g is None or w is None:
            if (g is None) != (w is None) and (g if g is not None else w).abs().max() > 0:
                return float("inf")
            continue
        if g.shape != w.shape:
            return float("inf")
        scale = w.float().abs().max().item() + 1e-12
        rel = (g.float() - w.float()).abs().max().item() / scale
        if not rel <= tol:  # NaN counts as a difference
            worst = rel if worst is None else max(worst, rel)
    return worst


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def probe(cap: Captured, reference: list | None = None) -> Outcome:
    """Whether the block trains correctly (see the module docstring)."""
    tol = tolerance(cap)
    try:
        plain_out, plain_grads, wrote = _run(cap, checkpointed=False)
    except Exception as exc:  # noqa: BLE001 - any failure is the verdict, told to the user
        return Outcome(False, f"its LoRA backward fails ({_first_line(exc)})")
    if wrote:
        return Outcome(False, "it updates one of its input tensors in place", plain_out)
    if reference is not None:
        gap = differs(plain_out, reference, tol)
        if gap is not None:
            return Outcome(False, f"its output differs from ComfyUI's own forward (relative difference {gap:.2g})",
                           plain_out)
    try:
        ckpt_out, ckpt_grads, wrote = _run(cap, checkpointed=True)
    except Exception as exc:  # noqa: BLE001
        return Outcome(False, f"it fails under activation checkpointing ({_first_line(exc)})", plain_out)
    gap = differs(ckpt_out + ckpt_grads, plain_out + plain_grads, tol)
    if wrote or gap is not None:
        return Outcome(False, "under activation checkpointing its output or gradients differ from the plain run's "
                              f"(relative difference {gap if gap is not None else float('nan'):.2g})", plain_out)
    return Outcome(True, "", plain_out)


# ---- a CPU-resident model (block swap, pipeline stages) probed on the GPU ----------------------------
def _move_own(module: nn.Module, device: torch.device) -> None:
    for name, p in module._parameters.items():
        if p is not None:
            p.data = p.data.to(device)
    for name, b in module._buffers.items():
        if b is not None:
            module._buffers[name] = b.to(device)


@contextlib.contextmanager
def on_device(diffusion_model: nn.Module, all_blocks: list[nn.Module], device: torch.device | None,
              keep: list[nn.Module]):
    """Run a model whose weights are elsewhere (the CPU) on `device` for the duration: everything but
    the blocks moves there, each block visits the device for its own call, the `keep` blocks stay.
    Afterwards every weight is back where it was. Does nothing when the model is on `device`."""
    first = next(diffusion_model.parameters(), None)
    if device is None or first is None or first.device == device:
        yield
        return
    home = first.device
    inside = {id(m) for b in all_blocks for m in b.modules()}
    outside = [m for m in diffusion_model.modules() if id(m) not in inside]
    kept = {id(b) for b in keep}
    handles = []
    for block in all_blocks:
        if id(block) in kept:
            block.to(device)
            continue
        # hooks must return None: a returned value would replace the block's input / output
        handles.append(block.register_forward_pre_hook(lambda m, a: (m.to(device), None)[1]))
        handles.append(block.register_forward_hook(lambda m, a, o: (m.to(home), None)[1]))
    for module in outside:
        _move_own(module, device)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module in outside:
            _move_own(module, home)
        for block in keep:
            block.to(home)
