"""The fit-to-VRAM plan (memory.plan 'fit') on full-size random-init Flux-dev and Wan 2.1 14B: what it picks
for a budget, and that choice trained under that budget as a cap: predicted against measured peak and s/step.

    COMFYUI_PATH=... python benchmarks/fit_plan.py --work /path/to/fitbench --models flux_dev    # 24 GiB budget
    COMFYUI_PATH=... python benchmarks/fit_plan.py --work /path/to/fitbench --models wan21_14b
    COMFYUI_PATH=... python benchmarks/fit_plan.py --tiny     # CPU dry run on the tiny Wan, < 1 min

Per model, two processes (clean peak counters), through the engine's own parts as benchmarks/memory.py:
1. plan: load_base_model (a bf16 random file written once under --work), the block probe, inject_lora
   (rank 32, all block linears), then engine/train/fit_setup.plan_from_probe, the function a 'fit' run
   calls, on the benchmark's sample (Flux 1024x1024, Wan 512x512x81 frames); the plan and its figures.
2. train: the chosen settings (an fp8 base loads the file in fp8) under
   torch.cuda.set_per_process_memory_fraction(budget), AdamW (or the plan's 8-bit AdamW), --warmup + --steps
   steps; peak max_memory_allocated (CPU: engine/memory/meter.py over the steps) and mean s/step.
The plan's s/step is forward + backward (the probe's passes); the measured one includes the optimizer step.
Results go to <work>/fit_results.json; the table of all results so far is printed at the end. Run one
model per call (each writes its random file once under --work, then loads it twice).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import REPO, setup  # noqa: E402
from memory import RESOLUTION  # noqa: E402  (the benchmark resolutions of every model)

GIB = 1024**3
TINY_BUDGET_GIB = 0.0123  # ~12.6 MiB, 90% usable: below the tiny Wan's need without savings (--tiny prints figures)


def _shape(name: str):
    from model_shapes import SHAPES

    return SHAPES[name]


def _model(job: dict, memory, device):
    """ComfyUI's model with the LoRA, as a rank builds it (engine/train/loop.py), and its sample."""
    import torch

    from PipeTrain.engine.config.run import RunConfig
    from PipeTrain.engine.config.sections import LoraSpec, TrainSpec
    from PipeTrain.engine.models.loading import load_base_model
    from PipeTrain.engine.patches.trainable import make_trainable
    from PipeTrain.engine.train.lora import inject_lora
    from PipeTrain.engine.train.objective import DiffusionObjective
    from shape_cond import sample_cond

    cfg = RunConfig(run_name="fitbench", run_dir=job["work"], comfyui_root=os.environ["COMFYUI_PATH"],
                    model_path=job["model_path"], cache_dir=job["work"], lora=LoraSpec(rank=32, targets="all_linear"),
                    memory=memory, train=TrainSpec(steps=100, learning_rate=1e-4, batch_size=1, seed=0))
    model = load_base_model(cfg, device)
    model.model_sampling.to(device)
    res = RESOLUTION[job["model"]]
    shape = _shape(job["model"])
    latents = torch.randn((1, *shape.latent(res["size"], res["frames"])), generator=torch.Generator().manual_seed(0))
    latents = latents.to(device)
    cond = sample_cond(shape, device=str(device), size=res["size"], frames=res["frames"])
    probe = DiffusionObjective(model, seed=0)
    make_trainable(model.diffusion_model, lambda: probe(latents, [cond], [0]), device=device)
    torch.manual_seed(0)
    inject_lora(model.diffusion_model, cfg.lora)
    return cfg, model, latents, cond


def plan_child(job: dict) -> dict:
    import torch

    from PipeTrain.engine.config.sections import MemorySpec
    from PipeTrain.engine.train.fit_setup import figures_record, plan_from_probe
    from PipeTrain.engine.train.objective import DiffusionObjective

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    spec = MemorySpec(base_dtype="bfloat16", plan="fit", vram_gib=job["budget_gib"], vram_margin=job["margin"])
    t0 = time.time()
    _, model, latents, cond = _model(job, spec, device)
    loaded = time.time() - t0
    objective = DiffusionObjective(model, seed=0)
    result, figures = plan_from_probe(model, lambda: objective(latents, [cond], [0]).backward(), device, spec, True)
    return {**result.to_dict(), "figures": figures_record(figures), "load_s": round(loaded, 1),
            "probe_s": round(time.time() - t0 - loaded, 1)}


