"""Pipeline and data parallel speed on GPUs: a full-size random-init model trained through PipeTrain's engine.

    COMFYUI_PATH=... python benchmarks/pipeline.py --out /tmp/bench --model flux_dev --size 1024
    COMFYUI_PATH=... python benchmarks/pipeline.py --out /tmp/bench --model wan21_1_3b --size 512 --frames 33
    COMFYUI_PATH=... python benchmarks/pipeline.py --out /tmp/bench --model wan21_14b --gpus 4 --split 11,21,31

Writes a random-init model file of the chosen shape (benchmarks/model_shapes.py: ComfyUI's own class
with the released model's configuration; random weights do the same work as trained ones) and a
synthetic latent cache, then trains the same LoRA (rank 32, every block linear) with the same seed
three ways, each 8 samples per optimizer step, and prints step times:
  1 GPU (grad_accum 8), 2-stage pipeline on 2 GPUs (grad_accum 8), 2-way data parallel (grad_accum 4);
with --gpus 4 also 2 stages x 2 data parallel (grad_accum 4) and 4 stages (grad_accum 8, --split);
with --pp2-splits more 2-stage runs cut at the given layer indices.
GPipe's ideal speed-up for S stages, m micro-batches and R replicas is R*S*m/(m+S-1) (2 stages, m=8: 1.78x).
All runs see the same 8 samples per step, so their losses must match (printed per run).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import setup  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="wan21_1_3b", help="a shape of benchmarks/model_shapes.py")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--frames", type=int, default=33, help="video models only")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--gpus", type=int, default=2, choices=(2, 4), help="4: add the pipeline x data grids")
    parser.add_argument("--split", default="", help="memory.pipeline_split for the 4-stage run (default: balanced)")
    parser.add_argument("--pp2-splits", default="", help="comma list of layer indices: one more 2-stage run per "
                        "index, stage 2 starting there (memory.pipeline_split), named pp2_gas8_split<index>")
    parser.add_argument("--runs", default="", help="comma list of run names to do (default: all)")
    args = parser.parse_args()

    setup(pytorch_attention=True)
    from engine_bench import lora_drift, run_engine, write_cache
    from model_shapes import SHAPES, write_random

    shape = SHAPES[args.model]
    frames = args.frames if shape.video else 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model = out / f"{args.model}_random.safetensors"
    if not model.exists():
        params = write_random(shape, model)
        print(f"model {params / 1e9:.2f} B params written in {time.time() - t0:.0f} s", flush=True)
    cache = write_cache(out, shape, args.size, frames)
    memory = {"activation_checkpointing": "on" if args.checkpointing else "off"}
    plan = [("gpu1_gas8", 1, 1, 8, ""), ("pp2_gas8", 2, 2, 8, ""), ("dp2_gas4", 2, 1, 4, "")]
    plan += [(f"pp2_gas8_split{i}", 2, 2, 8, i) for i in filter(None, args.pp2_splits.split(","))]
    if args.gpus == 4:
        plan += [("pp2xdp2_gas4", 4, 2, 4, ""), ("pp4_gas8", 4, 4, 8, args.split)]
    wanted = set(filter(None, args.runs.split(",")))
    results = []
    for name, gpus, stages, gas, split in plan:
        if wanted and name not in wanted:
            continue
        results.append(run_engine(name, str(model), cache, out, gpus=gpus, stages=stages, grad_accum=gas,
                                  split=split, steps=args.steps, memory=memory))
        print(json.dumps(results[-1]), flush=True)
    ok = [r for r in results if "step_s" in r]
    if not ok:
        return 1
    base = next((r["step_s"] for r in ok if r["gpus"] == 1), None)
    print(f"\n{args.model} random-init, {args.size}x{args.size}" + (f"x{frames}" if shape.video else "") +
          f", LoRA r32 all block linears, bf16, checkpointing {'on' if args.checkpointing else 'off'}, "
          "8 samples per step")
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
