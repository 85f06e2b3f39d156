"""Starting and stopping a run's launcher (standard library only).

Used by the TrainPipeline node and by the headless command
    python -m engine.launch.launcher <run_dir>/run.json
Both start exactly the same process tree: on one machine our per-node launcher
`sys.executable -m engine.launch.local_ranks ...` (the ranks' environment as DeepSpeed's launcher sets it,
without its import of DeepSpeed), on several DeepSpeed's runner `-m deepspeed.launcher.runner`
(for the DeepSpeed-free backend, `sys.executable -m engine ...`), with cwd = the pack root,
in its own process group so a cancel or a failure can end every rank at once. Nothing here is
POSIX-only: Windows gets a new process group and CTRL_BREAK instead of signals to a group.

Several machines (launch.cluster): DeepSpeed's launcher with a hostfile, either over ssh from
node 0 or one launcher per node (`--node_rank N`, no_ssh); engine/launch/cluster.py checks the settings
and the master's address first.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..config.checks import ConfigError
from ..config.run import RunConfig
from ..events import EventTail
from . import cluster, rank_exits, run_lock
from .owner import OWNER_ENV, owner_value
from .stop_files import CANCEL_FILE, FINISH_FILE

PACK_ROOT = Path(__file__).resolve().parents[2]  # engine/launch/launcher.py -> the pack
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


def launcher_command(cfg: RunConfig, config_path: str | os.PathLike, master_port: int,
                     node: cluster.NodePlan | None = None, hostfile: str = "") -> list[str]:
    engine_args = ["engine", "--config", str(config_path)]
    if cfg.launch.backend == "plain":  # no launcher: the engine itself is the one process
        return [sys.executable, "-u", "-m"] + engine_args
    if node is not None:  # several machines: the flags DeepSpeed's users know (engine/launch/cluster.py)
        return ([sys.executable, "-u", "-m", "deepspeed.launcher.runner"]
                + cluster.runner_args(node, hostfile, cfg.launch.gpu_ids) + ["--module", "--no_local_rank"] + engine_args)
    return local_launcher(cfg.launch.device_ids(), master_port, engine_args)


def local_launcher(ids: list[int], master_port: int, module_args: list[str]) -> list[str]:
    """The per-node launcher (engine/launch/local_ranks.py) for ranks on this machine's devices `ids`, each
    running `python -m <module_args>`. DeepSpeed's own runner and launcher would add nothing here but their
    `import deepspeed`: 15-18 s of an H200 host's launch (docs/benchmarks.md)."""
    devices = ",".join(str(d) for d in local_devices(ids, os.environ.get("CUDA_VISIBLE_DEVICES")))
    return [sys.executable, "-u", "-m", "engine.launch.local_ranks", f"--devices={devices}", "--master_addr=127.0.0.1",
            f"--master_port={master_port}", "--"] + module_args


def local_devices(ids: list[int], visible: str | None) -> list[int]:
    """The device numbers the per-node launcher gives the ranks (it sets CUDA_VISIBLE_DEVICES to them) for
    the GPUs `ids` as this process numbers them: through this process's CUDA_VISIBLE_DEVICES where set."""
    shown = [int(v) for v in (visible or "").split(",") if v.strip().isdigit()]
    return [shown[i] if i < len(shown) else i for i in ids]


COMPILE_CACHE = ".torch-compile-cache"  # beside the run folders (output/pipetrain/), unless TORCHINDUCTOR_CACHE_DIR is set


def _chosen_compile_cache(value: str | None) -> bool:
    """Whether TORCHINDUCTOR_CACHE_DIR names a folder someone chose. torch writes its own default (the temp
    folder's torchinductor_<user>) into the environment of a process that compiled or imported its
    compiler (a ComfyUI server, a benchmark), so that value counts as unset."""
    if not value:
        return False
    import getpass
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        return True  # no user name to build torch's default from: keep the value
    return os.path.abspath(value) != os.path.join(tempfile.gettempdir(), "torchinductor_" + user)


