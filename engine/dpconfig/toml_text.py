"""A small TOML writer for the flat tables a diffusion-pipe config has: top-level keys, [tables] of scalars
and lists, and [[arrays of tables]]. Strings, booleans, numbers and (nested) lists only; tomllib reads the
result back (the tests check that). No dependency."""
from __future__ import annotations

import math
from typing import Any


def value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML has no {value!r} here")
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        if "'" not in value and "\n" not in value:
            return f"'{value}'"  # a literal string: backslashes (Windows paths) stay as typed
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def toml_text(data: dict[str, Any], header: str = "") -> str:
    """data: scalar/list keys first, then dict values as [tables], lists of dicts as [[arrays]]."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    plain = {k: v for k, v in data.items() if not isinstance(v, dict) and not _table_list(v)}
    lines += [f"{k} = {value_text(v)}" for k, v in plain.items()]
    for key, value in data.items():
        if isinstance(value, dict):
            lines += ["", f"[{key}]"] + [f"{k} = {value_text(v)}" for k, v in value.items()]
        elif _table_list(value):
            for entry in value:
                lines += ["", f"[[{key}]]"] + [f"{k} = {value_text(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def _table_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)