def train_child(job: dict) -> dict:
    import torch

    from PipeTrain.engine.config.sections import MemorySpec
    from PipeTrain.engine.memory.meter import PeakMeter, device_bytes
    from PipeTrain.engine.memory.options import apply_memory_options
    from PipeTrain.engine.train.fit_setup import chosen_spec
    from PipeTrain.engine.train.lora import lora_parameters
    from PipeTrain.engine.train.objective import DiffusionObjective
    from PipeTrain.engine.train.optim import build_scheduler
    from PipeTrain.engine.train.optimizers import build_optimizer
    from PipeTrain.engine.train.plain import PlainTrainer

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, job["budget_gib"] * GIB / total))
    spec = chosen_spec(MemorySpec(base_dtype="bfloat16"), job["chosen"])
    cfg, model, latents, cond = _model(job, spec, device)
    applied = apply_memory_options(model, spec, device)
    params = lora_parameters(model.diffusion_model)
    optimizer = build_optimizer(spec.optimizer, params, cfg.train)
    trainer = PlainTrainer(DiffusionObjective(model, seed=0), optimizer, build_scheduler(optimizer, cfg.train, 100),
                           grad_accum=1, grad_clip=1.0)
    hosts = tuple(s.host for s in applied.swapper.slots.values()) if applied.swapper is not None else ()
    before = torch.cuda.memory_allocated(device) if cuda else device_bytes(model, device, exclude=hosts)
    meter, times, losses = PeakMeter(device), [], []
    meter.start()
    for i in range(job["warmup"] + job["steps"]):
        began = time.perf_counter()
        loss = trainer(latents, [cond], [0])
        trainer.backward(loss)
        trainer.step()
        losses.append(float(loss.item()))  # .item() waits for the GPU
        if i >= job["warmup"]:
            times.append(time.perf_counter() - began)
    meter.stop()
    return {"peak_gib": (before + meter.peak) / GIB, "s_per_step": sum(times) / len(times), "losses": losses,
            "late_loads": applied.swapper.late_loads if applied.swapper else None}


def run_child(kind: str, job: dict, timeout: int) -> dict:
    try:
        proc = subprocess.run([sys.executable, __file__, f"--{kind}", json.dumps(job)], capture_output=True,
                              text=True, cwd=str(REPO), timeout=timeout, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return {"error": f"{kind}: over {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    print("\n".join(tail), file=sys.stderr)
    oom = any("OutOfMemoryError" in t or "out of memory" in t for t in tail)
    return {"error": f"{kind}: " + ("OOM" if oom else f"exit {proc.returncode}")}


def table(results: list[dict]) -> str:
    rows = ["| model | budget GiB | plan | predicted peak GiB | measured peak GiB | predicted s/step (fwd+bwd) "
            "| measured s/step | probe s |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        plan, run = r.get("plan", {}), r.get("train", {})
        chosen = plan.get("chosen")
        if not chosen:
            rows.append(f"| {r['model']} | {r['budget_gib']} | {plan.get('error') or plan.get('message', '')} "
                        "| - | - | - | - | - |")
            continue
        measured = (f"{run['peak_gib']:.4g}", f"{run['s_per_step']:.3f}") if "peak_gib" in run else (
            run.get("error", "-"), "-")
        rows.append(f"| {r['model']} | {r['budget_gib']} | {chosen['label']} | {chosen['peak_gib']:.4g} | "
                    f"{measured[0]} | {chosen['seconds']:.3f} | {measured[1]} | {plan.get('probe_s', '-')} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="", help="folder for the model files and fit_results.json")
    parser.add_argument("--models", default="flux_dev,wan21_14b")
    parser.add_argument("--budget-gib", type=float, default=24.0, help="memory.vram_gib of the plan, and the cap")
    parser.add_argument("--margin", type=float, default=0.1, help="memory.vram_margin")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--child-timeout", type=int, default=600, help="seconds one process may take")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run on a tiny Wan (< 1 min)")
    parser.add_argument("--plan", default="", help=argparse.SUPPRESS)
    parser.add_argument("--train", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plan or args.train:
        if json.loads(args.plan or args.train)["model"] == "tiny_wan":
            import torch

            torch.set_num_threads(1)  # tiny ops: more threads only contend
        setup(pytorch_attention=__import__("torch").cuda.is_available())
        result = plan_child(json.loads(args.plan)) if args.plan else train_child(json.loads(args.train))
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    if args.tiny:
        args.models, args.budget_gib, args.steps = "tiny_wan", TINY_BUDGET_GIB, 2
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    setup()
    from shape_files import write_random

    work = Path(args.work or Path(tempfile.gettempdir()) / ("pipetrain-fitbench" + ("-tiny" if args.tiny else "")))
    work.mkdir(parents=True, exist_ok=True)
    results_file = work / "fit_results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else []
    for model in args.models.split(","):
        path = work / f"{model}_random_bf16.safetensors"
        if not path.exists():
            t0 = time.time()
            params = write_random(_shape(model), path)
            print(f"{model}: {params / 1e6:.1f} M params written in {time.time() - t0:.0f} s", flush=True)
        job = {"model": model, "model_path": str(path), "work": str(work), "budget_gib": args.budget_gib,
               "margin": args.margin, "steps": args.steps, "warmup": args.warmup}
        t0 = time.time()
        plan = run_child("plan", job, args.child_timeout)
        print(f"{model} plan ({time.time() - t0:.0f} s): {plan.get('message') or plan.get('error')}", flush=True)
        print(json.dumps(plan.get("figures", {})), flush=True)
        train = {}
        if plan.get("chosen"):
            t0 = time.time()
            train = run_child("train", {**job, "chosen": plan["chosen"]}, args.child_timeout)
            print(f"{model} train ({time.time() - t0:.0f} s): {train.get('error') or train}", flush=True)
        results = [r for r in results if (r["model"], r["budget_gib"]) != (model, args.budget_gib)]
        results.append({"model": model, "budget_gib": args.budget_gib, "plan": plan, "train": train})
        results_file.write_text(json.dumps(results, indent=1))
    print()
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