def launcher_env(cfg: RunConfig, cuda: bool, owner: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop(OWNER_ENV, None)  # headless: nothing watched, even if this shell inherited the variable
    if owner is not None:  # the ranks stop (checkpoint, exit) once this process is gone (engine/launch/owner.py)
        env[OWNER_ENV] = owner_value(owner)
    if cfg.launch.backend == "plain" and cfg.launch.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = cfg.launch.gpu_ids  # the per-node launcher does this for its ranks
    if cfg.memory.expandable_segments:  # the ranks inherit it; torch reads it at its first CUDA allocation
        alloc = [o for o in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if o and "expandable_segments" not in o]
        env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(alloc + ["expandable_segments:True"])
    if not _chosen_compile_cache(env.get("TORCHINDUCTOR_CACHE_DIR")):
        # torch.compile's cache (inductor's graphs and kernels, Triton's binaries under it) beside the run
        # folders rather than in /tmp: a later run of the same model compiles nothing again, after a reboot too.
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(os.path.dirname(os.path.abspath(cfg.run_dir)), COMPILE_CACHE)
    if not cuda:
        env["DS_ACCELERATOR"] = "cpu"
        # Ranks share the CPU cores: without this each rank starts one thread per core.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.launch.num_gpus)))
    return env


def spawn(cfg: RunConfig, config_path: str | os.PathLike, cuda: bool, node_rank: int | None = None,
          master_addr: str | None = None, master_port: int | None = None, owner: int | None = None) -> subprocess.Popen:
    """Start the launcher in its own process group; stdout+stderr go to <run_dir>/train.log.

    Several machines: node_rank/master_addr/master_port override run.json's cluster settings for
    this node; the settings are validated and the master's address checked before anything starts.
    The run folder's lock (engine/launch/run_lock.py) passes to the launcher: a folder a live run
    holds is refused (run_lock.RunFolderBusy). owner: the pid whose end stops the run (the ComfyUI
    server); None (headless) watches nothing.
    """
    node = cluster.plan(cfg, node_rank, master_addr, master_port)
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)  # on nodes other than 0 it may not exist yet
    lock_rank = node.node_rank if node else 0
    run_lock.claim(cfg.run_dir, lock_rank)  # before anything of a live run's folder is touched
    try:
        proc = _start(cfg, config_path, cuda, node, owner)
    except BaseException:
        run_lock.release(cfg.run_dir, lock_rank, os.getpid())
        raise
    run_lock.hand_over(cfg.run_dir, lock_rank, proc.pid)
    return proc


def release(cfg: RunConfig, proc: subprocess.Popen, node_rank: int | None = None) -> None:
    """After the launcher ended: its run folder is free again (also the caller's own claim)."""
    if proc.poll() is None:
        return  # still running: the folder stays its own
    rank = cfg.launch.cluster.node_rank if node_rank is None else node_rank
    for pid in (proc.pid, os.getpid()):
        run_lock.release(cfg.run_dir, rank, pid)


def _start(cfg: RunConfig, config_path, cuda: bool, node: cluster.NodePlan | None, owner: int | None):
    hostfile = ""
    if node is not None:
        hostfile = node.hostfile or cluster.write_generated_hostfile(node, cfg.run_dir)
        cluster.check_master(node)
    port = cfg.launch.cluster.master_port or free_port()
    for leftover in (CANCEL_FILE, FINISH_FILE):  # a Cancel or Stop & save of an earlier attempt: a resume must not stop
        (Path(cfg.run_dir) / leftover).unlink(missing_ok=True)
    log = open(Path(cfg.run_dir) / log_name(node.node_rank if node else 0), "ab")
    kwargs = {}
    if os.name == "nt":
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
    else:
        kwargs["start_new_session"] = True
    try:
        return subprocess.Popen(launcher_command(cfg, config_path, port, node, hostfile), cwd=str(PACK_ROOT),
                                env=launcher_env(cfg, cuda, owner), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, **kwargs)
    finally:
        log.close()  # the child holds its own copy


def request_cancel(run_dir: str | os.PathLike) -> None:
    """Ask the engine to checkpoint and exit at the end of the current step."""
    (Path(run_dir) / CANCEL_FILE).touch()


def request_finish(run_dir: str | os.PathLike) -> None:
    """Stop & save: the engine ends after the current step as if it were the last (final LoRA, checkpoint,
    'done', exit code 0)."""
    (Path(run_dir) / FINISH_FILE).touch()


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


def log_name(node_rank: int) -> str:
    """train.log on node 0; train-node<N>.log on the others (a shared run folder keeps them apart)."""
    return LOG_FILE if node_rank == 0 else f"train-node{node_rank}.log"


def log_tail(run_dir: str | os.PathLike, lines: int = 40, name: str = LOG_FILE) -> str:
    path = Path(run_dir) / name
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 64_000))
        text = f.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def log_size(run_dir: str | os.PathLike, name: str = LOG_FILE) -> int:
    """Where the next launch's part of the (appended) log begins."""
    path = Path(run_dir) / name
    return path.stat().st_size if path.exists() else 0


