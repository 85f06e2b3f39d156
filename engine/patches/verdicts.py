"""The probe's verdicts, kept per (block class, ComfyUI version, ...) so a class is probed once.

The key holds everything a verdict depends on: the block class, the host's ComfyUI and torch
versions, the block's structure (its submodule types, parameter shapes and dtypes, and its plain
settings such as flags and sizes), the device type, what the caller says about the call (which
conditioning it carries), and a digest of PipeTrain's own fixes (an update of ours re-probes).
The file is JSON, written temp-then-rename, and a corrupt or foreign file is ignored.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn

_FORMAT = 1
_SIMPLE = (bool, int, float, str, type(None))


def _fixes_digest() -> str:
    h = hashlib.sha256()
    folder = Path(__file__).parent
    for path in sorted(folder.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def block_structure(block: nn.Module) -> str:
    """A digest of what can change a block's code path: its modules, weights and plain settings."""
    h = hashlib.sha256()
    for name, module in block.named_modules():
        h.update(f"{name}:{type(module).__module__}.{type(module).__qualname__}".encode())
        for key, value in sorted(vars(module).items()):
            if not key.startswith("_") and isinstance(value, _SIMPLE):
                h.update(f"{key}={value!r}".encode())
        for pname, p in module.named_parameters(recurse=False):
            h.update(f"{pname}{tuple(p.shape)}{p.dtype}".encode())
    return h.hexdigest()[:16]


def verdict_key(cls: type, block: nn.Module, version: str, device: torch.device | str, context: str = "") -> str:
    parts = (f"{cls.__module__}.{cls.__qualname__}", f"comfyui={version}", f"torch={torch.__version__}",
             f"device={torch.device(device).type}", f"block={block_structure(block)}", f"call={context}",
             f"fixes={_fixes_digest()}")
    return "|".join(parts)


class VerdictStore:
    """Verdicts: key -> {"use": "upstream" | [fix names] | None (refused), "reason": str}."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else None
        self._data: dict[str, dict] = {}
        self._dirty = False
        if self.path is not None and self.path.is_file():
            try:
                loaded = json.loads(self.path.read_text())
                if loaded.get("format") == _FORMAT:
                    self._data = dict(loaded.get("verdicts", {}))
            except (OSError, ValueError, AttributeError):
                self._data = {}

    def get(self, key: str) -> dict | None:
        return _MEMO.get(key) or self._data.get(key)

    def put(self, key: str, verdict: dict) -> None:
        _MEMO[key] = verdict
        self._data[key] = verdict
        self._dirty = True

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"format": _FORMAT, "verdicts": self._data}, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:  # a read-only output folder only costs a re-probe next time
            pass
        self._dirty = False


_MEMO: dict[str, dict] = {}  # this process's verdicts, also when no file is given
