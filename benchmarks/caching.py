"""Latent-cache speed and memory on CPU: LoadDataset + CacheLatents on generated datasets.

    COMFYUI_PATH=.comfyui/ComfyUI python benchmarks/caching.py --work /tmp/pt_cache_bench

For each dataset size (default 1000 and 10000 images) a fresh subprocess (so peak RSS is per
run) writes that many small images (PNG and JPEG, 64-128 px, several aspect ratios, each with
a .txt caption) and runs the real node functions in-process with the tiny VAE and CLIP of
tools/tiny_assets.py, loaded through ComfyUI as the tests do. It measures:
  - the first full cache (LoadDataset + CacheLatents): items/s;
  - peak RSS of the process above what it held after loading the encoders (RAM that grows
    with N would show here), and the cache's size on disk;
  - a re-run with nothing changed (LoadDataset's IS_CHANGED, its scan, CacheLatents, which reuses
    that scan: engine/data/scan_memo.py);
  - a re-run after touching 1% of the images (only those should be encoded again);
  - CacheLatents with trust_cache on (only the cache's manifests are read).
Unchanged items of a new fingerprint are copied from the previous cache's shards (read + write
of their tensors, no encoder call), so the touched re-run's time includes that I/O.

    python benchmarks/caching.py --work /tmp/pt_cache_bench --store 100000

measures the sharded store alone at scale: N tiny synthetic items written through the cache
writer API (no encoder), the metadata table and manifest, then opening the cache as training does
(RSS growth of opening + bucket keys + repeats) and random item reads.
Captions come from a pool of --captions distinct texts: the tiny CLIP is full CLIP-L size,
and CacheLatents encodes each distinct caption once, so a pool keeps the run short.
Prints a table and writes JSON (--json, default <work>/caching.json).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_env

sys.path.insert(0, str(bench_env.REPO))  # tools.tiny_assets

SIZES = ((64, 64), (96, 96), (128, 128), (128, 96), (96, 128), (128, 64), (64, 128), (112, 80))
SHAPES = ("circle", "square", "triangle", "diamond")
COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "white", "black")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


class RssSampler:
    """The highest RSS seen while running, sampled every 20 ms in a thread (ru_maxrss also counts
    the model-loading transient before the run, which can hide growth during it)."""

    def __init__(self):
        import threading

        self.peak, self._stop = _rss_mib(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_mib())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _rss_mib())


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_images(folder: Path, n: int, captions: int, seed: int = 0) -> list[Path]:
    """n small images (PNG and JPEG, mixed sizes) with captions from a pool of `captions` texts."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    pool = [f"a {COLOURS[i % 8]} {SHAPES[(i // 8) % 4]} on a {COLOURS[(i // 32 + i + 1) % 8]} background, style {i}"
            for i in range(captions)]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        img = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
        draw = ImageDraw.Draw(img)
        x, y = rng.randrange(w // 2), rng.randrange(h // 2)
        draw.ellipse([x, y, x + w // 3, y + h // 3], fill=tuple(rng.randrange(256) for _ in range(3)))
        path = folder / (f"img_{i:06d}" + (".jpg" if i % 3 == 0 else ".png"))
        img.save(path, quality=90) if path.suffix == ".jpg" else img.save(path)
        path.with_suffix(".txt").write_text(pool[rng.randrange(captions)] + "\n", encoding="utf-8")
        paths.append(path)
    return paths


class CountingVAE:
    """A real ComfyUI VAE that counts encode calls (how many items a run really encoded)."""

    def __init__(self, inner):
        self._inner, self.calls = inner, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def encode(self, pixels):
        self.calls += 1
        return self._inner.encode(pixels)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run_one(n: int, work: Path, captions: int, threads: int) -> dict:
    bench_env.setup()
    import logging

    import torch

    logging.getLogger("PipeTrain").setLevel(logging.WARNING)  # per-run info lines would flood the table
    torch.set_num_threads(threads)
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset

    from tools.tiny_assets import load_tiny_encoders

    models = work / "models"
    vae, clip = load_tiny_encoders(str(models / "vae.safetensors"), str(models / "clip.safetensors"))
    vae = CountingVAE(vae)
    # warm-up: one encode each, so lazily loaded weights count in the baseline, not in the run
    vae.encode(torch.zeros(1, 64, 64, 3))
    clip.encode_from_tokens_scheduled(clip.tokenize("warm up"))
    vae.calls = 0
    base_peak, base_rss = _peak_rss_mib(), _rss_mib()

    folder = work / f"set_{n}"
    shutil.rmtree(folder, ignore_errors=True)
    paths, t_write = _timed(lambda: write_images(folder, n, captions))
    loader, cacher = PipeTrainLoadDataset(), PipeTrainCacheLatents()
    args = {"folders": str(folder), "resolution": 64, "repeats": 1, "aspect_ratios": "auto", "bucket_multiple": 16}

    def load():
        return loader.load(**args)[0]

    def cache(spec, **kw):
        return cacher.cache(dataset=spec, vae=vae, clip=clip, regenerate=False, **kw)[0]

    out: dict = {"images": n, "write_images_s": t_write, "baseline_rss_mib": base_rss}
    sampler, cpu = RssSampler(), time.process_time()  # CPU seconds: steadier than wall time on a busy machine
    spec, out["first_load_s"] = _timed(load)
    first, out["first_cache_s"] = _timed(lambda: cache(spec))
    out["first_cpu_s"] = time.process_time() - cpu
    out["first_encoded"] = vae.calls
    out["items_per_s"] = n / (out["first_load_s"] + out["first_cache_s"])
    out["peak_rss_mib"] = _peak_rss_mib()  # the whole process, model loading included
    out["run_rss_growth_mib"] = sampler.stop() - base_rss  # during the first cache, over the loaded encoders
    out["base_peak_rss_mib"] = base_peak
    out["cache_mib"] = _dir_bytes(Path(first.cache_dir)) / 2**20

    vae.calls, cpu = 0, time.process_time()
    _, out["rerun_is_changed_s"] = _timed(lambda: PipeTrainLoadDataset.IS_CHANGED(**args))
    spec, out["rerun_load_s"] = _timed(load)
    again, out["rerun_cache_s"] = _timed(lambda: cache(spec))
    assert again == first, "an unchanged dataset must reuse its cache"
    out["rerun_encoded"], out["rerun_cpu_s"] = vae.calls, time.process_time() - cpu

    touched = paths[::100]
    for p in touched:  # a new mtime: what an edited file looks like to the fingerprint
        st = p.stat()
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    vae.calls, cpu = 0, time.process_time()
    spec, out["touch_load_s"] = _timed(load)
    touched_cache, out["touch_cache_s"] = _timed(lambda: cache(spec))
    out["touched"], out["touch_encoded"] = len(touched), vae.calls
    out["touch_cpu_s"] = time.process_time() - cpu
    assert touched_cache.count == n

    out["touch_rss_growth_mib"] = _rss_mib() - base_rss
    vae.calls = 0
    trusted, out["trust_cache_s"] = _timed(lambda: cache(spec, trust_cache=True))
    assert trusted == touched_cache and vae.calls == 0
    out["final_peak_rss_mib"] = _peak_rss_mib()
    shutil.rmtree(folder, ignore_errors=True)
    return out


def run_store(n: int, work: Path) -> dict:
    """The sharded store alone: n tiny items through ShardWriter, write_metadata, then reads."""
    import torch

    import PipeTrain.engine.cache.format as fmt
    from PipeTrain.engine.cache.reader import CachedDataset
    from PipeTrain.engine.cache.writer import write_item
    import PipeTrain.engine.cache.shards as store
    from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec

    folder = work / f"store_{n}"
    shutil.rmtree(folder, ignore_errors=True)
    cache_dir = folder / fmt.CACHE_FOLDER / ("0" * 16)
    out: dict = {"items": n}
    base, sampler = _rss_mib(), RssSampler()
    t = time.perf_counter()
    writer = store.ShardWriter(cache_dir)
    for i in range(n):
        write_item(writer, i, torch.randn(1, 4, 8, 8), torch.randn(1, 8 + i % 4, 16), {"pooled_output": None},
                       f"img{i:06d}.png", f"caption number {i}", 1)
    writer.flush()
    out["write_s"] = time.perf_counter() - t
    t = time.perf_counter()
    spec = DatasetSpec((FolderSpec(str(folder)),), 64)
    store.write_metadata(cache_dir, "0" * 16, spec, {}, lambda i: {"repeats": 1, "width": 64, "height": 64,
                                                                    "key": f"k{i}"})
    out["metadata_s"] = time.perf_counter() - t
    out["write_rss_growth_mib"] = sampler.stop() - base
    out["shards"] = len(list((cache_dir / store.SHARDS).iterdir()))
    out["files"] = sum(1 for _ in cache_dir.rglob("*"))
    out["disk_mib"] = _dir_bytes(cache_dir) / 2**20
    import gc

    gc.collect()
    base, t = _rss_mib(), time.perf_counter()
    ds = CachedDataset(cache_dir)
    buckets, repeats = ds.buckets(), [ds.repeats(i) for i in range(len(ds))]
    out["open_s"] = time.perf_counter() - t
    out["open_rss_growth_mib"] = _rss_mib() - base
    assert len(buckets) == len(repeats) == n
    picks = random.Random(0).sample(range(n), min(n, 1000))
    t = time.perf_counter()
    for i in picks:
        ds[i]
    out["read_ms_per_item"] = (time.perf_counter() - t) * 1000 / len(picks)
    shutil.rmtree(folder, ignore_errors=True)
    return out


ROWS = (("images", "{:d}"), ("items_per_s", "{:.1f}"), ("first_load_s", "{:.1f}"), ("first_cache_s", "{:.1f}"),
        ("first_cpu_s", "{:.1f}"), ("peak_rss_mib", "{:.0f}"), ("run_rss_growth_mib", "{:.0f}"),
        ("cache_mib", "{:.1f}"), ("rerun_is_changed_s", "{:.2f}"), ("rerun_load_s", "{:.2f}"),
        ("rerun_cache_s", "{:.2f}"), ("rerun_cpu_s", "{:.2f}"), ("rerun_encoded", "{:d}"), ("touched", "{:d}"),
        ("touch_encoded", "{:d}"), ("touch_load_s", "{:.2f}"), ("touch_cache_s", "{:.2f}"), ("touch_cpu_s", "{:.2f}"),
        ("trust_cache_s", "{:.3f}"), ("write_images_s", "{:.1f}"))


def table(results: list[dict]) -> str:
    lines = [f"{'':22s}" + "".join(f"{r['images']:>12d}" for r in results)]
    for key, fmt in ROWS[1:]:
        lines.append(f"{key:22s}" + "".join(f"{fmt.format(r[key]):>12s}" for r in results))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, help="scratch folder for the models, images and caches")
    ap.add_argument("--counts", type=int, nargs="+", default=[1000, 10000], help="dataset sizes, one run each")
    ap.add_argument("--captions", type=int, default=64, help="distinct captions in the pool")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steady figures on a shared machine)")
    ap.add_argument("--json", help="where to write the results (default <work>/caching.json)")
    ap.add_argument("--store", type=int, help="only the sharded store at this many synthetic items (no encoders)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one size in this process
    args = ap.parse_args(argv)
    work = Path(args.work).resolve()
    os.environ.setdefault("COMFYUI_PATH", str(bench_env.REPO / ".comfyui" / "ComfyUI"))
    if args.store:
        bench_env.setup()
        result = run_store(args.store, work)
        print("\n".join(f"{k:22s}{v:>12.2f}" if isinstance(v, float) else f"{k:22s}{v:>12d}" for k, v in result.items()))
        return
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, work, args.captions, args.threads)), flush=True)
        return
    models = work / "models"
    if not (models / "clip.safetensors").is_file():
        bench_env.setup()
        from tools.tiny_assets import write_tiny_clip, write_tiny_vae

        write_tiny_vae(str(models / "vae.safetensors"))
        write_tiny_clip(str(models / "clip.safetensors"))
    results = []
    for n in args.counts:
        cmd = [sys.executable, __file__, "--work", str(work), "--one", str(n), "--captions", str(args.captions),
               "--threads", str(args.threads)]
        proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, text=True, cwd=bench_env.REPO)
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not found:
            raise SystemExit(f"the run for {n} images failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        results.append(json.loads(found[-1][len("RESULT "):]))
        print(table(results[-1:]), flush=True)
    print("\n" + table(results))
    out = Path(args.json) if args.json else work / "caching.json"
    out.write_text(json.dumps({"threads": args.threads, "captions": args.captions, "runs": results}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
