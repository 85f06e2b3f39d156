"""Pipeline and data parallel speed on GPUs: a random-init Wan 2.1 t2v model through PipeTrain's engine.

    COMFYUI_PATH=... python benchmarks/pipeline_wan.py --out /tmp/bench [--dim 1536 --layers 30 ...]

Writes a random-init Wan model file of the requested shape (ComfyUI's own WanModel; random weights
do the same work as trained ones) and a synthetic latent cache, then trains the same LoRA with the
same seed three ways, each 8 samples per optimizer step, and prints step times:
  1 GPU (grad_accum 8), 2-stage pipeline on 2 GPUs (grad_accum 8), 2-way data parallel (grad_accum 4);
with --gpus 4 also 2 stages x 2 data parallel (grad_accum 4) and 4 stages (grad_accum 8, --split).
GPipe's ideal speed-up for S stages, m micro-batches and R replicas is R*S*m/(m+S-1) (2 stages, m=8: 1.78x).
All runs see the same 8 samples per step, so their losses must match (printed per run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _pack():
    import importlib.util

    spec = importlib.util.spec_from_file_location("PipeTrain", REPO / "__init__.py",
                                                  submodule_search_locations=[str(REPO)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["PipeTrain"] = module
    spec.loader.exec_module(module)


def write_model(path: Path, args) -> int:
    import comfy.supported_models
    import torch
    from safetensors.torch import save_file

    cfg = dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=args.dim,
               ffn_dim=args.ffn, freq_dim=256, text_dim=4096, out_dim=16, num_heads=args.dim // 128,
               num_layers=args.layers, window_size=(-1, -1), qk_norm=True, cross_attn_norm=True, eps=1e-6)
    meta = comfy.supported_models.WAN21_T2V(cfg).get_model({}, device="meta")
    gen = torch.Generator().manual_seed(0)
    state, count = {}, 0
    for name, p in meta.diffusion_model.state_dict().items():
        if p.ndim >= 2:
            t = torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(0.02).to(torch.bfloat16)
        else:
            t = (torch.ones if "norm" in name else torch.zeros)(p.shape, dtype=torch.bfloat16)
        state[name] = t
        count += t.numel()
    save_file(state, str(path))
    return count


def write_cache(root: Path, args) -> str:
    import torch
    from PipeTrain.engine.cache_format import write_item, write_manifest
    from PipeTrain.engine.dataset import DatasetSpec, FolderSpec

    latent = (16, (args.frames - 1) // 4 + 1, args.size // 8, args.size // 8)
    gen = torch.Generator().manual_seed(0)
    cache = root / "cache"
    entries = []
    for i in range(16):
        write_item(cache, i, torch.randn((1, *latent), generator=gen), torch.randn((1, 512, 4096), generator=gen),
                   {}, f"item{i}.png", f"caption {i}", 1)
        entries.append({"file": f"items/{i:06d}.safetensors", "source": f"item{i}.png", "repeats": 1})
    spec = DatasetSpec(folders=(FolderSpec(str(root)),), resolution=args.size)
    write_manifest(cache, "0" * 16, spec, entries, list(latent), ["cross_attn"], {"benchmark": "random"})
    return str(cache)


def run(name, model, cache, out: Path, args, gpus, stages, grad_accum, split=""):
    from PipeTrain.engine import launcher
    from PipeTrain.engine.config import LaunchSpec, LoraSpec, MemorySpec, RunConfig, TrainSpec
    from PipeTrain.engine.events import EventTail

    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = RunConfig(run_name=name, run_dir=str(run_dir), comfyui_root=os.environ["COMFYUI_PATH"], model_path=model,
                    cache_dir=cache, lora=LoraSpec(rank=32, targets="all_linear"),
                    memory=MemorySpec(base_dtype="bfloat16", pipeline_stages=stages, pipeline_split=split,
                                      activation_checkpointing="on" if args.checkpointing else "off"),
                    train=TrainSpec(steps=args.steps, learning_rate=1e-4, batch_size=1, grad_accum=grad_accum, seed=0),
                    launch=LaunchSpec(num_gpus=gpus))
    cfg.save(run_dir / "run.json")
    started = time.time()
    import torch

    proc = launcher.spawn(RunConfig.load(run_dir / "run.json"), run_dir / "run.json", cuda=torch.cuda.is_available())
    proc.wait()
    events = EventTail(run_dir).read_new()
    steps = [e for e in events if e["event"] == "step"]
    if proc.returncode != 0 or not steps:
        print(launcher.log_tail(run_dir, 40))
        raise SystemExit(f"{name} failed (exit {proc.returncode})")
    first = next(e for e in events if e["event"] == "step")
    step_s = statistics.median(e["seconds"] for e in steps[2:]) if len(steps) > 3 else steps[-1]["seconds"]
    return {"run": name, "gpus": gpus, "stages": stages, "grad_accum": grad_accum, "step_s": step_s,
            "samples_per_s": 8 / step_s, "launch_to_first_step_s": first["time"] - started,
            "losses": [round(e["loss"], 5) for e in steps]}


def _lora_drift(run_a: Path, run_b: Path) -> float:
    from safetensors.torch import load_file

    a, b = (load_file(str(d / "lora" / "lora_final.safetensors")) for d in (run_a, run_b))
    scale = max(t.float().abs().max().item() for t in b.values())
    return max((a[k].float() - b[k].float()).abs().max().item() for k in b) / max(scale, 1e-12)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--dim", type=int, default=1536, help="Wan 1.3B: 1536; 14B: 5120")
    parser.add_argument("--ffn", type=int, default=8960, help="Wan 1.3B: 8960; 14B: 13824")
    parser.add_argument("--layers", type=int, default=30, help="Wan 1.3B: 30; 14B: 40")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--gpus", type=int, default=2, choices=(2, 4), help="4: add the pipeline x data grids")
    parser.add_argument("--split", default="", help="memory.pipeline_split for the 4-stage run (default: balanced)")
    args = parser.parse_args()

    _pack()  # the repository as package PipeTrain, as ComfyUI imports it
    from PipeTrain.engine.comfy_bootstrap import import_comfy

    import_comfy(os.environ["COMFYUI_PATH"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model = out / "wan_random.safetensors"
    params = write_model(model, args)
    cache = write_cache(out, args)
    print(f"model {params / 1e9:.2f} B params written in {time.time() - t0:.0f} s", flush=True)
    results = [run("gpu1_gas8", str(model), cache, out, args, 1, 1, 8),
               run("pp2_gas8", str(model), cache, out, args, 2, 2, 8),
               run("dp2_gas4", str(model), cache, out, args, 2, 1, 4)]
    if args.gpus == 4:
        results += [run("pp2xdp2_gas4", str(model), cache, out, args, 4, 2, 4),
                    run("pp4_gas8", str(model), cache, out, args, 4, 4, 8, args.split)]
    base = results[0]["step_s"]
    print(f"\nWan t2v random-init, dim {args.dim}, {args.layers} blocks, {args.size}x{args.size}x{args.frames}, "
          f"LoRA r32 all linears, bf16, 8 samples per step")
    two = min(r["step_s"] for r in results if r["gpus"] == 2)
    print("| run | GPUs | stages | gas | s/step | samples/s | speed-up vs 1 GPU | vs best 2-GPU | ideal | "
          "% of ideal | launch->1st step s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        s, m = r["stages"], r["grad_accum"]
        ideal = (r["gpus"] // s) * s * m / (m + s - 1)
        speed = base / r["step_s"]
        print(f"| {r['run']} | {r['gpus']} | {s} | {m} | {r['step_s']:.3f} | {r['samples_per_s']:.2f} | "
              f"{speed:.2f}x | {two / r['step_s']:.2f}x | {ideal:.2f}x | {100 * speed / ideal:.0f}% | "
              f"{r['launch_to_first_step_s']:.0f} |")
    for r in results[1:]:
        drift = max(abs(a - b) / max(abs(a), 1e-8) for a, b in zip(r["losses"], results[0]["losses"]))
        print(f"{r['run']}: largest relative loss difference from gpu1_gas8 {drift:.2e}")
        print(f"{r['run']}: saved LoRA vs pp2_gas8, largest |difference| / largest |weight|: "
              f"{_lora_drift(out / r['run'], out / 'pp2_gas8'):.2e}")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
