"""The one place that makes the host ComfyUI importable (DESIGN.md: nothing else touches sys.path).

ComfyUI does not parse argv when imported as a library, so the flags its server would set
(CPU mode on machines without CUDA) are set here, before `comfy.model_management` is imported.
"""
from __future__ import annotations

import os
import sys


def import_comfy(comfyui_root: str, force_cpu: bool | None = None, pytorch_attention: bool = False) -> None:
    """Put `comfyui_root` first on sys.path and configure ComfyUI for headless use.

    pytorch_attention: use PyTorch SDPA (ComfyUI's GPU default) on the CPU too, as its
    --use-pytorch-cross-attention flag does (FLOP counting on the meta device needs it).
    """
    root = os.path.abspath(comfyui_root)
    if not os.path.isfile(os.path.join(root, "comfy", "sd.py")):
        raise FileNotFoundError(f"{root} is not a ComfyUI folder (no comfy/sd.py); set the ComfyUI path correctly.")
    if "comfy" in sys.modules:  # already inside a ComfyUI process (or bootstrapped before)
        return
    # First on sys.path: ComfyUI's own top-level `nodes.py` / `utils/` must win over any
    # same-named folder of the working directory (PipeTrain has a `nodes/` package).
    sys.path.insert(0, root)
    import torch

    try:
        import comfy.cli_args

        if force_cpu is None:
            force_cpu = not torch.cuda.is_available()
        comfy.cli_args.args.cpu = bool(force_cpu)
        comfy.cli_args.args.disable_smart_memory = True
        if pytorch_attention:
            comfy.cli_args.args.use_pytorch_cross_attention = True
        import comfy.model_management  # noqa: F401  (reads the flags above once)
    except ModuleNotFoundError as e:  # newer ComfyUI imports comfy-aimdo / comfy-kitchen at import time
        if e.name and e.name.split(".")[0] not in ("comfy", "comfy_extras"):
            raise ImportError(f"ComfyUI at {root} needs the Python package '{e.name}', which this Python "
                              f"({sys.executable}) does not have: install ComfyUI's requirements into it "
                              f"(python -m pip install -r {os.path.join(root, 'requirements.txt')}).") from e
        raise
