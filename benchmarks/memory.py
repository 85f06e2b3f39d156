"""Peak memory and step time of the memory options on full-size random-init Wan 2.1 14B and Flux-dev.

    COMFYUI_PATH=... python benchmarks/memory.py --work /tmp/membench
    COMFYUI_PATH=... python benchmarks/memory.py --work /tmp/membench --models wan21_14b --options swap --swap 28
    COMFYUI_PATH=... python benchmarks/memory.py --tiny          # CPU dry run (all sets in one process), < 1 min

Each option set runs in its own process (clean peak-memory counters, no allocator state carried
over), through the engine's own parts: load_base_model (ComfyUI's loader and detection on a random
bf16 file written once per model under --work), inject_lora (rank 32, all block linears),
apply_memory_options, the DiffusionObjective and PlainTrainer with AdamW. Sets marked "capped" run
under torch.cuda.set_per_process_memory_fraction(--cap-gib) (the 24 GB-card question). Results
accumulate in <work>/results.json, so the runs can be split over several calls; every call prints
the table of all results so far: peak GiB (max_memory_allocated / max_memory_reserved), s/step
(mean over --steps after --warmup steps) and the first step's loss (same seed and sample
everywhere, so runs can be compared). Block swap's N is --swap, or chosen from the cap, the
measured peak of the 'checkpointing' run (when there is one) and the block size.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import REPO, setup  # noqa: E402

GIB = 1024**3
OPTION_SETS = {  # name -> MemorySpec fields (+ "capped": run under the memory cap)
    "baseline": dict(),
    "checkpointing": dict(activation_checkpointing="on"),
    "cpu_offload": dict(activation_checkpointing="cpu_offload"),
    "swap": dict(activation_checkpointing="on", block_swap="N", capped=True),
    "swap_offload": dict(activation_checkpointing="cpu_offload", block_swap="N", capped=True),
    "fp8": dict(activation_checkpointing="on", base_dtype="float8_e4m3fn"),
    "fp8_swap": dict(activation_checkpointing="on", base_dtype="float8_e4m3fn", block_swap="N", capped=True),
    "compile": dict(activation_checkpointing="on", compile_blocks=True),
    "compile_no_checkpointing": dict(compile_blocks=True),
}
DEFAULT_OPTIONS = "baseline,checkpointing,swap,fp8,compile"
RESOLUTION = {"wan21_14b": dict(size=512, frames=81), "flux_dev": dict(size=1024, frames=1),
              "qwen_image": dict(size=1024, frames=1), "sdxl": dict(size=1024, frames=1),
              "tiny_wan": dict(size=64, frames=9)}


def _shape(name: str):
    from model_shapes import SHAPES

    return SHAPES[name]


# ---- one option set, in its own process ------------------------------------------------------
def child(job: dict) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    if cuda and job["cap_gib"]:
        torch.cuda.set_per_process_memory_fraction(job["cap_gib"] * GIB / torch.cuda.get_device_properties(0).total_memory)
    setup(pytorch_attention=cuda)
    from PipeTrain.engine.config.run import RunConfig
    from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec
    from PipeTrain.engine.train.lora import inject_lora, lora_parameters
    from PipeTrain.engine.memory.options import apply_memory_options
    from PipeTrain.engine.models.loading import load_base_model
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.optim import build_scheduler
    from PipeTrain.engine.train.optimizers import build_optimizer
    from PipeTrain.engine.patches.trainable import make_trainable
    from PipeTrain.engine.train.plain import PlainTrainer
    from shape_cond import sample_cond

    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    fields = {k: v for k, v in job["memory"].items() if k != "capped"}
    compile_now = fields.pop("compile_blocks", False)
    spec = MemorySpec(base_dtype=fields.pop("base_dtype", "bfloat16"), **fields)
    train = TrainSpec(steps=100, learning_rate=1e-4, batch_size=1, seed=0)
    cfg = RunConfig(run_name="bench", run_dir=job["work"], comfyui_root=os.environ["COMFYUI_PATH"],
                    model_path=job["model_path"], cache_dir=job["work"], lora=LoraSpec(rank=32, targets="all_linear"),
                    memory=spec, train=train)
    shape = _shape(job["model"])
    t0 = time.time()
    model = load_base_model(cfg, device)
    model.model_sampling.to(device)
    res = RESOLUTION[job["model"]]
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn((1, *shape.latent(res["size"], res["frames"])), generator=gen).to(device)
    cond = sample_cond(shape, device=str(device))
    probe = DiffusionObjective(model, seed=0)  # the engine's block probe (engine/train/loop.py), on the run's sample
    make_trainable(model.diffusion_model, lambda: probe(latents, [cond], [0]), device=device)
    torch.manual_seed(0)
    inject_lora(model.diffusion_model, cfg.lora)
    if compile_now:  # compile first (innermost), with the chosen backend
        from PipeTrain.engine.memory.compile import compile_blocks

        compile_blocks(model.diffusion_model, backend=job["compile_backend"], mode=job.get("compile_mode"))
    plan = apply_memory_options(model, spec, device)
    objective = DiffusionObjective(model, seed=0)
    params = lora_parameters(model.diffusion_model)
    optimizer = build_optimizer("adamw", params, train)
    trainer = PlainTrainer(objective, optimizer, build_scheduler(optimizer, train, 100), grad_accum=1, grad_clip=1.0)
    setup_s = time.time() - t0
    times, losses = [], []

    def step():
        loss = trainer(latents, [cond], [0])  # the same sample and noise every step: comparable losses
        trainer.backward(loss)
        trainer.step()
        return loss

    for i in range(job["warmup"] + job["steps"]):
        if cuda:
            torch.cuda.synchronize()
        started = time.time()
        losses.append(float(step().item()))
        if cuda:
            torch.cuda.synchronize()
        if i >= job["warmup"]:
            times.append(time.time() - started)
    out = {"model": job["model"], "option": job["option"], "block_swap": spec.block_swap, "cap_gib": job["cap_gib"],
           "s_per_step": sum(times) / len(times), "first_loss": losses[0], "losses": losses,
           "setup_s": round(setup_s, 1), "late_loads": plan.swapper.late_loads if plan.swapper else None}
    if cuda:
        out["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / GIB
        out["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
        if job.get("profile"):  # one more step, under the profiler (after the timed ones: it slows launches)
            from profile_summary import profile_step

            out["profile"] = profile_step(step, lora_rank=cfg.lora.rank)
    return out


# ---- the parent: files, N, one process per set, the table ----------------------------------
def block_bytes(shape_name: str, fp8: bool) -> tuple[list[int], int]:
    """(bytes of each block in model order, bytes of the whole diffusion model) for a bf16 (or fp8) base."""
    from model_shapes import build
    from PipeTrain.engine.memory.blocks import blocks

    dm = build(_shape(shape_name)).diffusion_model

    def size(module) -> int:
        total = 0
        for name, p in module.named_parameters():
            lin = fp8 and name.endswith("weight") and p.ndim == 2
            total += p.numel() * (1 if lin else 2)
        return total

    return [size(b) for b in blocks(dm)], size(dm)


def choose_swap(job_model: str, option: dict, cap_gib: float, results: list[dict], prefetch: int = 1) -> int:
    """Smallest N that should fit the cap: weights + what the 'checkpointing' run needed beyond them.

    Block swap moves the last N blocks, so their own sizes count (Flux's last blocks are its small
    single-stream ones).
    """
    fp8 = option.get("base_dtype", "").startswith("float8")
    sizes, total = block_bytes(job_model, fp8)
    measured = [r for r in results if r["model"] == job_model and r["option"] == "checkpointing" and "peak_alloc_gib" in r]
    bf16_total = block_bytes(job_model, False)[1]
    extra = (measured[-1]["peak_alloc_gib"] * GIB - bf16_total) if measured else 10 * GIB
    budget = 0.92 * cap_gib * GIB  # leave room for fragmentation
    need = total + extra + (prefetch + 1) * max(sizes) - budget
    n, freed = 0, 0
    for size in reversed(sizes):
        if freed >= need:
            break
        n, freed = n + 1, freed + size
    return max(1, n)


def run_child(job: dict, expandable: bool, timeout: int) -> dict:
    env = dict(os.environ)
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if job["model"] == "tiny_wan":
        env.setdefault("OMP_NUM_THREADS", "1")
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], env=env, capture_output=True,
                              text=True, cwd=str(REPO), timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": job["model"], "option": job["option"], "block_swap": job["memory"].get("block_swap", 0),
                "cap_gib": job["cap_gib"], "error": f"over {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    oom = any("OutOfMemoryError" in t or "out of memory" in t for t in tail)
    print("\n".join(tail), file=sys.stderr)
    return {"model": job["model"], "option": job["option"], "block_swap": job["memory"].get("block_swap", 0),
            "cap_gib": job["cap_gib"], "error": "OOM" if oom else f"exit {proc.returncode}"}


def measured_peak_tflops() -> float:
    """bf16 matmul speed of this GPU (8192^3, mean of 10 after 3 warm-ups): the MFU denominator."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * 10 / (time.time() - t0) / 1e12


