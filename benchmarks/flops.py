"""FLOPs of one LoRA training sample, counted on ComfyUI's own forward (no GPU, no memory).

The model is built on the 'meta' device and run once under torch's FlopCounterMode with the same
conditioning path the engine uses (engine.train.objective.model_kwargs -> apply_model), so the count
follows whatever ComfyUI's forward does. Run with PyTorch SDPA attention (the GPU path), so
attention is counted as attention.

Per sample, with the base frozen and LoRA trained:
  linear (matmuls of the base):  forward + input-gradient          = 2 x forward
  attention (SDPA):              forward + its two backward matmuls = 3 x forward
  LoRA (its A/B matmuls):        forward + input + weight gradients = 3 x forward
  model FLOPs = 2 L + 3 A + 3 R; activation checkpointing adds one forward (L + A + R) of hardware
  work, which MFU does not count (MFU = model FLOPs / time / peak).
"""
from __future__ import annotations

from dataclasses import dataclass

# On the meta device SDPA runs its math path, whose matmuls are batched (bmm); the models here use
# bmm nowhere else, so bmm counts as attention.
_ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention", "bmm")


_VERBOSE = False


@dataclass(frozen=True)
class StepFlops:
    linear: float  # forward FLOPs of the base model's matmuls/convolutions
    attention: float  # forward FLOPs of attention
    lora: float  # forward FLOPs of the LoRA layers

    @property
    def model(self) -> float:
        return 2 * self.linear + 3 * self.attention + 3 * self.lora

    @property
    def recompute(self) -> float:
        return self.linear + self.attention + self.lora


def _forward_flops(model, latent_shape, cond) -> tuple[float, float]:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from meta_run import meta_autocast, meta_kwargs

    x0 = torch.zeros((1, *latent_shape))
    with meta_autocast():
        kwargs = meta_kwargs(model, x0, cond)
        x0 = x0.to("meta")
        sigma = torch.full((1,), 0.5, device="meta")
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model.apply_model(x0, sigma, transformer_options={}, **kwargs)
    attention = sum(v for op, v in counter.get_flop_counts()["Global"].items()
                    if any(name in str(op) for name in _ATTENTION_OPS))
    if _VERBOSE:
        print({str(op): f"{v / 1e12:.2f}T" for op, v in counter.get_flop_counts()["Global"].items()})
    return float(counter.get_total_flops() - attention), float(attention)


def step_flops(shape, size: int, frames: int = 1, lora_rank: int = 32, lora_targets: str = "all_linear") -> StepFlops:
    """FLOPs of one sample of `shape` (benchmarks.model_shapes) at size x size (x frames)."""
    import torch

    from PipeTrain.engine.config.sections import LoraSpec
    from PipeTrain.engine.train.lora import inject_lora

    from model_shapes import build
    from shape_cond import sample_cond

    latent = shape.latent(size, frames)
    cond = sample_cond(shape)
    model = build(shape)
    model.model_sampling.to("meta")
    base_linear, attention = _forward_flops(model, latent, cond)
    torch.manual_seed(0)
    inject_lora(model.diffusion_model, LoraSpec(rank=lora_rank, targets=lora_targets))
    with_lora, _ = _forward_flops(model, latent, cond)
    return StepFlops(linear=base_linear, attention=attention, lora=with_lora - base_linear)


def main() -> None:
    import argparse

    from bench_env import setup
    from model_shapes import SHAPES

    parser = argparse.ArgumentParser(description="FLOPs per training sample of the benchmark shapes")
    parser.add_argument("shapes", nargs="*", default=list(SHAPES))
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--rank", type=int, default=32)
    args = parser.parse_args()
    setup(pytorch_attention=True)
    print("| shape | size | linear fwd TF | attention fwd TF | LoRA fwd TF | model TF/sample | + recompute TF |")
    print("|---|---|---|---|---|---|---|")
    for name in args.shapes:
        shape = SHAPES[name]
        size = 512 if shape.video and args.size == 1024 else args.size
        f = step_flops(shape, size, args.frames, args.rank)
        dims = f"{size}x{size}" + (f"x{args.frames}" if shape.video else "")
        print(f"| {name} | {dims} | {f.linear / 1e12:.2f} | {f.attention / 1e12:.2f} | {f.lora / 1e12:.3f} | "
              f"{f.model / 1e12:.1f} | {f.recompute / 1e12:.1f} |", flush=True)


if __name__ == "__main__":
    main()
