"""Helpers for tests that run the real engine: the real launcher, real DeepSpeed ranks (gloo on CPU)."""
from __future__ import annotations

import dataclasses
import os
import signal
import shutil
import subprocess
import time
from pathlib import Path

import torch

from PipeTrain.engine.launch import launcher
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec
from PipeTrain.engine.events import EventTail


def write_test_prompts(path: Path, clip, prompts: list[str]) -> Path:
    """The samples' prompts file (engine/sample_files.py) for `prompts`, encoded with `clip` as TrainPipeline does."""
    from PipeTrain.engine.sample_files import write_prompts

    def encode(text):
        return clip.encode_from_tokens_scheduled(clip.tokenize(text))[0]
    return write_prompts(path, prompts, [encode(p) for p in prompts], encode(""))


def with_samples(cfg: RunConfig, prompts_file: Path, **spec) -> RunConfig:
    """cfg rendering 64x64 samples every 4 steps (4 euler steps, cfg 1, seed 7), saved as run.json."""
    from PipeTrain.engine.config.sections import SampleSpec

    sample = SampleSpec(**{"every": 4, "prompts_file": str(prompts_file), "width": 64, "height": 64, "steps": 4,
                           "cfg": 1.0, "seed": 7, **spec})
    cfg = dataclasses.replace(cfg, sample=sample)
    cfg.save(Path(cfg.run_dir) / "run.json")
    return RunConfig.load(Path(cfg.run_dir) / "run.json")


def build_cache(comfy_root: str, demo_base: dict) -> str:
    """Encode the demo dataset with the tiny VAE + CLIP through the CacheLatents node, in-process."""
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    from PipeTrain.nodes.cache_latents import PipeTrainCacheLatents
    from PipeTrain.nodes.load_dataset import PipeTrainLoadDataset
    from tools.tiny_assets import load_tiny_encoders

    models = Path(demo_base["base_dir"]) / "models"
    vae, clip = load_tiny_encoders(str(models / "vae" / demo_base["vae"]),
                                   str(models / "text_encoders" / demo_base["clip"]))
    (dataset,) = PipeTrainLoadDataset().load(folders=demo_base["dataset"], resolution=64, repeats=1)
    (cache,) = PipeTrainCacheLatents().cache(dataset=dataset, vae=vae, clip=clip, regenerate=False)
    return cache.cache_dir


def make_config(run_dir: Path, comfy_root: str, demo_base: dict, cache_dir: str, processes: int = 1,
                resume: bool = False, lora: LoraSpec | None = None, memory: MemorySpec | None = None,
                **train) -> RunConfig:
    defaults = dict(steps=12, learning_rate=1e-3, batch_size=2, grad_accum=1, seed=0)
    model = Path(demo_base["base_dir"]) / "models" / "diffusion_models" / demo_base["unet"]
    cfg = RunConfig(run_name=run_dir.name, run_dir=str(run_dir), comfyui_root=comfy_root, model_path=str(model),
                    cache_dir=cache_dir, lora=lora or LoraSpec(rank=4, targets="attention_mlp"),
                    memory=memory or MemorySpec(),
                    train=TrainSpec(**{**defaults, **train}), launch=LaunchSpec(num_gpus=processes), resume=resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.save(run_dir / "run.json")
    return RunConfig.load(run_dir / "run.json")


def with_train(cfg: RunConfig, **changes) -> RunConfig:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **changes))


