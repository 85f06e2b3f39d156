"""Time diffusion-pipe's own LoRA training on the shapes PipeTrain benchmarks (issue 6).

Builds everything diffusion-pipe needs offline, runs its train.py under the DeepSpeed launcher on
one GPU and prints one JSON line per run with the median seconds per step:

    python benchmarks/diffusion_pipe_side.py --work /tmp/dp_work --dp /tmp/diffusion-pipe --comfy $COMFY_075 \
        --model flux --runs eager,compile,ckpt,compile_ckpt --grad-accum 4

Runs: eager (no activation checkpointing), ckpt (diffusion-pipe's activation_checkpointing = true),
and each with diffusion-pipe's own `compile = true` (it compiles its whole pipeline module, dynamic
shapes), so that compiled is compared with compiled (benchmarks/throughput.py's options of the same
names on PipeTrain's side).

--dp is an unpacked diffusion-pipe checkout with submodules/HunyuanVideo (hyvideo) filled in, and
submodules/ComfyUI filled in or given with --comfy (benchmarks/dp_pack.sh builds one from git
directories, with the wheels diffusion-pipe needs beyond the GPU image and PipeTrain's payload). The model is a random-init model of the real shape in the folder layout
diffusion-pipe loads (Flux: a diffusers FLUX.1-dev folder; Wan: the Wan2.1-T2V-14B folder), with the
smallest text encoders / VAE / tokenizers its loaders accept, built offline by dp_side_files.py (text encoder widths
match what the transformer expects). --tiny shrinks the transformer for a CPU check of the files.
Step times come from DeepSpeed's "steps: N ... iter time (s): T" lines and, as PipeTrain's are
timed, from the wall clock between those lines (one optimizer step each); the process is stopped once
enough steps were seen (before diffusion-pipe's final save). The GPU's SM clock and power are
sampled during each run (min / median / max).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from dp_side_files import write_flux_folder, write_images, write_videos, write_wan_folder

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
STEP_RE = re.compile(r"steps: (\d+) loss: (\S+) .*iter time \(s\): ([0-9.]+)")
CUDNN_CRASH_RE = re.compile(r"mha_graph|cudnn|CUBLAS_STATUS_EXECUTION_FAILED|illegal memory access", re.IGNORECASE)

# run name -> (activation checkpointing, diffusion-pipe's compile = true); "nockpt" is the older name of eager
RUNS = {"eager": (False, False), "nockpt": (False, False), "ckpt": (True, False), "compile": (False, True),
        "compile_ckpt": (True, True)}


# ----------------------------------------------------------------------------- configs
def write_configs(work: Path, name: str, model: str, model_dir: Path, data_dir: Path, ckpt: bool, steps: int,
                  size: int, frames: int, compile_model: bool = False, grad_accum: int = 1) -> Path:
    dataset = work / f"dataset_{model}.toml"
    dataset.write_text(f"resolutions = [{size}]\nenable_ar_bucket = false\nframe_buckets = [{frames}]\n\n"
                       f"[[directory]]\npath = '{data_dir}'\nnum_repeats = 1\n")
    if model == "flux":
        model_block = f"type = 'flux'\ndiffusers_path = '{model_dir}'\ndtype = 'bfloat16'\ntimestep_sample_method = 'logit_normal'\n"
    else:
        model_block = f"type = 'wan'\nckpt_path = '{model_dir}'\ndtype = 'bfloat16'\ntimestep_sample_method = 'logit_normal'\n"
    config = work / f"config_{name}.toml"
    config.write_text(
        f"output_dir = '{work / 'runs' / name}'\ndataset = '{dataset}'\nepochs = 1000\nmax_steps = {steps}\n"
        "micro_batch_size_per_gpu = 1\npipeline_stages = 1\n"
        f"gradient_accumulation_steps = {grad_accum}\ngradient_clipping = 1.0\n"
        f"compile = {'true' if compile_model else 'false'}\n"
        "warmup_steps = 0\neval_before_first_step = false\nsave_every_n_epochs = 1000\n"
        f"activation_checkpointing = {'true' if ckpt else 'false'}\nsave_dtype = 'bfloat16'\ncaching_batch_size = 1\n"
        "steps_per_print = 1\nvideo_clip_mode = 'single_beginning'\n\n"
        f"[model]\n{model_block}\n[adapter]\ntype = 'lora'\nrank = 32\ndtype = 'bfloat16'\n\n"
        "[optimizer]\ntype = 'adamw'\nlr = 2e-5\nbetas = [0.9, 0.99]\nweight_decay = 0.01\neps = 1e-8\n")
    return config


def write_shims(work: Path, no_cudnn_sdpa: bool) -> Path:
    """Stand-ins for imports diffusion-pipe makes but never uses here: wandb (off in the config) and, when
    PyAV is absent, av (ComfyUI's video types import it; images never reach it)."""
    import importlib.util

    shim = work / "shim"
    shutil.rmtree(shim, ignore_errors=True)
    shim.mkdir(parents=True)
    if importlib.util.find_spec("wandb") is None:
        (shim / "wandb.py").write_text("def _off(*a, **k):\n    raise RuntimeError('wandb stub: monitoring is off')\n"
                                       "login = init = log = _off\n")
    if importlib.util.find_spec("av") is None:
        stub = ("class _Any(type):\n    def __getattr__(cls, name):\n        return _Any(name, (), {})\n"
                "def __getattr__(name):\n    if name.startswith('__'):\n        raise AttributeError(name)\n"
                "    return _Any(name, (), {})\n")
        for mod in ("av/__init__.py", "av/container.py", "av/subtitles/__init__.py", "av/subtitles/stream.py"):
            (shim / mod).parent.mkdir(parents=True, exist_ok=True)
            (shim / mod).write_text(stub)
    if no_cudnn_sdpa:  # fallback for the cuDNN attention backward crash seen with diffusers blocks (GPU-BASELINE.md)
        (shim / "sitecustomize.py").write_text("import torch\ntorch.backends.cuda.enable_cudnn_sdp(False)\n")
    return shim


# ----------------------------------------------------------------------------- running
def gpu_sampler(stop: threading.Event, peak: list, clocks: list):
    """Peak memory used (MiB) into peak[0]; (SM clock MHz, power W) samples into clocks."""
    query = "--query-gpu=memory.used,clocks.sm,power.draw"
    while not stop.is_set():
        try:
            out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=5, check=False).stdout.strip()
            used, sm, power = (float(v) for v in out.splitlines()[0].split(","))
            peak[0] = max(peak[0], int(used))
            clocks.append((sm, power))
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            pass
        stop.wait(0.5)