def failure_cause(cfg: RunConfig, proc: subprocess.Popen, errors: list[dict], log_start: int,
                  name: str = LOG_FILE) -> str:
    """Why a launch failed, for the user: the first error event, or the rank that died of a signal
    (named with its pid) where train.log shows one (engine/launch/rank_exits.py)."""
    path = Path(cfg.run_dir) / name
    try:
        with open(path, "rb") as f:
            f.seek(log_start)
            text = f.read(4_000_000).decode("utf-8", errors="replace")  # the launcher's lines come first
            f.seek(max(f.tell(), path.stat().st_size - 200_000))
            text += "\n" + f.read().decode("utf-8", errors="replace")  # and its exit lines last
    except OSError:
        text = ""
    return rank_exits.failure_cause(text, errors, proc.returncode, proc.pid, cfg.launch.backend)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.launch.launcher", description="Run a PipeTrain run.json "
                                     "headless. On several machines with cluster.no_ssh, run it on every node.")
    parser.add_argument("config", nargs="+", help="the run's run.json; several: one run after the other, each "
                        "started only when the one before it finished (a Wan 2.2 experts pair: <run>_high_noise's, "
                        "then <run>_low_noise's). Every one is checked before the first starts.")
    parser.add_argument("--node_rank", type=int, help="this machine's node rank (0 = master); overrides run.json")
    parser.add_argument("--master_addr", help="node 0's address, as every node reaches it; overrides run.json")
    parser.add_argument("--master_port", type=int, help="node 0's rendezvous port; overrides run.json")
    return parser.parse_args(argv)


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (e.g. a cancelled SLURM job) stops the run like Ctrl+C


def _checked(paths: list[str]) -> list[RunConfig]:
    """Every run.json loaded and its files checked, before any starts; ConfigError names the file at fault."""
    configs, folders = [], {}
    for path in paths:
        try:
            cfg = RunConfig.load(path)
            cfg.check_files()  # before launch; every rank checks its own node's copies again at start
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}" if len(paths) > 1 else str(e)) from None
        folder = os.path.realpath(cfg.run_dir)
        if folder in folders:
            raise ConfigError(f"{path} and {folders[folder]} both train in {cfg.run_dir}: give each run its own "
                              "run_dir (or launch the folder once).")
        folders[folder] = path
        configs.append(cfg)
    return configs


def _run_one(cfg: RunConfig, config_path: str, args: argparse.Namespace) -> tuple[int, bool]:
    """Launch one run on this node and wait, relaying its log: (exit code, whether Ctrl+C / SIGTERM stopped it)."""
    node = cluster.plan(cfg, args.node_rank, args.master_addr, args.master_port)
    if node is not None:  # fail fast, before the slow torch import (spawn checks again)
        cluster.check_master(node)
    import torch

    tail = EventTail(cfg.run_dir, start_at_end=True)
    log = Path(cfg.run_dir) / log_name(cfg.launch.cluster.node_rank if args.node_rank is None else args.node_rank)
    log_start = log_size(cfg.run_dir, log.name)
    proc = spawn(cfg, os.path.abspath(config_path), cuda=torch.cuda.is_available(), node_rank=args.node_rank,
                 master_addr=args.master_addr, master_port=args.master_port)
    print(f"training in {cfg.run_dir} (log: {log}); Ctrl+C stops after a checkpoint; "
          f"creating {Path(cfg.run_dir) / FINISH_FILE} ends it after the current step as a finished run", flush=True)
    stopped = False
    try:
        while proc.poll() is None:
            time.sleep(1.0)
    except KeyboardInterrupt:
        stopped = True
        request_cancel(cfg.run_dir)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
    finally:
        release(cfg, proc, args.node_rank)
    print(log_tail(cfg.run_dir, 20, log.name))
    errors = [e for e in tail.read_new() if e.get("event") == "error"]
    cause = failure_cause(cfg, proc, errors, log_start, log.name) if proc.returncode else ""
    if cause or errors:  # the engine's own explanation, clearer than the last lines of a traceback
        print(f"error: {cause or errors[0].get('message', '')}", file=sys.stderr)
    return proc.returncode or 0, stopped


def _main(argv: list[str]) -> int:
    """Headless: launch the runs described by run.json files on this node, one after the other, and wait."""
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        configs = _checked(args.config)
        for i, (cfg, path) in enumerate(zip(configs, args.config)):
            code, stopped = _run_one(cfg, path, args)
            left = args.config[i + 1:]
            if (code or stopped) and left:
                why = "was stopped" if stopped else f"failed (exit code {code})"
                print(f"not started, because {path} {why}: {', '.join(left)}", file=sys.stderr)
            if code or stopped:
                return code
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before a run had started: nothing to stop
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
