"""Pipeline and data parallel speed on GPUs: a full-size random-init model trained through PipeTrain's engine.

    COMFYUI_PATH=... python benchmarks/pipeline.py --out /tmp/bench --model flux_dev --size 1024
    COMFYUI_PATH=... python benchmarks/pipeline.py --out /tmp/bench --model wan21_1_3b --size 512 --frames 33
    COMFYUI_PATH=... python benchmarks/pipeline.py --out /tmp/bench --model wan21_14b --gpus 4 --split 11,21,31
    COMFYUI_PATH=... python benchmarks/pipeline.py --out /tmp/bench --model wan21_14b --size 1280 --height 720 \\
        --frames 81 --gpus 8 --samples 32 --checkpointing
    COMFYUI_PATH=... python benchmarks/pipeline.py --out /tmp/bench --tiny --gpus 8     # CPU dry run, gloo ranks

Writes a random-init model file of the chosen shape (benchmarks/model_shapes.py: ComfyUI's own class
with the released model's configuration; random weights do the same work as trained ones) and a
synthetic latent cache, then trains the same LoRA (rank 32, every block linear) with the same seed
and the same --samples samples per optimizer step (grad_accum = samples / data-parallel replicas) on
each grid and prints step times:
  --gpus 2: 1 GPU, 2 stages, 2-way data parallel;
  --gpus 4: also 2 stages x 2 replicas and 4 stages (--split);
  --gpus 8: also 2 stages x 4 replicas, 4 x 2 and 8 stages;
with --pp2-splits more 2-stage runs cut at the given layer indices.
GPipe's ideal speed-up for S stages, m micro-batches and R replicas is R*S*m/(m+S-1) (2 stages, m=8: 1.78x).
All runs see the same samples per step, so their losses and saved LoRAs must match (printed per run
against the 1-GPU run). --tiny: an 8-block tiny Wan on CPU processes (gloo), to check the grids and
their equality without GPUs; its times mean nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import setup  # noqa: E402


def grid_plan(gpus: int, samples: int, split: str, split8: str, pp2_splits: str) -> list[tuple[str, int, int, int, str]]:
    """(name, GPUs, stages, grad_accum, split) per run; every run trains `samples` samples per step."""
    grids = [(1, 1), (2, 2), (2, 1)]  # (GPUs, stages)
    if gpus >= 4:
        grids += [(4, 2), (4, 4)]
    if gpus >= 8:
        grids += [(8, 2), (8, 4), (8, 8)]
    plan = []
    for n, stages in grids:
        replicas = n // stages
        if samples % replicas:
            raise SystemExit(f"--samples {samples} is not divisible by the {replicas} replicas of {n} GPUs / {stages} stages")
        gas = samples // replicas
        name = "gpu1" if n == 1 else (f"pp{stages}" if replicas == 1 else f"pp{stages}xdp{replicas}" if stages > 1
                                       else f"dp{replicas}")
        plan.append((f"{name}_gas{gas}", n, stages, gas, {4: split, 8: split8}.get(stages, "") if n == stages else ""))
    plan += [(f"pp2_gas{samples}_split{i}", 2, 2, samples, i) for i in filter(None, pp2_splits.split(","))]
    return plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="wan21_1_3b", help="a shape of benchmarks/model_shapes.py")
    parser.add_argument("--size", type=int, default=512, help="width in pixels")
    parser.add_argument("--height", type=int, default=0, help="height in pixels (default: --size)")
    parser.add_argument("--frames", type=int, default=33, help="video models only")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8, help="samples per optimizer step, the same for every run")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--gpus", type=int, default=2, choices=(2, 4, 8), help="the largest grid to run")
    parser.add_argument("--split", default="", help="memory.pipeline_split for the 4-stage run (default: balanced)")
    parser.add_argument("--split8", default="", help="memory.pipeline_split for the 8-stage run (default: balanced)")
    parser.add_argument("--pp2-splits", default="", help="comma list of layer indices: one more 2-stage run per "
                        "index, stage 2 starting there (memory.pipeline_split), named pp2_gas<samples>_split<index>")
    parser.add_argument("--runs", default="", help="comma list of run names to do (default: all)")
    parser.add_argument("--blocks", type=int, default=0, help="cut each block list to this many blocks "
                        "(model_shapes.shallow: released widths, fewer blocks; 0 = the released depth)")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run on an 8-block tiny Wan (gloo processes)")
    args = parser.parse_args()
    if args.tiny:
        args.model, args.size, args.frames, args.steps = "tiny_wan_8blocks", 64, 9, 3

    setup(pytorch_attention=not args.tiny)
    from engine_bench import lora_drift, run_engine, write_cache
    from model_shapes import SHAPES
    from shape_files import write_random

    shape = SHAPES[args.model]
    if args.blocks:
        from model_shapes import DETECTION_PINS_DEPTH, shallow

        if shape.family in DETECTION_PINS_DEPTH:
            raise SystemExit(f"--blocks: ComfyUI's detection does not read a {shape.family} file's depth (it would load "
                             "the released depth with blocks missing); run it without --blocks")
        shape = shallow(shape, args.blocks)
    frames = args.frames if shape.video else 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model = out / f"{args.model}{f'_{args.blocks}blocks' if args.blocks else ''}_random.safetensors"
    if not model.exists():
        params = write_random(shape, model)
        print(f"model {params / 1e9:.2f} B params written in {time.time() - t0:.0f} s", flush=True)
    cache = write_cache(out, shape, args.size, frames, items=max(16, args.samples), height=args.height)
    memory = {"activation_checkpointing": "on" if args.checkpointing else "off"}
    wanted = set(filter(None, args.runs.split(",")))
    results = []
    for name, gpus, stages, gas, split in grid_plan(args.gpus, args.samples, args.split, args.split8, args.pp2_splits):
        if wanted and name not in wanted:
            continue
        results.append(run_engine(name, str(model), cache, out, gpus=gpus, stages=stages, grad_accum=gas,
                                  split=split, steps=args.steps, memory=memory))
        print(json.dumps(results[-1]), flush=True)
    ok = [r for r in results if "step_s" in r]
    if not ok:
        return 1
    base = next((r["step_s"] for r in ok if r["gpus"] == 1), None)
    print(f"\n{args.model}{f' ({args.blocks} blocks per list)' if args.blocks else ''} random-init, {args.size}x{args.height or args.size}" + (f"x{frames}" if shape.video else "") +
          f", LoRA r32 all block linears, bf16, checkpointing {'on' if args.checkpointing else 'off'}, "
          f"{args.samples} samples per step")
    print("| run | GPUs | stages | gas | s/step | samples/s | speed-up vs 1 GPU | ideal | % of ideal | peak GiB | "
          "launch->1st loss s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "step_s" not in r:
            print(f"| {r['run']} | {r['gpus']} | {r['stages']} | {r['grad_accum']} | {r['error']} | | | | | | |")
            continue
        s, m = r["stages"], r["grad_accum"]
        ideal = (r["gpus"] // s) * s * m / (m + s - 1)
        speed = f"{base / r['step_s']:.2f}x" if base else "-"
        share = f"{100 * base / r['step_s'] / ideal:.0f}%" if base else "-"
        print(f"| {r['run']} | {r['gpus']} | {s} | {m} | {r['step_s']:.3f} | {r['samples_per_s']:.2f} | {speed} | "
              f"{ideal:.2f}x | {share} | {r['peak_gib']:.1f} | {r['launch_to_first_step_s']:.0f} |")
    ref = ok[0]
    for r in ok[1:]:
        drift = max(abs(a - b) / max(abs(a), 1e-8) for a, b in zip(r["losses"], ref["losses"]))
        print(f"{r['run']}: largest relative loss difference from {ref['run']} {drift:.2e}; saved LoRA "
              f"largest |difference| / largest |weight| {lora_drift(out / r['run'], out / ref['run']):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
