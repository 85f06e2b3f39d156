"""Training throughput of PipeTrain's engine on full-size random-init models, one GPU.

    COMFYUI_PATH=... python benchmarks/throughput.py --out /tmp/tp --models flux_dev,sdxl
    COMFYUI_PATH=... python benchmarks/throughput.py --out /tmp/tp --models wan21_14b --options ckpt,compile_ckpt --cleanup
    COMFYUI_PATH=... python benchmarks/throughput.py --out /tmp/tp --models sdxl --options eager,compile_graphs --batch-sizes 1,4,8
    COMFYUI_PATH=... python benchmarks/throughput.py --out /tmp/tp --tiny     # CPU dry run (tiny Wan, gloo), < 2 min

For each model shape (benchmarks/model_shapes.py: ComfyUI's own class at the released configuration,
random weights) and option set, it writes the model file and a synthetic latent cache
(benchmarks/engine_bench.py), trains through the real engine (launcher -> DeepSpeed rank -> events:
LoRA rank 32 on every block linear, --batch-sizes samples per micro-batch (each its own run; default 1),
--grad-accum micro-batches per step, AdamW) and prints one table: samples/s, ms/sample, MFU, peak GiB and
the time from launch to the first loss.

Resolutions: images 1024x1024, videos 512x512x81 frames (memory.RESOLUTION).
MFU = model FLOPs per sample / seconds per sample / the GPU's measured bf16 matmul speed (8192^3).
Model FLOPs per sample (benchmarks/flops.py, counted on ComfyUI's own forward) = 2 x linear +
3 x attention + 3 x LoRA forward FLOPs; checkpointing's recompute is not counted.
Step times are medians after two warm-up steps (compile happens in the first).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import setup  # noqa: E402

OPTIONS = {  # name -> MemorySpec fields
    "eager": {},
    "ckpt": {"activation_checkpointing": "on"},
    "compile": {"compile_blocks": True},
    "compile_ckpt": {"activation_checkpointing": "on", "compile_blocks": True},
    "compile_graphs": {"compile_blocks": True, "compile_mode": "cuda_graphs"},
    "compile_graphs_ckpt": {"activation_checkpointing": "on", "compile_blocks": True, "compile_mode": "cuda_graphs"},
}
# Full fine-tunes (every block weight trained, in bf16: lora.kind full, lora.dtype bfloat16), checkpointed:
# name -> (MemorySpec fields, LoraSpec fields). MFU is left out for them (the FLOPs count is a LoRA's).
FULL_OPTIONS = {
    "full_ckpt_8bit": ({"activation_checkpointing": "on", "optimizer": "adamw8bit_kahan"},
                       {"kind": "full", "dtype": "bfloat16"}),
    "full_ckpt_offload": ({"activation_checkpointing": "on", "optimizer": "adamw_cpu_offload"},
                          {"kind": "full", "dtype": "bfloat16"}),
    # 8-bit AdamW without Kahan compensation: 2 bytes less per weight (Flux-dev ~69 GiB: fits an 80 GB card),
    # small bf16 updates rounded away (why adamw8bit_kahan is the recommended pair for a bf16 full fine-tune)
    "full_ckpt_8bit_plain": ({"activation_checkpointing": "on", "optimizer": "adamw8bit"},
                             {"kind": "full", "dtype": "bfloat16"}),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for model files, caches and run folders")
    parser.add_argument("--models", default="flux_dev,sdxl")
    parser.add_argument("--options", default="eager,compile,ckpt,compile_ckpt", help=", ".join([*OPTIONS, *FULL_OPTIONS]))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--batch-sizes", default="1", help="comma list of micro-batch sizes, one run each")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: a tiny Wan at 64x64x9, eager, 3 steps")
    parser.add_argument("--cleanup", action="store_true",
                        help="delete each model file after its runs, and what full fine-tunes saved (disk)")
    args = parser.parse_args()
    if args.tiny:
        args.models, args.options, args.steps = "tiny_wan", "eager", 3
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    setup(pytorch_attention=not args.tiny)
    import torch

    from engine_bench import run_engine, write_cache
    from memory import RESOLUTION, measured_peak_tflops, model_tflops
    from model_shapes import SHAPES
    from shape_files import write_random

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        shape, res = SHAPES[name], RESOLUTION[name]
        model = out / f"{name}_random.safetensors"
        if not model.exists():
            t0 = time.time()
            params = write_random(shape, model)
            print(f"{name}: {params / 1e9:.2f} B params written in {time.time() - t0:.0f} s", flush=True)
        cache = write_cache(out, shape, res["size"], res["frames"], items=max(16, max(batch_sizes) * args.grad_accum))
        for option in args.options.split(","):
            memory, lora = FULL_OPTIONS.get(option) or (OPTIONS[option], None)
            for batch in batch_sizes:
                run = f"{name}_{option}" + (f"_b{batch}" if batch != 1 else "")
                result = run_engine(run, str(model), cache, out, gpus=1, steps=args.steps, grad_accum=args.grad_accum,
                                    memory=memory, lora=lora, batch_size=batch)
                rows.append({"model": name, "option": option, **result})
                print(json.dumps(rows[-1]), flush=True)
                if args.cleanup and option in FULL_OPTIONS:  # a full fine-tune's saved model is as big as the base
                    for saved in (out / run).rglob("*.safetensors"):
                        saved.unlink()
        if args.cleanup:
            model.unlink()
    cuda = torch.cuda.is_available()
    peak = measured_peak_tflops() if cuda else 0.0
    flops = {m: model_tflops(m) for m in {r["model"] for r in rows}} if cuda else {}
    (out / "throughput.json").write_text(json.dumps({"peak_tflops": peak, "model_tflops": flops, "rows": rows}, indent=1))
    if cuda:
        print(f"\nbf16 matmul peak measured: {peak:.0f} TFLOP/s; model TFLOP per sample: "
              + ", ".join(f"{m} {v:.1f}" for m, v in sorted(flops.items())))
    print(f"LoRA r32 on every block linear (full_*: every block weight), bf16, grad_accum {args.grad_accum}, "
          f"{'1 GPU' if cuda else 'CPU'}\n")
    print("| model | resolution | option | batch | samples/s | ms/sample | MFU | peak GiB | launch -> first loss s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        res = RESOLUTION[r["model"]]
        dims = f"{res['size']}x{res['size']}" + (f"x{res['frames']}" if res["frames"] > 1 else "")
        if "error" in r:
            print(f"| {r['model']} | {dims} | {r['option']} | {r['batch_size']} | {r['error']} | | | | |")
            continue
        mfu = f"{flops[r['model']] / (r['ms_per_sample'] / 1000) / peak:.0%}" if peak and r["option"] in OPTIONS else "-"
        print(f"| {r['model']} | {dims} | {r['option']} | {r['batch_size']} | {r['samples_per_s']:.2f} | "
              f"{r['ms_per_sample']:.0f} | {mfu} | {r['peak_gib']:.1f} | {r['launch_to_first_step_s']:.0f} |")
    print_setup_phases(rows)
    return 0


def print_setup_phases(rows: list[dict]) -> None:
    """Launch -> first loss split up: the launcher, each setup phase of the rank, the first step."""
    timed = [r for r in rows if "setup_phases" in r]
    if not timed:
        return
    names = list(timed[0]["setup_phases"])
    print("\nlaunch -> first loss, seconds: launcher (the launcher process until the rank starts), the rank's setup "
          "phases (engine/train/setup_phases.py), the first step (compiling included)\n")
    print("| model | option | launcher | " + " | ".join(names) + " | first step | total |")
    print("|---|---|---|" + "---|" * len(names) + "---|---|")
    for r in timed:
        phases = r["setup_phases"]
        launcher_s = r["launch_to_started_s"] - sum(phases.values())
        cells = " | ".join(f"{phases.get(n, 0.0):.1f}" for n in names)
        option = r["option"] + (f" (batch {r['batch_size']})" if r.get("batch_size", 1) != 1 else "")
        print(f"| {r['model']} | {option} | {launcher_s:.1f} | {cells} | {r['first_step_s']:.1f} | "
              f"{r['launch_to_first_step_s']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