def _spread(values: list[float]) -> list[float] | None:
    """[min, median, max] of the samples taken while the GPU was busy (power above idle)."""
    return [round(min(values)), round(statistics.median(values)), round(max(values))] if values else None


def run_training(dp: Path, config: Path, log: Path, shim: Path, want_steps: int, warmup: int, timeout: float,
                 port: int) -> dict:
    env = dict(os.environ, **NO_MULTICAST, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(shim)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus=1", "--master_port", str(port),
           "train.py", "--deepspeed", "--config", str(config)]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=dp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)
    stop, peak, clocks = threading.Event(), [0], []
    threading.Thread(target=gpu_sampler, args=(stop, peak, clocks), daemon=True).start()
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    steps, tail, reason = [], [], "exited"
    with open(log, "w") as f:
        for line in proc.stdout:
            f.write(line)
            tail = (tail + [line.rstrip()])[-40:]
            m = STEP_RE.search(line)
            if m:
                steps.append((int(m.group(1)), float(m.group(2)), float(m.group(3)), time.monotonic() - start))
                if len(steps) >= want_steps:
                    reason = "enough steps"
                    os.killpg(proc.pid, signal.SIGTERM)
                    break
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    timer.cancel()
    stop.set()
    if reason != "enough steps" and time.monotonic() - start >= timeout - 1:
        reason = "timeout"
    timed = steps[warmup:]
    walls = [steps[j][3] - steps[j - 1][3] for j in range(max(1, warmup), len(steps))]
    result = {"stop": reason, "returncode": proc.returncode, "steps_seen": len(steps),
              "first_step_after_s": round(steps[0][3], 1) if steps else None,
              "median_iter_s": round(statistics.median(s[2] for s in timed), 4) if timed else None,
              "median_wall_s": round(statistics.median(walls), 4) if walls else None,
              "iter_s": [s[2] for s in steps], "loss": [s[1] for s in steps],
              "nvidia_smi_peak_gib": round(peak[0] / 1024, 2) if peak[0] else None,
              "sm_clock_mhz": _spread([c for c, w in clocks if w > 150]),
              "power_w": _spread([w for c, w in clocks if w > 150]), "log": str(log)}
    if not timed:
        result["tail"] = tail[-15:]
        result["cudnn_crash"] = any(CUDNN_CRASH_RE.search(t) for t in tail)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="scratch folder (model, data, configs, logs)")
    p.add_argument("--dp", required=True, help="unpacked diffusion-pipe checkout with submodules filled in")
    p.add_argument("--comfy", help="a ComfyUI tree to link as the checkout's empty submodules/ComfyUI")
    p.add_argument("--model", choices=["flux", "wan"], default="flux")
    p.add_argument("--runs", default="eager,ckpt", help="comma list of " + " / ".join(RUNS))
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step (both sides alike)")
    p.add_argument("--steps", type=int, default=12, help="steps to see per run (first --warmup not timed)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--tiny", action="store_true", help="tiny transformer (CPU check of the files)")
    p.add_argument("--prepare-only", action="store_true", help="write model, data and configs; do not train")
    p.add_argument("--no-cudnn-sdpa", action="store_true", help="disable cuDNN SDPA from the start")
    p.add_argument("--keep", action="store_true", help="keep the model folder afterwards")
    p.add_argument("--timeout", type=float, default=470, help="seconds for everything")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    work, dp = Path(args.work).resolve(), Path(args.dp).resolve()
    runs = [r for r in args.runs.split(",") if r]
    if set(runs) - set(RUNS):
        raise SystemExit(f"--runs: unknown {sorted(set(runs) - set(RUNS))}; choose from {', '.join(RUNS)}")
    link = dp / "submodules" / "ComfyUI"
    if args.comfy and not (link / "comfy" / "sd.py").is_file():
        if link.is_dir():
            link.rmdir()  # the empty submodule folder
        link.symlink_to(Path(args.comfy).resolve(), target_is_directory=True)
    for need in ("train.py", "submodules/ComfyUI/comfy/sd.py", "submodules/HunyuanVideo/hyvideo/constants.py"):
        if not (dp / need).is_file():
            raise SystemExit(f"--dp {dp}: {need} missing; unpack diffusion-pipe with its ComfyUI and HunyuanVideo submodules")
    work.mkdir(parents=True, exist_ok=True)
    size, frames = (1024, 1) if args.model == "flux" else (512, 81)
    model_dir, data_dir = work / f"{args.model}_model", work / f"{args.model}_data"
    info = write_flux_folder(model_dir, args.tiny) if args.model == "flux" else write_wan_folder(model_dir, dp, args.tiny)
    if not any(data_dir.glob("*.txt")):
        if args.model == "flux":
            write_images(data_dir, args.images, size)
        else:
            write_videos(data_dir, args.images, size, frames)
    prep_s = round(time.monotonic() - t0, 1)
    no_cudnn = args.no_cudnn_sdpa
    for i, run in enumerate(runs):
        name = f"{args.model}_{run}"
        ckpt, compiled = RUNS[run]
        config = write_configs(work, name, args.model, model_dir, data_dir, ckpt, args.steps + 5, size, frames,
                               compiled, args.grad_accum)
        head = {"tool": "diffusion-pipe", "model": args.model, "run": name, "shape": f"{size}x{size}x{frames}",
                "lora_rank": 32, "batch": 1, "grad_accum": args.grad_accum, "activation_checkpointing": ckpt,
                "compile": compiled, "tiny": args.tiny, "prepare_s": prep_s, **info}
        if args.prepare_only:
            print(json.dumps({**head, "config": str(config)}), flush=True)
            continue
        left = args.timeout - (time.monotonic() - t0)
        if left < 60:
            print(json.dumps({**head, "error": "no time left"}), flush=True)
            continue
        shim = write_shims(work, no_cudnn)
        res = run_training(dp, config, work / f"{name}.log", shim, args.steps, args.warmup, left, 29500 + i)
        if res["median_iter_s"] is None and res.get("cudnn_crash") and not no_cudnn:
            no_cudnn = True  # retry once without cuDNN attention, and say so
            left = args.timeout - (time.monotonic() - t0)
            if left >= 60:
                res = dict(run_training(dp, config, work / f"{name}_nocudnn.log", write_shims(work, True),
                                        args.steps, args.warmup, left, 29600 + i), retried_without_cudnn_sdpa=True)
        if res.get("median_wall_s"):
            res["wall_s_per_sample"] = round(res["median_wall_s"] / args.grad_accum, 4)
        print(json.dumps({**head, "cudnn_sdpa": not no_cudnn, **res}), flush=True)
    if not args.keep and not args.prepare_only:
        shutil.rmtree(model_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
