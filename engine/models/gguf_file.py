"""Reading a GGUF diffusion-model file (the format the ComfyUI-GGUF node pack loads) without torch.

A GGUF file holds the diffusion model's state dict under its usual key names (sometimes behind a
`model.diffusion_model.` prefix), each tensor either plain (F32, F16, BF16) or in one of ggml's
block-quantized types (Q8_0, Q4_K, ...), with its dimensions listed innermost first. Conversion tools
that had to reshape a tensor store its real shape as `comfy.gguf.orig_shape.<name>`. The tensors stay
memory-mapped: `GGUFTensor.raw` is a view into the file. Reading needs the `gguf` package from PyPI,
which ComfyUI-GGUF also installs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

PREFIX = "model.diffusion_model."
PLAIN_TYPES = ("F32", "F16", "BF16")


class GGUFError(RuntimeError):
    pass


@dataclass(frozen=True)
class GGUFTensor:
    key: str  # the state-dict key (prefix removed)
    qtype: str  # ggml's type name: F32, F16, BF16, Q8_0, Q4_K, ...
    shape: tuple[int, ...]  # torch order (outermost first), the original shape where the file records one
    raw: np.ndarray  # the stored bytes or values, memory-mapped

    @property
    def quantized(self) -> bool:
        return self.qtype not in PLAIN_TYPES


@dataclass(frozen=True)
class GGUFContents:
    path: str
    architecture: str  # general.architecture ("flux", "wan", "sdxl", ...); "" when the file names none
    tensors: tuple[GGUFTensor, ...]

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.qtype] = counts.get(t.qtype, 0) + 1
        return counts


def is_gguf(path: str) -> bool:
    return str(path).lower().endswith(".gguf")


def gguf_module():
    try:
        import gguf
    except ImportError:
        raise GGUFError("training on a GGUF file needs the 'gguf' package in ComfyUI's Python: run "
                        "`python -m pip install gguf` with the Python that runs ComfyUI (ComfyUI-GGUF installs it "
                        "too), or train on the .safetensors file of the model.") from None
    return gguf


def _field_text(reader, name: str) -> str:
    field = reader.get_field(name)
    if field is None or not field.data:
        return ""
    return bytes(field.parts[field.data[-1]]).decode("utf-8", errors="replace")


def _field_ints(reader, name: str) -> tuple[int, ...] | None:
    field = reader.get_field(name)
    if field is None:
        return None
    return tuple(int(field.parts[i][0]) for i in field.data)


def read_gguf(path: str) -> GGUFContents:
    """The file's tensors (memory-mapped) and architecture, refused with the reason when it is no GGUF."""
    gguf = gguf_module()
    if not os.path.isfile(path):
        raise GGUFError(f"GGUF file {path} does not exist.")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - any parse failure is a file the user must replace
        raise GGUFError(f"{path} cannot be read as a GGUF file ({type(e).__name__}: {e}). Is it complete? Download "
                        "it again, or train on the model's .safetensors file.") from None
    names = [t.name for t in reader.tensors]
    strip = any(n.startswith(PREFIX) for n in names)
    tensors = []
    for t in reader.tensors:
        if strip and not t.name.startswith(PREFIX):
            continue  # a checkpoint's text encoder or VAE: not the diffusion model
        key = t.name[len(PREFIX):] if strip else t.name
        shape = _field_ints(reader, f"comfy.gguf.orig_shape.{t.name}") or tuple(int(d) for d in reversed(t.shape))
        qtype = getattr(t.tensor_type, "name", str(t.tensor_type))
        tensors.append(GGUFTensor(key, qtype, shape, np.asarray(t.data)))
    if not tensors:
        raise GGUFError(f"{path} holds no tensors: it is not a diffusion model.")
    return GGUFContents(path, _field_text(reader, "general.architecture"), tuple(tensors))
