"""What ComfyUI's training flag changes in the samples a training process renders.

    COMFYUI_PATH=... python benchmarks/training_flag.py --shapes flux_dev,wan21_1_3b,z_image,ltxv_2b

PipeTrain sets `comfy.model_management.in_training` (ComfyUI 0.33 and later) in every training
process, sample rendering included (engine/patches/host.py). With it on, ComfyUI runs plain torch
rope / norm code instead of comfy-kitchen's fused kernels. This script samples the same model, seed
and conditioning twice with ComfyUI's Euler sampler (ComfyUI's own `simple` schedule, 8 steps,
apply_model with the cache-style conditioning the engine feeds, engine.train.objective.model_kwargs):
flag off (what the ComfyUI server renders) and on (what PipeTrain's ranks render), and prints the
difference of the final latents relative to their scale, and the time per step each way. Released
widths cut to --blocks blocks per list, random bf16 weights, on CUDA. On a CPU both runs use
comfy-kitchen's eager code and agree exactly. On ComfyUI 0.3.x (no flag) it says so and stops.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import setup  # noqa: E402


def sample(model, latents, cond, steps: int, seed: int):
    import comfy.samplers
    import torch

    from PipeTrain.engine.train.objective import model_kwargs, transformer_options

    ms = model.model_sampling
    sigmas = comfy.samplers.calculate_sigmas(ms, "simple", steps).to(latents.device)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(latents.shape, generator=gen).to(latents.device)
    x0 = model.process_latent_in(latents)
    kwargs = model_kwargs(model, [cond], x0, noise)
    x = ms.noise_scaling(sigmas[0], noise, torch.zeros_like(x0), max_denoise=True)
    torch.cuda.synchronize() if x.is_cuda else None
    started = time.time()
    with torch.no_grad():
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            sigma = s.reshape(1)
            denoised = model.apply_model(x, sigma, transformer_options=transformer_options(sigma), **kwargs)
            x = x + (x - denoised) / s * (s_next - s)  # Euler on ComfyUI's (x - denoised) / sigma
    torch.cuda.synchronize() if x.is_cuda else None
    return x.float(), (time.time() - started) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="flux_dev,wan21_1_3b,z_image,ltxv_2b")
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    setup(pytorch_attention=cuda)
    import comfy.model_management as mm

    from model_shapes import SHAPES, build, shallow
    from shape_cond import sample_cond
    from shape_files import random_state
    from PipeTrain.engine.patches.host import comfy_version

    if not hasattr(mm, "in_training"):
        print(f"ComfyUI {comfy_version()} has no training flag: nothing to compare")
        return 0
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    print(f"ComfyUI {comfy_version()}, torch {torch.__version__}, {torch.cuda.get_device_name(0) if cuda else 'CPU'}")
    print("| shape | latent | flag off: s/step | flag on: s/step | max abs diff / max abs | mean abs diff / mean abs |")
    print("|---|---|---|---|---|---|")
    for name in args.shapes.split(","):
        shape = shallow(SHAPES[name], args.blocks) if args.blocks else SHAPES[name]
        model = build(shape, device="cpu", dtype=torch.bfloat16 if cuda else torch.float32)
        model.diffusion_model.load_state_dict(random_state(model.diffusion_model))
        model.diffusion_model.to(device)
        model.model_sampling.to(device)
        frames = args.frames if shape.video else 1
        latents = torch.zeros((1, *shape.latent(args.size, frames)), device=device)
        cond = sample_cond(shape, device=str(device), size=args.size, frames=frames)
        out = {}
        for flag in (False, True, False):  # off twice: the first run warms the kernels up
            mm.in_training = flag
            out[flag] = sample(model, latents, cond, args.steps, seed=0)
        mm.in_training = False
        (off, t_off), (on, t_on) = out[False], out[True]
        rel_max = float((on - off).abs().max() / off.abs().max().clamp_min(1e-12))
        rel_mean = float((on - off).abs().mean() / off.abs().mean().clamp_min(1e-12))
        print(f"| {name} | {tuple(latents.shape[1:])} | {t_off:.3f} | {t_on:.3f} | {rel_max:.2e} | {rel_mean:.2e} |")
        del model
        if cuda:
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
