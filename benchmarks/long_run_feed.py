"""A long run with frequent samples through a real ComfyUI server: what grows with steps and samples.

    COMFYUI_PATH=.comfyui/ComfyUI OMP_NUM_THREADS=1 .venv/bin/python benchmarks/long_run_feed.py \
        --work /tmp/pt_long_run [--steps 1000 --sample-every 5 --processes 1]

Starts ComfyUI (CPU) over the demo's tiny model and dataset, queues the example graph up to
TrainPipeline (steps and sample_every as given, the demo's two 64x64 sample prompts) and, while it
trains, reads the server's resident memory (VmRSS of /proc/<pid>/status) and GET
/pipetrain/run_state, the snapshot a reloaded page fetches (nodes/ui_feed.py). At the end it
prints one JSON object: server RSS before the queue, at the first step and after the run,
events.jsonl's size, the snapshot's size (bytes of JSON, how many events and samples it lists) at
a quarter, half, three quarters and the end of the run, and the sample files on disk. A snapshot
that grows with the steps or with the samples shows as the later sizes rising with them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_env

sys.path.insert(0, str(bench_env.REPO))  # tools.*


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def snapshot(server, node: str) -> dict:
    import requests

    r = requests.get(server.url + "/pipetrain/run_state", params={"node": node}, timeout=60)
    if r.status_code != 200:
        return {}
    state = r.json()
    events = state.get("events", [])
    return {"bytes": len(r.content), "events": len(events),
            "step_events": sum(1 for e in events if e.get("event") == "step"),
            "samples": len(state.get("samples", [])), "status": state.get("status")}


def last_step(events_file: Path) -> int:
    if not events_file.exists():
        return 0
    step = 0
    with open(events_file, "rb") as f:
        f.seek(max(0, events_file.stat().st_size - 4096))
        for line in f.read().splitlines():
            if b'"event": "step"' in line:
                try:
                    step = max(step, int(json.loads(line)["step"]))
                except (ValueError, KeyError):
                    continue
    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="folder for the ComfyUI base dir")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--sample-every", type=int, default=5)
    parser.add_argument("--sample-steps", type=int, default=4, help="sampler steps per sample image")
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    root = bench_env.setup()
    from tools.comfy_server import ComfyServer
    from tools.demo import training_prompt
    from tools.tiny_assets import write_demo_base

    base = write_demo_base(str(Path(args.work).resolve() / "comfy_base"))
    prompt = training_prompt(base, args.steps, args.processes, "long_run", sample_every=args.sample_every,
                             sample_steps=args.sample_steps)
    node = next(k for k, v in prompt.items() if v["class_type"] == "PipeTrainTrainPipeline")
    run_dir = Path(base["base_dir"]) / "output" / "pipetrain" / "long_run"
    events_file = run_dir / "events.jsonl"
    out: dict = {"steps": args.steps, "sample_every": args.sample_every, "processes": args.processes,
                 "snapshots": {}}
    marks = {args.steps // 4: "quarter", args.steps // 2: "half", 3 * args.steps // 4: "three_quarters"}
    with ComfyServer(root, base["base_dir"], env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}) as server:
        pid = server.proc.pid
        out["rss_idle_mib"] = rss_mib(pid)
        started = time.time()
        prompt_id = server.queue(prompt)
        rss_peak = 0.0
        while True:
            step = last_step(events_file)
            rss = rss_mib(pid)
            rss_peak = max(rss_peak, rss)
            if step and "rss_first_step_mib" not in out:
                out["rss_first_step_mib"] = rss
            for mark, name in list(marks.items()):
                if step >= mark:
                    out["snapshots"][name] = {"step": step, "rss_mib": rss, **snapshot(server, node)}
                    marks.pop(mark)
            if not server.running_prompt_ids():
                break
            time.sleep(0.5)
        entry = server.wait(prompt_id, timeout=60)
        out["seconds"] = round(time.time() - started, 1)
        out["rss_after_mib"] = rss_mib(pid)
        out["rss_peak_sampled_mib"] = rss_peak
        out["snapshots"]["end"] = {"step": last_step(events_file), **snapshot(server, node)}
        out["node_output_images"] = len(entry["outputs"].get(node, {}).get("images", []))
    samples = run_dir / "samples"
    out["events_jsonl_bytes"] = events_file.stat().st_size
    out["sample_pngs_on_disk"] = len(list(samples.glob("*.png")))
    out["sample_latent_files_on_disk"] = len(list(samples.glob("step*.safetensors")))
    out["partial_files"] = sorted(p.name for p in samples.iterdir() if ".tmp" in p.name)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
