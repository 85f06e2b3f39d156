"""What every tiny asset writer shares: seeded initialisation of ComfyUI's (uninitialised) layers,
one random stream per tensor name, and files written atomically (safetensors with a provenance
note, text). Used by tools/tiny_models.py, tools/tiny_dataset.py and tools/tiny_families.py.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bump whenever any generator (tiny_models, tiny_dataset, tiny_families) would write different bytes:
# tiny_assets.write_demo_base then rewrites.
CONTENT_VERSION = 1


def _ensure_comfy() -> None:
    """Make `comfy.*` importable: in-process tools may run before anything else touched ComfyUI."""
    if "comfy" in sys.modules:  # inside a ComfyUI server, or bootstrapped already
        return
    from engine.launch.comfy_bootstrap import import_comfy

    import_comfy(os.environ.get("COMFYUI_PATH") or os.path.join(REPO_ROOT, ".comfyui", "ComfyUI"))


def _one_thread(fn):
    """Run `fn` with one intra-op thread. Generating weights is memory-bound, so a second thread
    gains little; on a busy 2-core machine it made writing the demo files 2-5x slower (3.3 s with
    one thread, 6.5-17.6 s with two), the threads waiting on each other behind other processes."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return wrapper


# ---------------------------------------------------------------- seeded initialisation

def _generator(seed: int, name: str) -> torch.Generator:
    # One random stream per tensor name: a tensor's values depend neither on iteration order nor
    # on which other layers exist, so a ComfyUI update that adds a layer leaves the rest as is.
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def _normal(shape, std: float, seed: int, name: str) -> torch.Tensor:
    return torch.randn(shape, generator=_generator(seed, name)) * std


# Normalisation layers: weight 1, bias 0. Newer ComfyUIs build Flux-style q/k norms as torch's RMSNorm
# (its gain is `weight`); 0.3.75 has its own class with a `scale`, matched by name below.
_NORMS = (torch.nn.GroupNorm, torch.nn.LayerNorm) + ((torch.nn.RMSNorm,) if hasattr(torch.nn, "RMSNorm") else ())


@torch.no_grad()
def _init_all(module: torch.nn.Module, seed: int, skip: tuple[str, ...] = ()) -> None:
    """Norms 1/0, biases 0, embeddings N(0, 1), other weights N(0, 1/fan_in); nothing left empty."""
    for mod_name, mod in module.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if full in skip:
                continue
            if isinstance(mod, _NORMS):
                p.fill_(1.0 if p_name == "weight" else 0.0)
            elif p_name == "bias":
                p.zero_()
            elif p_name == "scale" and p.dim() == 1:  # ComfyUI's own RMSNorm gains (Flux-style q/k norms)
                p.fill_(1.0)
            elif isinstance(mod, torch.nn.Embedding):
                p.copy_(_normal(p.shape, 1.0, seed, full))  # one-hot input: fan_in is 1
            elif p.dim() >= 2:
                p.copy_(_normal(p.shape, p[0].numel() ** -0.5, seed, full))
            else:
                raise ValueError(f"tiny_assets has no init rule for parameter {full} {tuple(p.shape)}: add one.")
    # None of today's classes has buffers; one appearing upstream would be torch.empty garbage.
    buffers = [name for name, _ in module.named_buffers()]
    if buffers:
        raise ValueError(f"tiny_assets does not know how to fill buffers {buffers}: add a rule.")


def _save(tensors: dict[str, torch.Tensor], path: str, dtype: torch.dtype, seed: int) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().to(dtype).contiguous() for k, v in tensors.items()}
    for name, t in tensors.items():  # after the cast: an fp16 overflow would show up as inf here
        if not torch.isfinite(t).all():
            raise ValueError(f"tiny_assets produced non-finite values in {name}")
    meta = {"pipetrain.tiny_assets": f"random-init test weights, content v{CONTENT_VERSION}, seed {seed}"}
    _atomic(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def _write_text(path: str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    _atomic(path, write)


def _atomic(path: str, write) -> None:
    """write(tmp) then rename: a killed run never leaves a half file that looks complete."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # safetensors creates 0600 files; other users' servers must read them
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
