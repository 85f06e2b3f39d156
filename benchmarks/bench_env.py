"""Setup shared by the benchmark scripts: the repository as package `PipeTrain`, and ComfyUI imported.

Run the scripts from anywhere with COMFYUI_PATH set to a ComfyUI folder; they import the pack the
way ComfyUI does (package `PipeTrain`), so `PipeTrain.engine...` works without installing anything.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def setup(pytorch_attention: bool = False) -> str:
    """Import the pack as `PipeTrain` and ComfyUI from $COMFYUI_PATH; returns that path."""
    if "PipeTrain" not in sys.modules:
        spec = importlib.util.spec_from_file_location("PipeTrain", REPO / "__init__.py",
                                                      submodule_search_locations=[str(REPO)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["PipeTrain"] = module
        spec.loader.exec_module(module)
    root = os.environ.get("COMFYUI_PATH")
    if not root:
        raise SystemExit("set COMFYUI_PATH to a ComfyUI folder (scripts/bootstrap.sh prints one)")
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(root, pytorch_attention=pytorch_attention)
    return root