class EngineRun:
    """One launch of the engine as the node does it; collects events."""

    def __init__(self, cfg: RunConfig, owner: int | None = None):
        self.cfg = cfg
        Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
        cfg.save(Path(cfg.run_dir) / "run.json")
        self.tail = EventTail(cfg.run_dir, start_at_end=True)
        self.events: list[dict] = []
        self.launched = time.time()
        self.proc = launcher.spawn(cfg, str(Path(cfg.run_dir) / "run.json"), cuda=torch.cuda.is_available(),
                                   owner=owner)  # owner: a stand-in for the ComfyUI server

    def poll_events(self) -> list[dict]:
        new = self.tail.read_new()
        self.events += new
        return new

    def wait(self, timeout: float = 300) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            launcher.kill_tree(self.proc)
            raise AssertionError(f"engine run did not finish in {timeout} s:\n{self.log()}")
        self.poll_events()
        return self.proc.returncode

    def wait_for(self, kind: str, timeout: float = 300, min_step: int = 0) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for ev in self.poll_events():
                if ev["event"] == kind and ev.get("step", 0) >= min_step:
                    return ev
            if self.proc.poll() is not None:
                self.poll_events()
                raise AssertionError(f"engine exited ({self.proc.returncode}) before '{kind}':\n{self.log()}")
            time.sleep(0.1)
        raise AssertionError(f"no '{kind}' event within {timeout} s:\n{self.log()}")

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def losses(self) -> list[float]:
        return [e["loss"] for e in self.of("step")]

    def grad_norms(self) -> list[float]:
        """Each step's gradient norm before clipping (engine/train/grad_norm.py)."""
        return [e["grad_norm"] for e in self.of("step")]

    def log(self) -> str:
        return launcher.log_tail(self.cfg.run_dir, 60)


def run_to_end(cfg: RunConfig, timeout: float = 300) -> EngineRun:
    return _finished(EngineRun(cfg), timeout)


def _finished(run: EngineRun, timeout: float) -> EngineRun:
    rc = run.wait(timeout)
    assert rc == 0, f"engine failed with exit code {rc}:\n{run.log()}"
    assert run.of("done"), f"no 'done' event:\n{run.log()}"
    return run


def run_all_to_end(*cfgs: RunConfig, timeout: float = 300, at_once: int = 2) -> list[EngineRun]:
    """Independent runs, `at_once` of them side by side (each spends seconds starting its launcher and
    ranks), every one checked as run_to_end checks one; in the order given. Nothing outlives a failure."""
    runs: list[EngineRun] = []
    threads = os.environ.get("OMP_NUM_THREADS")
    try:
        for i in range(0, len(cfgs), at_once):
            # One thread per process unless the caller chose: side by side on 2 cores, a process with two
            # threads stalls behind the others' (the launcher gives a lone rank every core).
            os.environ["OMP_NUM_THREADS"] = threads or "1"
            try:
                group = [EngineRun(cfg) for cfg in cfgs[i:i + at_once]]
            finally:
                if threads is None:
                    del os.environ["OMP_NUM_THREADS"]
            runs += group
            for run in group:
                _finished(run, timeout)
    finally:
        for run in runs:
            launcher.kill_tree(run.proc)  # a no-op for the finished ones
    return runs


