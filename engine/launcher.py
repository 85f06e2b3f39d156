"""Starting and stopping the DeepSpeed launcher for a run (standard library only).

Used by the TrainPipeline node and by the headless command
    python -m engine.launcher <run_dir>/run.json
Both start exactly the same process tree: `sys.executable -m deepspeed.launcher.runner ...`
(or, for the DeepSpeed-free backend, `sys.executable -m engine ...`) with cwd = the pack root,
in its own process group so a cancel or a failure can end every rank at once. Nothing here is
POSIX-only: Windows gets a new process group and CTRL_BREAK instead of signals to a group.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .config import ConfigError, RunConfig

PACK_ROOT = Path(__file__).resolve().parent.parent
LOG_FILE = "train.log"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deepspeed_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


def resolve_backend(requested: str) -> str:
    """'auto' -> DeepSpeed where it is installed, else one plain PyTorch process."""
    if requested == "auto":
        return "deepspeed" if deepspeed_available() else "plain"
    if requested == "deepspeed" and not deepspeed_available():
        raise ConfigError("backend 'deepspeed' is selected but DeepSpeed is not installed in ComfyUI's Python: "
                          "pip install deepspeed (Linux), or choose backend 'auto'/'plain' for one GPU.")
    return requested


def launcher_command(cfg: RunConfig, config_path: str | os.PathLike, master_port: int) -> list[str]:
    if cfg.launch.backend == "plain":  # no launcher: the engine itself is the one process
        return [sys.executable, "-u", "-m", "engine", "--config", str(config_path)]
    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.runner", "--master_port", str(master_port)]
    if cfg.launch.gpu_ids:
        cmd += ["--include", "localhost:" + cfg.launch.gpu_ids]
    else:
        cmd += ["--num_gpus", str(cfg.launch.num_gpus)]
    return cmd + ["--module", "--no_local_rank", "engine", "--config", str(config_path)]


def launcher_env(cfg: RunConfig, cuda: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if cfg.launch.backend == "plain" and cfg.launch.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = cfg.launch.gpu_ids  # the DeepSpeed launcher does this for its ranks
    if not cuda:
        env["DS_ACCELERATOR"] = "cpu"
        # Ranks share the CPU cores: without this each rank starts one thread per core.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.launch.num_gpus)))
    return env


def spawn(cfg: RunConfig, config_path: str | os.PathLike, cuda: bool) -> subprocess.Popen:
    """Start the launcher in its own process group; stdout+stderr go to <run_dir>/train.log."""
    (Path(cfg.run_dir) / "cancel").unlink(missing_ok=True)  # a cancel of an earlier attempt
    log = open(Path(cfg.run_dir) / LOG_FILE, "ab")
    kwargs = {}
    if os.name == "nt":
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
    else:
        kwargs["start_new_session"] = True
    try:
        return subprocess.Popen(launcher_command(cfg, config_path, free_port()), cwd=str(PACK_ROOT),
                                env=launcher_env(cfg, cuda), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, **kwargs)
    finally:
        log.close()  # the child holds its own copy


def request_cancel(run_dir: str | os.PathLike) -> None:
    """Ask the engine to checkpoint and exit at the end of the current step."""
    (Path(run_dir) / "cancel").touch()


def kill_tree(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """End the launcher and every rank: polite signal first, then kill after `grace` seconds."""
    if proc.poll() is not None:
        return
    if os.name == "nt":
        proc.send_signal(signal.CTRL_BREAK_EVENT)
    else:
        _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    if os.name == "nt":
        proc.kill()
    else:
        _signal_group(proc.pid, signal.SIGKILL)  # ranks may outlive the launcher: kill the group
    proc.wait()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def log_tail(run_dir: str | os.PathLike, lines: int = 40) -> str:
    path = Path(run_dir) / LOG_FILE
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 64_000))
        text = f.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _main(argv: list[str]) -> int:
    """Headless: launch the run described by a run.json and wait, relaying its log."""
    if len(argv) != 1:
        print("usage: python -m engine.launcher <run_dir>/run.json", file=sys.stderr)
        return 2
    cfg = RunConfig.load(argv[0])
    import torch

    proc = spawn(cfg, os.path.abspath(argv[0]), cuda=torch.cuda.is_available())
    print(f"training in {cfg.run_dir} (log: {Path(cfg.run_dir) / LOG_FILE}); Ctrl+C stops after a checkpoint")
    try:
        while proc.poll() is None:
            time.sleep(1.0)
    except KeyboardInterrupt:
        request_cancel(cfg.run_dir)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
    print(log_tail(cfg.run_dir, 20))
    return proc.returncode or 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
