"""The main job, end to end: train a LoRA in a real ComfyUI server, then sample with and without it.

    bash scripts/demo.sh            (installs what is missing, then runs this)

1. writes a tiny random-init UNet/VAE/CLIP that ComfyUI's stock loaders accept, and a tiny dataset;
2. starts ComfyUI headless with this pack installed;
3. queues example_workflows/api/train_lora_then_test_api.json through POST /prompt: the six PipeTrain
   nodes train with DeepSpeed (2 CPU processes when there is no GPU, else one per GPU, at most 2),
   then KSampler renders the same seed with and without the new LoRA;
4. prints where the LoRA and the two images are, and whether the LoRA changed the image.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = REPO / "example_workflows" / "api" / "train_lora_then_test_api.json"  # api/: kept out of the template browser


def comfy_root() -> Path:
    root = os.environ.get("COMFYUI_PATH") or str(REPO / ".comfyui" / "ComfyUI")
    if not (Path(root) / "main.py").is_file():
        sys.exit(f"ComfyUI not found at {root}: run `bash scripts/bootstrap.sh` or set COMFYUI_PATH.")
    return Path(root)


def demo_prompt(assets: dict, steps: int, processes: int, run_name: str) -> dict:
    """The example workflow with the demo's file names and sizes filled in."""
    prompt = json.loads(WORKFLOW.read_text(encoding="utf-8"))
    by_type = {node["class_type"]: node["inputs"] for node in prompt.values()}
    by_type["UNETLoader"]["unet_name"] = assets["unet"]
    by_type["VAELoader"]["vae_name"] = assets["vae"]
    by_type["CLIPLoader"]["clip_name"] = assets["clip"]
    by_type["PipeTrainLoadDataset"]["folders"] = assets["dataset"]
    train = by_type["PipeTrainTrainPipeline"]
    train.update(model_name=assets["unet"], steps=steps, num_gpus=processes, run_name=run_name)
    by_type["PipeTrainSaveLoRA"]["overwrite"] = True  # the demo owns its folder; re-runs replace its LoRA
    return prompt


# The example workflow's nodes up to TrainPipeline (an output node): loaders, dataset, cache, LoRA, memory,
# train options.
TRAINING_NODES = frozenset({"UNETLoader", "VAELoader", "CLIPLoader", "PipeTrainLoadDataset", "PipeTrainCacheLatents",
                            "PipeTrainConfigureLoRA", "PipeTrainMemoryOptions", "PipeTrainTrainOptions",
                            "PipeTrainTrainPipeline"})


def training_prompt(assets: dict, steps: int, processes: int, run_name: str, **train) -> dict:
    """demo_prompt up to TrainPipeline (nothing runs after training), its TrainPipeline inputs updated with `train`."""
    prompt = {k: v for k, v in demo_prompt(assets, steps, processes, run_name).items()
              if v["class_type"] in TRAINING_NODES}
    next(v["inputs"] for v in prompt.values() if v["class_type"] == "PipeTrainTrainPipeline").update(train)
    return prompt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "demo_out"), help="folder for the ComfyUI base dir and results")
    parser.add_argument("--steps", type=int, default=60, help="training steps")
    parser.add_argument("--processes", type=int, default=0,
                        help="DeepSpeed processes (GPUs, or CPU processes); 0 = 2 on a CPU, else one per GPU, at most 2")
    args = parser.parse_args(argv)
    if args.processes <= 0:
        import torch

        gpus = torch.cuda.device_count()
        args.processes = min(2, gpus) if gpus else 2

    sys.path.insert(0, str(REPO))
    from tools.comfy_server import ComfyServer
    from tools.tiny_assets import write_demo_base

    t0 = time.time()
    base = Path(args.out).resolve() / "comfy_base"
    assets = write_demo_base(str(base))
    print(f"[demo] tiny model files and dataset ready in {time.time() - t0:.1f} s under {base}")
    with ComfyServer(comfy_root(), base) as server:
        print(f"[demo] ComfyUI {server.url} up after {time.time() - t0:.1f} s; queueing the workflow")
        prompt = demo_prompt(assets, args.steps, args.processes, run_name="demo")
        history = server.wait(server.queue(prompt), timeout=1800)
        images = {Path(p).stem: Path(p) for p in server.image_paths(history)}
    outputs = history["outputs"]
    summary = next(o["text"][0] for o in outputs.values() if o.get("text") and "LoRA:" in o["text"][0])
    saved = next(o["text"][0] for o in outputs.values() if o.get("text") and o["text"][0].startswith("saved "))
    with_lora = next(p for k, p in images.items() if "with_lora" in k)
    without = next(p for k, p in images.items() if "without_lora" in k)
    changed = with_lora.read_bytes() != without.read_bytes()
    print("\n[demo] " + summary.replace("\n", "\n[demo] "))
    print(f"[demo] {saved} (in {base / 'models' / 'loras'})")
    print(f"[demo] image with the LoRA:    {with_lora}")
    print(f"[demo] image without the LoRA: {without}")
    print(f"[demo] the LoRA {'changed' if changed else 'did NOT change'} the image")
    print(f"[demo] total {time.time() - t0:.1f} s")
    return 0 if changed else 1


if __name__ == "__main__":
    sys.exit(main())