def engine_processes(marker: str) -> list[str]:
    """Live launcher and rank processes whose command line contains `marker` (Linux /proc)."""
    found = []
    for pid in Path("/proc").iterdir():
        if not pid.name.isdigit():
            continue
        try:
            cmd = (pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and "engine" in cmd and "--config" in cmd:  # launcher and ranks
            found.append(cmd)
    return found


def kill_engine_processes(marker: str) -> None:
    """SIGKILL, by pid, each launcher and rank whose command line contains `marker` (a test's cleanup)."""
    for pid in Path("/proc").iterdir():
        try:
            cmd = (pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if pid.name.isdigit() and marker in cmd and "engine" in cmd and "--config" in cmd:
                os.kill(int(pid.name), signal.SIGKILL)
        except OSError:
            continue


def rank_pids(marker: str) -> dict[int, int]:
    """{rank: pid} of the live DeepSpeed ranks whose command line contains `marker` (their RANK variable)."""
    found = {}
    for pid in Path("/proc").iterdir():
        if not pid.name.isdigit():
            continue
        try:
            cmd = (pid / "cmdline").read_bytes().split(b"\0")
            env = dict(v.split(b"=", 1) for v in (pid / "environ").read_bytes().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if b"engine" in cmd and any(marker.encode() in c for c in cmd) and b"RANK" in env:
            found[int(env[b"RANK"])] = int(pid.name)
    return found


def wait_for_steps(run_dir, count: int, timeout: float = 300, proc: subprocess.Popen | None = None) -> None:
    """Until events.jsonl of run_dir holds `count` step events (while `proc`, if given, runs)."""
    events = Path(run_dir) / "events.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = events.read_text(encoding="utf-8") if events.exists() else ""
        if text.count('"event": "step"') >= count:
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) before {count} steps:\n{launcher.log_tail(run_dir, 60)}")
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} steps within {timeout} s:\n{launcher.log_tail(run_dir, 60)}")


def rewound_copy(run_dir, to: Path, drop: str, latest: str) -> Path:
    """A copy of a finished run folder as it stood at checkpoint `latest` (e.g. "step000003"): the later
    checkpoint `drop` and the saved LoRA files (a full fine-tune's model files) removed, `latest` pointing
    back. Resuming it must repeat the uninterrupted run's later steps."""
    shutil.copytree(run_dir, to)
    shutil.rmtree(to / "checkpoints" / drop)
    saved = [to / d for d in ("lora", "model") if (to / d).is_dir()]
    assert saved, f"{run_dir} saved nothing"
    for folder in saved:
        shutil.rmtree(folder)
    (to / "checkpoints" / "latest").write_text(latest)
    return to


def final_lora(run_dir, name: str = "lora_final.safetensors") -> dict[str, torch.Tensor]:
    """A LoRA file a finished run wrote (<run_dir>/lora/lora_final.safetensors, or `name` there)."""
    from safetensors.torch import load_file

    return load_file(str(Path(run_dir) / "lora" / name))


def assert_same_lora(expected_dir, actual_dir, rtol: float, atol: float,
                     name: str = "lora_final.safetensors") -> dict[str, torch.Tensor]:
    """Both runs saved the same LoRA keys (in the file `name`) with values equal within tolerance; returns
    the expected one."""
    a, b = final_lora(expected_dir, name), final_lora(actual_dir, name)
    assert a, f"no LoRA tensors in {expected_dir}"
    assert a.keys() == b.keys(), f"LoRA keys differ: {sorted(a.keys() ^ b.keys())[:5]}"
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=rtol, atol=atol, msg=lambda m: f"{k}: {m}")
    return a


def stage_layers_forward(model, prepared):
    """The pipeline adapter's stage layers run in sequence on one process (what the stages compute)."""
    from PipeTrain.engine.models import adapter_for

    adapter = adapter_for(model)
    acts = adapter.first_stage_inputs(prepared)
    for layer in adapter.layers(model):
        acts = layer(acts)
    return acts


def trainable_lora(model, seed: int = 5) -> dict:
    """The LoRA parameters by name, with lora_B drawn at random (it starts at zero, which would
    leave every lora_A gradient zero)."""
    lora = {n: p for n, p in model.diffusion_model.named_parameters() if p.requires_grad}
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in lora.items():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return lora


def loss_and_lora_grads(model, prepared, lora: dict, run) -> tuple:
    """(native loss of run()'s prediction, {name: gradient or None}) after one backward."""
    from PipeTrain.engine.train.objective import native_loss

    model.zero_grad(set_to_none=True)
    loss = native_loss(run(), prepared.x0, prepared.scale)
    loss.backward()
    return loss.detach(), {n: None if p.grad is None else p.grad.clone() for n, p in lora.items()}


def pipeline_config(run_dir: Path, comfy_root: str, files, processes: int, stages: int, grad_accum: int) -> RunConfig:
    """Two steps of an adapter's 2-rank test: files = (model file, cache dir); batch 1, seed 1."""
    cfg = RunConfig(run_name=run_dir.name, run_dir=str(run_dir), comfyui_root=comfy_root, model_path=files[0],
                    cache_dir=files[1], lora=LoraSpec(rank=4, targets="attention_mlp"),
                    memory=MemorySpec(pipeline_stages=stages),
                    train=TrainSpec(steps=2, learning_rate=1e-3, batch_size=1, grad_accum=grad_accum, seed=1),
                    launch=LaunchSpec(num_gpus=processes))
    cfg.validate()
    return cfg