def model_tflops(model: str) -> float:
    """Model FLOPs of one training sample (benchmarks/flops.py: 2 x linear + 3 x attention + 3 x LoRA)."""
    from flops import step_flops

    res = RESOLUTION[model]
    return step_flops(_shape(model), res["size"], res["frames"], lora_rank=32).model / 1e12


def table(results: list[dict], tflops: dict[str, float] | None = None, peak: float = 0.0) -> str:
    """Markdown table; with tflops (per model) and peak (TFLOP/s), an MFU column (model FLOPs / time / peak)."""
    tflops = tflops or {}
    rows = ["| model | option | block_swap | cap GiB | peak alloc GiB | peak reserved GiB | s/step | vs checkpointing "
            "| MFU | first-step loss |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ref = [x for x in results if x["model"] == r["model"] and x["option"] == "checkpointing" and "s_per_step" in x]
        if "error" in r:
            rows.append(f"| {r['model']} | {r['option']} | {r['block_swap']} | {r['cap_gib'] or '-'} | {r['error']} "
                        "| | | | | |")
            continue
        ratio = f"{r['s_per_step'] / ref[-1]['s_per_step']:.2f}x" if ref else "-"
        peak_of = lambda k: f"{r[k]:.1f}" if k in r else "-"  # noqa: E731
        mfu = (f"{tflops[r['model']] / r['s_per_step'] / peak:.0%}" if r["model"] in tflops and peak else "-")
        rows.append(f"| {r['model']} | {r['option']} | {r['block_swap']} | {r['cap_gib'] or '-'} | "
                    f"{peak_of('peak_alloc_gib')} | {peak_of('peak_reserved_gib')} | {r['s_per_step']:.3f} | {ratio} | "
                    f"{mfu} | {r['first_loss']:.5f} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="", help="folder for the model files and results.json")
    parser.add_argument("--models", default="wan21_14b,flux_dev")
    parser.add_argument("--options", default=DEFAULT_OPTIONS, help=f"comma list of {', '.join(OPTION_SETS)}")
    parser.add_argument("--cap-gib", type=float, default=24.0, help="memory cap of the 'capped' sets; 0 = none")
    parser.add_argument("--swap", default="auto", help="block swap N for the swap sets, or 'auto'")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="steps before timing (compile sets: at least 2)")
    parser.add_argument("--child-timeout", type=int, default=900, help="seconds one option set may take")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode for the compiled blocks "
                        "(e.g. reduce-overhead: CUDA graphs; default: torch's)")
    parser.add_argument("--expandable", action="store_true", help="expandable_segments for every set")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run on a tiny Wan (< 1 min)")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed steps, profile one more (benchmarks/profile_summary.py; GPU only)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    if args.tiny:
        args.models, args.steps, args.warmup, args.compile_backend = "tiny_wan", 2, 1, "aot_eager"
        args.options = "baseline,checkpointing,swap,fp8,compile"
        import torch

        torch.set_num_threads(1)  # tiny ops: more threads only contend
    setup()
    import torch

    from shape_files import write_random

    import tempfile

    work = Path(args.work or Path(tempfile.gettempdir()) / ("pipetrain-membench" + ("-tiny" if args.tiny else "")))
    work.mkdir(parents=True, exist_ok=True)
    results_file = work / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else []
    cuda = torch.cuda.is_available()
    for model in args.models.split(","):
        path = work / f"{model}_random_bf16.safetensors"
        if not path.exists():
            t0 = time.time()
            params = write_random(_shape(model), path)
            print(f"{model}: {params / 1e6:.1f} M params written in {time.time() - t0:.0f} s", flush=True)
        for option in args.options.split(","):
            memory = dict(OPTION_SETS[option])
            cap = args.cap_gib if memory.get("capped") and cuda else 0
            if memory.get("block_swap") == "N":
                if args.swap == "auto":
                    memory["block_swap"] = choose_swap(model, memory, args.cap_gib, results) if cuda else 3
                else:
                    memory["block_swap"] = int(args.swap)
            job = {"model": model, "option": option, "memory": memory, "cap_gib": cap, "work": str(work),
                   "model_path": str(path), "steps": args.steps,
                   "warmup": max(args.warmup, 2) if memory.get("compile_blocks") else args.warmup,
                   "compile_backend": args.compile_backend, "compile_mode": args.compile_mode,
                   "profile": args.profile}
            t0 = time.time()
            # --tiny runs the sets in this process: on a CPU there is no peak to isolate, only import time to save.
            result = child(job) if args.tiny else run_child(job, args.expandable, args.child_timeout)
            results = [r for r in results if (r["model"], r["option"]) != (model, option)] + [result]
            results_file.write_text(json.dumps(results, indent=1))
            print(f"{model} {option}: {time.time() - t0:.0f} s "
                  f"{result.get('error') or round(result['s_per_step'], 3)}", flush=True)
            if "profile" in result:
                from profile_summary import format_summary

                print(format_summary(f"{model} {option}", result["profile"]), flush=True)
    tflops, peak = {}, 0.0
    if cuda:  # MFU: FLOPs counted on ComfyUI's forward, over this GPU's measured matmul speed
        peak = measured_peak_tflops()
        tflops = {m: model_tflops(m) for m in {r["model"] for r in results}}
        print(f"\nbf16 matmul peak measured: {peak:.0f} TFLOP/s; model TFLOP per sample: "
              + ", ".join(f"{m} {v:.1f}" for m, v in sorted(tflops.items())))
    print()
    print(table(results, tflops, peak))
    return 0


if __name__ == "__main__":
    sys.exit(main())
