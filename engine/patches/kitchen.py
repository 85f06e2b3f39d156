"""Backward formulas for comfy-kitchen's fused rope / norm ops, from comfy-kitchen's own eager code.

ComfyUI 0.33 calls fused kernels of the comfy-kitchen package (RoPE, RMSNorm + RoPE, adaLN) that
are torch custom ops with no autograd formula. Most call sites switch to plain torch code while
`comfy.model_management.in_training` is set; some do not (0.33.0: Cosmos Predict2's attention calls
`rms_rope_split_half`, Ernie-Image's `apply_rope_split_half`; MiniMax H3's calls `rms_rope_split_half`
exactly when the flag is set, its in-place variant otherwise), so LoRA backward fails there with
"no autograd formula was registered".

This fix registers, for each such op that comfy-kitchen's eager backend also implements in plain
torch, a backward that recomputes the eager implementation under autograd and differentiates it
(a vector-Jacobian product of the very function the op computes). The forward is untouched: the
fused kernel still runs. The probe admits the fix per block class like any other (same output as
before, backward runs, checkpointed gradients equal plain ones), and tests/with_comfy/test_patches.py checks
the gradients against autograd through the eager code.
"""
from __future__ import annotations

import importlib

import torch

from .fixes import Fix

# Math ops only (not quantisation); in-place variants (trailing '_') are inference-only upstream.
_PREFIXES = ("apply_rope", "rms_rope", "adaln", "rms_adaln")
_registered: dict[str, object] = {}  # op qualname -> its CustomOpDef, while our formula is in


def _opdef(qualname: str):
    from torch._library import (
        custom_ops,  # the registry of torch.library.custom_op definitions
    )

    return custom_ops.OPDEFS.get(qualname)


def candidates() -> dict[str, object]:
    """op name -> eager reference function, for the fused math ops that have no backward."""
    try:
        eager = importlib.import_module("comfy_kitchen.backends.eager")
    except ImportError:  # ComfyUI 0.3.x: no comfy-kitchen
        return {}
    out = {}
    for name in getattr(eager, "__all__", ()):
        if name.endswith("_") or not name.startswith(_PREFIXES):
            continue
        opdef = _opdef(f"comfy_kitchen::{name}")
        if opdef is not None and opdef._backward_fn is None and callable(getattr(eager, name, None)):
            out[name] = getattr(eager, name)
    return out


def _formula(reference):
    def setup_context(ctx, inputs, output):
        ctx.kinds = [torch.is_tensor(v) for v in inputs]
        ctx.others = [None if torch.is_tensor(v) else v for v in inputs]
        ctx.save_for_backward(*[v for v in inputs if torch.is_tensor(v)])

    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        args = []
        for is_tensor, other in zip(ctx.kinds, ctx.others):
            if not is_tensor:
                args.append(other)
                continue
            t = next(saved).detach()
            args.append(t.requires_grad_(True) if t.is_floating_point() else t)
        with torch.enable_grad():
            out = reference(*args)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        wrt = [a for a in args if torch.is_tensor(a) and a.requires_grad]
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
                   if pairs else [None] * len(wrt))
        return tuple(next(got) if torch.is_tensor(a) and a.requires_grad else None for a in args)
    return setup_context, backward


def register() -> None:
    for name, reference in candidates().items():
        qualname = f"comfy_kitchen::{name}"
        setup_context, backward = _formula(reference)
        torch.library.register_autograd(qualname, backward, setup_context=setup_context)
        _registered[qualname] = _opdef(qualname)


def unregister() -> None:
    """Back to comfy-kitchen's own state (no formula), so the probe measures upstream as it is."""
    while _registered:
        _, opdef = _registered.popitem()
        opdef._backward_fn = None
        opdef._setup_context_fn = None


FIXES = (
    Fix("comfy-kitchen backward", "comfy_kitchen", ("*",), {}, since="0.33.0", before=None,
        apply=register, undo=unregister),
)
