"""A real Python environment in which DeepSpeed is not installed, for the DeepSpeed-free tests.

Building a second full environment would cost minutes and gigabytes, so this one is a fresh venv
whose site-packages points (through a .pth file) at a folder of symlinks to every package of the
project's environment except DeepSpeed. DeepSpeed's files are simply not on that interpreter's
path: `import deepspeed` fails the way it does on a machine where it was never installed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path


def make_env(root: Path) -> str:
    """Create the environment under root; returns its python executable."""
    farm = root / "packages"
    farm.mkdir(parents=True)
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if entry.name.lower().startswith("deepspeed"):
            continue
        (farm / entry.name).symlink_to(entry)
    venv = root / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    venv_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                    capture_output=True, text=True, check=True).stdout.strip())
    (venv_site / "pipetrain_packages.pth").write_text(f"import site; site.addsitedir({str(farm)!r})\n")
    return str(python)
