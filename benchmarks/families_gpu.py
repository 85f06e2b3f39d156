"""Every model family at its released widths on a GPU: ComfyUI detects the file, a LoRA trains, and
ComfyUI's own LoRA loader loads it back.

    COMFYUI_PATH=... python benchmarks/families_gpu.py --work /tmp/fam               # all families, 2 blocks per list
    COMFYUI_PATH=... python benchmarks/families_gpu.py --work /tmp/fam --families flux_dev,ltxv_2b --blocks 0
    COMFYUI_PATH=... python benchmarks/families_gpu.py --work /tmp/fam --tiny        # CPU dry run (tiny Wan), < 1 min
    COMFYUI_PATH=$COMFY_033 python3 benchmarks/families_gpu.py --work /tmp/fam033 --only-033  # the 0.33+ families

The CI tests (tests/with_comfy/test_families.py) train every family on tiny widths on the CPU. This script checks
what they cannot: the released widths (head sizes, text widths, channel counts ComfyUI's detection
reads from a real file), bf16 on CUDA with PyTorch attention, and the engine's loading path. For
each shape of benchmarks/model_shapes.py it writes a random bf16 file of the shape cut to --blocks
blocks per block list (model_shapes.shallow; 0 = full depth; families whose depth ComfyUI's
detection does not read from the file run at full depth), then, in its own process:
  - loads it with the engine (engine.models.loading.load_base_model: ComfyUI's loader and detection)
    and checks the detected class is the shape's family;
  - injects a LoRA (rank 32, the default `attention` preset) and trains --steps AdamW steps at --lr on
    one fixed sample, noise and timestep (model_shapes.sample_cond): the loss must fall; then
    --boost-steps more at --boost-lr (a LoRA effect well above bf16 rounding for the next check);
  - saves the LoRA with the engine's save path, loads it into a second copy of the base through
    comfy.sd.load_lora_for_models, and compares the denoised output at the fixed sample: no LoRA key
    left unloaded, the LoRA changes the output, and ComfyUI's patched model gives the trained
    model's output (to bf16 rounding: less than half the LoRA's own effect).
Prints one table row per family and keeps all rows in <work>/families.json.

The families only ComfyUI 0.33+ has (benchmarks/model_shapes_033.py) are in the default list when
COMFYUI_PATH is a 0.33+ tree (benchmarks/gpu_setup.sh exports COMFY_033 for one), and skipped, said on
stderr, on an older one; --only-033 runs just them.
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
# one shape per family of ComfyUI 0.3.75 (benchmarks/model_shapes.py)
FAMILY_SHAPES = ("sdxl", "flux_dev", "flux_kontext", "chroma", "sd35_large", "auraflow", "lumina2", "z_image",
                 "hidream_i1_full", "qwen_image", "qwen_image_edit", "hunyuan_image21", "omnigen2", "cosmos_predict2_2b",
                 "flux2_dev", "ltxv_2b", "hunyuan_video", "hunyuan_video15", "cosmos1_7b_t2v", "wan21_14b", "wan22_5b")
# and the image-to-video modes (start frame in each first_frame_style, CLIP vision tokens)
FAMILY_SHAPES += ("wan21_i2v_14b", "wan22_5b_ti2v", "ltxv_2b_i2v", "hunyuan_video15_i2v")
# the families only ComfyUI 0.33+ has (benchmarks/model_shapes_033.py; Ernie-Image runs at its full 36 layers)
FAMILY_SHAPES_033 = ("flux2_klein_4b", "flux2_klein_9b", "anima", "ernie_image", "ideogram4", "krea2",
                     "minimax_h3_t2i", "minimax_h3_t2v", "minimax_h3_t2v_audio", "ltx23_t2v")
IMAGE_SIZE, VIDEO_SIZE, VIDEO_FRAMES = 512, 256, 17


def child(job: dict) -> dict:
    import logging

    import torch

    cuda = torch.cuda.is_available()
    setup(pytorch_attention=cuda)
    import comfy.model_patcher
    import comfy.sd
    from safetensors.torch import load_file

    from model_shapes import SHAPES
    from shape_cond import sample_cond
    from PipeTrain.engine.config.run import RunConfig
    from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec
    from PipeTrain.engine.train.lora import inject_lora, lora_parameters, lora_state_dict, lora_tensors, save_lora
    from PipeTrain.engine.models.loading import load_base_model
    from PipeTrain.engine.train.objective import DiffusionObjective, transformer_options
    from PipeTrain.engine.patches.trainable import make_trainable

    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    shape = SHAPES[job["shape"]]  # only its conditioning and latent geometry, the same at any depth
    lora = LoraSpec(rank=32)
    cfg = RunConfig(run_name="families", run_dir=job["work"], comfyui_root=os.environ["COMFYUI_PATH"],
                    model_path=job["model_path"], cache_dir=job["work"], lora=lora, memory=MemorySpec(),
                    train=TrainSpec(steps=job["steps"] + job["boost_steps"], learning_rate=job["lr"], batch_size=1, seed=0))
    t0 = time.time()
    model = load_base_model(cfg, device)
    model.model_sampling.to(device)
    detected = type(model.model_config).__name__
    objective = DiffusionObjective(model, seed=0)
    size, frames = (VIDEO_SIZE, VIDEO_FRAMES) if shape.video else (IMAGE_SIZE, 1)
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn((1, *shape.latent(size, frames)), generator=gen).to(device)
    conds = [sample_cond(shape, device=str(device), size=size, frames=frames)]
    probed = time.time()  # the engine's block probe, as engine/train/loop.py runs it after loading
    forwards = make_trainable(model.diffusion_model, lambda: objective(latents, conds, [0]), device=device)
    probe_s = time.time() - probed
    torch.manual_seed(0)
    targets = inject_lora(model.diffusion_model, lora)
    optimizer = torch.optim.AdamW(lora_parameters(model.diffusion_model), lr=job["lr"], weight_decay=0.0)
    setup_s = time.time() - t0
    losses, times = [], []
    # --steps at --lr: the loss on the fixed sample must fall; then --boost-steps at --boost-lr, so that the
    # LoRA's effect on the output stands well above bf16 rounding for the loader check below
    schedule = [job["lr"]] * job["steps"] + [job["boost_lr"]] * job["boost_steps"]
    for i, lr in enumerate(schedule):  # sample id 0: the same noise and timestep every step
        for group in optimizer.param_groups:
            group["lr"] = lr
        if cuda:
            torch.cuda.synchronize()
        started = time.time()
        loss = objective(latents, conds, [0])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if i < job["steps"]:
            losses.append(float(loss.item()))
        if cuda:
            torch.cuda.synchronize()
        times.append(time.time() - started)
    peak = torch.cuda.max_memory_allocated() / GIB if cuda else 0.0

    prepared = objective.prepare(latents, conds, [0])

    def denoised(m):
        with torch.no_grad():
            return m.apply_model(prepared.xt, prepared.sigma, transformer_options=transformer_options(prepared.sigma),
                                 **prepared.kwargs).float()

    trained = denoised(model)
    lora_path = Path(job["work"]) / f"{job['shape']}_lora.safetensors"
    save_lora(lora_path, lora_state_dict(lora_tensors(model.diffusion_model), lora), {"shape": job["shape"]})
    del model, optimizer, objective
    if cuda:
        torch.cuda.empty_cache()
    base = comfy.sd.load_diffusion_model(job["model_path"])  # a plain ComfyUI model: no PipeTrain layers
    base.model.to(device)
    plain = denoised(base.model)
    unloaded: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            if "not loaded" in record.getMessage().lower():
                unloaded.append(record.getMessage())

    catcher = Catch()
    logging.getLogger().addHandler(catcher)
    try:
        patched, _ = comfy.sd.load_lora_for_models(base, None, load_file(str(lora_path)), 1.0, 0.0)
    finally:
        logging.getLogger().removeHandler(catcher)
    patched.patch_model(device_to=device)
    try:
        with_lora = denoised(patched.model)
    finally:
        patched.unpatch_model()
    effect = float((with_lora - plain).abs().mean())
    mismatch = float((with_lora - trained).abs().mean())
    return {"shape": job["shape"], "family": shape.family, "detected": detected, "blocks": job["blocks"],
            "params_m": job["params"] / 1e6, "lora_targets": len(targets), "losses": losses,
            "s_per_step": sum(times[1:]) / max(1, len(times) - 1), "peak_alloc_gib": peak, "setup_s": round(setup_s, 1),
            "probe_s": round(probe_s, 2), "forwards": sorted({v for v in forwards.values()}),
            "unloaded": unloaded[:3], "lora_effect": effect, "lora_mismatch": mismatch,
            "ok": (detected == shape.family and all(l == l for l in losses) and losses[-1] < losses[0]
                   and not unloaded and effect > 0 and mismatch < 0.5 * effect)}


def run_child(job: dict, timeout: int) -> dict:
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], capture_output=True, text=True,
                              cwd=str(REPO), timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"shape": job["shape"], "error": f"over {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-12:]
    print("\n".join(tail), file=sys.stderr)
    errors = [line for line in tail if "Error" in line or "error:" in line]
    return {"shape": job["shape"], "error": f"exit {proc.returncode}: " + (errors[-1] if errors else "")[:160]}


def table(rows: list[dict]) -> str:
    out = ["| shape | ComfyUI class (detected) | blocks per list | params (M) | LoRA layers | loss first -> last | s/step | "
           "peak GiB | LoRA effect / mismatch | block forwards (probe s) | ok |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['shape']} | error: {r['error']} | | | | | | | | | no |")
            continue
        out.append(f"| {r['shape']} | {r['detected']} | {r['blocks'] or 'all'} | {r['params_m']:.0f} | {r['lora_targets']} | "
                   f"{r['losses'][0]:.4f} -> {r['losses'][-1]:.4f} | {r['s_per_step']:.3f} | {r['peak_alloc_gib']:.1f} | "
                   f"{r['lora_effect']:.2e} / {r['lora_mismatch']:.2e} | {', '.join(r['forwards'])} ({r['probe_s']:.2f}) | "
                   f"{'yes' if r['ok'] else 'NO'} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="", help="folder for the model files, LoRAs and families.json")
    parser.add_argument("--families", default="", help="comma list of benchmarks/model_shapes.py shapes (default: "
                                                       "one per family, FAMILY_SHAPES)")
    parser.add_argument("--blocks", type=int, default=2, help="blocks per block list (0 = the released depth)")
    parser.add_argument("--steps", type=int, default=6, help="steps whose loss on the fixed sample must fall")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--boost-steps", type=int, default=4, help="more steps before the LoRA loader check")
    parser.add_argument("--boost-lr", type=float, default=1e-3)
    parser.add_argument("--child-timeout", type=int, default=600)
    parser.add_argument("--keep-files", action="store_true", help="keep the random model files (default: delete)")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run on the tiny Wan shape")
    parser.add_argument("--only-033", action="store_true", help="only the families ComfyUI 0.33+ adds "
                                                               "(FAMILY_SHAPES_033; COMFYUI_PATH at a 0.33+ tree)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    setup()
    from model_shapes import DETECTION_PINS_DEPTH, SHAPES, host_lacks
    from shape_files import write_random

    if args.tiny:
        names = ["tiny_wan"]
    elif args.families:
        names = [n.strip() for n in args.families.split(",")]
    else:
        default = FAMILY_SHAPES_033 if args.only_033 else FAMILY_SHAPES + FAMILY_SHAPES_033
        names = [n for n in default if not host_lacks(n)]
        for n in default:
            if host_lacks(n):
                print(f"skipping {n}: this ComfyUI has no {host_lacks(n)} (ComfyUI 0.33+; set COMFYUI_PATH to such a "
                      "tree, e.g. $COMFY_033 after benchmarks/gpu_setup.sh)", file=sys.stderr)
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape(s) {', '.join(unknown)}: choose from {', '.join(SHAPES)}")
    lacking = [f"{n} (needs {host_lacks(n)})" for n in names if host_lacks(n)]
    if lacking:
        raise SystemExit(f"this ComfyUI cannot build {', '.join(lacking)}: set COMFYUI_PATH to a ComfyUI 0.33+ tree")
    if not names:
        raise SystemExit("no shape to run on this ComfyUI (--only-033 needs a ComfyUI 0.33+ tree)")
    work = Path(args.work or "families_work").resolve()
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        shape = SHAPES[name]
        # ComfyUI's detection of these families does not read the depth from the file: a shallow file would
        # load as the released depth with blocks missing, so they run at the released depth
        blocks = 0 if shape.family in DETECTION_PINS_DEPTH else args.blocks
        if blocks:
            from model_shapes import shallow

            shape = shallow(shape, blocks)
        path = work / f"{name}.safetensors"
        started = time.time()
        params = write_random(shape, path)
        job = {"shape": name, "blocks": blocks, "work": str(work), "model_path": str(path), "params": params,
               "steps": args.steps, "lr": args.lr, "boost_steps": args.boost_steps, "boost_lr": args.boost_lr}
        row = run_child(job, args.child_timeout)
        row["wall_s"] = round(time.time() - started, 1)
        rows.append(row)
        if not args.keep_files:
            path.unlink(missing_ok=True)
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        (work / "families.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
