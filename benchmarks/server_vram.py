"""VRAM a ComfyUI server process still holds after TrainPipeline frees it for the training ranks.

    COMFYUI_PATH=... python benchmarks/server_vram.py --work /tmp/vram [--shape flux_dev --blocks 4]

Before launching the ranks, TrainPipeline unloads what the server holds on the GPU
(nodes/compat.free_accelerator_memory); it does the same after decoding each sample image while
training runs. ComfyUI 0.33 and later load models as a dynamic-VRAM `ModelPatcherDynamic`
(comfy-aimdo) when the host supports it, with their own cast buffers and VRAM reservations. This
script sets ComfyUI up the way its main.py does (comfy-aimdo initialised and the dynamic patcher
chosen where the package is installed; smart memory on), loads a random model of the shape's
released widths (--blocks blocks per block list) with ComfyUI's own loader, runs one denoising
forward through ComfyUI's model management, frees, and prints the device memory in use (CUDA's
free/total, which also counts memory outside torch's allocator) at each point. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

MIB = 1024 ** 2


def init_like_main(root: str) -> bool:
    """Import ComfyUI as its main.py sets it up for a GPU; True when dynamic VRAM is on."""
    sys.path.insert(0, os.path.abspath(root))
    try:
        import comfy_aimdo.control as aimdo
    except ImportError:  # ComfyUI 0.3.x: no dynamic VRAM
        aimdo = None
    if aimdo is not None:
        aimdo.init()
    import comfy.model_management as mm
    import comfy.model_patcher
    if aimdo is None or not hasattr(comfy.model_patcher, "ModelPatcherDynamic"):
        return False
    try:
        ready = aimdo.init_devices((d.index, 0) for d in mm.get_all_torch_devices())
    except TypeError:  # older comfy-aimdo protocol
        ready = aimdo.init_devices(d.index for d in mm.get_all_torch_devices())
    if ready:
        import comfy.memory_management

        comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
        comfy.memory_management.aimdo_enabled = True
    return bool(ready)


def in_use_mib() -> float:
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free) / MIB


def warm_up(device) -> None:
    """Load the CUDA libraries a forward pulls in (cuBLAS workspace, attention kernels) before the
    baseline, so that what stays after a free is what the model left, not a library's one-time cost."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(256, 256, device=device, dtype=torch.bfloat16)
    q = torch.randn(1, 8, 256, 64, device=device, dtype=torch.bfloat16)
    (x @ x).float().sum().item()
    F.scaled_dot_product_attention(q, q, q).float().sum().item()
    del x, q
    torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="folder for the random model file")
    parser.add_argument("--shape", default="flux_dev")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--size", type=int, default=1024, help="image side of the forward's latent")
    args = parser.parse_args()
    root = os.environ.get("COMFYUI_PATH")
    if not root:
        raise SystemExit("set COMFYUI_PATH to a ComfyUI folder")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("server_vram.py needs a CUDA GPU")
    dynamic = init_like_main(root)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_env import setup

    setup()  # the pack as `PipeTrain`; ComfyUI is imported already, so its settings stay main.py's
    import comfy.model_management as mm
    import comfy.sd

    from model_shapes import SHAPES, shallow
    from shape_cond import sample_cond
    from shape_files import write_random
    from PipeTrain.engine.train.objective import DiffusionObjective, transformer_options
    from PipeTrain.nodes.compat import free_accelerator_memory

    shape = shallow(SHAPES[args.shape], blocks=args.blocks)
    path = Path(args.work) / f"{args.shape}_{args.blocks}blocks.safetensors"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_random(shape, path)
    device = mm.get_torch_device()
    warm_up(device)
    rows = {"context": in_use_mib()}
    for cycle in (1, 2):  # the second cycle shows whether anything left after a free grows per load
        patcher = comfy.sd.load_diffusion_model(str(path))
        mm.load_models_gpu([patcher])
        model = patcher.model
        latents = torch.randn((1, *shape.latent(args.size))).to(device)
        cond = sample_cond(shape, device=str(device), size=args.size)
        prepared = DiffusionObjective(model, seed=0).prepare(latents, [cond], [0])
        with torch.no_grad():
            model.apply_model(prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma),
                              **prepared.kwargs)
        rows[f"after forward {cycle}"] = in_use_mib()
        del prepared, latents, cond, model
        free_accelerator_memory()  # the server keeps `patcher` (its node cache does), as here
        rows[f"after free {cycle}"] = in_use_mib()
        rows[f"torch reserved after free {cycle}"] = torch.cuda.memory_reserved() / MIB
    model_mib = path.stat().st_size / MIB
    held = rows["after free 2"] - rows["context"]
    result = {"comfyui": mm.__file__.split(os.sep)[-3], "patcher": type(patcher).__name__, "dynamic_vram": dynamic,
              "model_file_mib": round(model_mib), **{k: round(v) for k, v in rows.items()},
              "held_after_free_mib": round(held), "freed": held < 0.05 * model_mib}
    print(json.dumps(result))
    return 0 if result["freed"] else 1


if __name__ == "__main__":
    sys.exit(main())
