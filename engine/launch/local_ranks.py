"""The per-node launcher on one machine: starts the ranks, watches them, ends them together (standard
library only; psutil where installed).

    python -m engine.launch.local_ranks --devices 0,1 --master_port 29500 -- engine --config run.json
    (after `--`: a module and its arguments, or a Python file's path and its arguments)

It gives each rank the environment DeepSpeed's own per-node launcher (`deepspeed.launcher.launch`)
gives it: CUDA_VISIBLE_DEVICES (the run's devices), MASTER_ADDR / MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK, LOCAL_SIZE, CROSS_RANK / CROSS_SIZE (this node of one). What it does not do is import
DeepSpeed: that import is most of a launch's start-up (about 7 s on a 2-core CI machine, 15-18 s on
an H200 host; docs/benchmarks.md), and DeepSpeed's launcher pays it only to read two constants. The
ranks themselves still run DeepSpeed. Several machines keep DeepSpeed's runner and its launcher
(engine/launch/cluster.py).

Its lines in train.log, which engine/launch/rank_exits.py reads to name a rank killed by a signal:
    [local_ranks] rank 0 is process 1234: python -u -m engine --config run.json
    [local_ranks] rank 0 (process 1234) finished
    [local_ranks] rank 1 (process 1235) exited with code -9: stopping the other ranks
    [local_ranks] every rank has ended; exiting with rank 1's code
When one rank fails the others get SIGTERM, then SIGKILL after STOP_GRACE_S, and this process exits
with the failed rank's code (128 + signal for a signal, as a shell reports it). SIGTERM or SIGINT to
this process stops every rank the same way.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

STOP_GRACE_S = 30.0  # how long a stopped rank may take to exit before it is killed (DeepSpeed's launcher: 30 s)
POLL_S = 1.0  # as DeepSpeed's launcher: a rank that died stays a zombie up to a second, long enough for
# the surviving ranks to read its exit status (engine/launch/rank_exits.py: lost_ranks)


def rank_env(base: dict[str, str], devices: list[int], rank: int, master_addr: str, master_port: int) -> dict[str, str]:
    """The environment of local rank `rank` of a one-node run on `devices`."""
    env = dict(base)
    env.update({"CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in devices), "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port), "WORLD_SIZE": str(len(devices)), "LOCAL_SIZE": str(len(devices)),
                "RANK": str(rank), "LOCAL_RANK": str(rank), "CROSS_RANK": "0", "CROSS_SIZE": "1"})
    return env


def rank_command(args: list[str]) -> list[str]:
    """What each rank runs: `python -u -m MODULE ARGS`, or `python -u FILE.py ARGS` where the first
    argument is a Python file (as DeepSpeed's launcher takes a module with --module, else a script)."""
    return [sys.executable, "-u"] + (args if args[0].endswith(".py") else ["-m"] + args)


def exit_code(returncode: int) -> int:
    """A rank's exit status as this process's own: a signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _say(line: str) -> None:
    print(f"[local_ranks] {line}", flush=True)


def _stop(procs: list, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to every live rank (and its children), SIGKILL to what is left after `grace` seconds."""
    import subprocess

    for sig in _STOP_SIGNALS:  # a second SIGTERM (a group kill reaches the ranks too) must not cut this short
        signal.signal(sig, signal.SIG_IGN)
    live = [p for p in procs if p.poll() is None]
    targets = {p.pid: p for p in live}
    try:
        import psutil  # a rank's own children (compile workers, data loaders) too, where psutil is installed

        for p in live:
            try:
                for child in psutil.Process(p.pid).children(recursive=True):
                    targets.setdefault(child.pid, None)
            except psutil.Error:
                pass
    except ImportError:
        pass
    for pid in targets:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for pid, p in targets.items():
        if p is None or p.poll() is None:
            try:
                os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
            except OSError:
                pass
    for p in live:
        p.wait()


_STOP_SIGNALS = [s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGBREAK", None)) if s is not None]


class _Stopped(Exception):
    pass


def _interrupted(signum, frame):
    raise _Stopped(signum)


def run(devices: list[int], master_addr: str, master_port: int, module_args: list[str]) -> int:
    """Start one rank per device, wait for all; returns this launcher's exit code."""
    import subprocess

    procs = []
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _interrupted)
    cmd = rank_command(module_args)
    try:
        for rank in range(len(devices)):
            procs.append(subprocess.Popen(cmd, env=rank_env(os.environ, devices, rank, master_addr, master_port)))
            _say(f"rank {rank} is process {procs[-1].pid}: {' '.join(cmd)}")
        running = dict(enumerate(procs))
        while running:
            time.sleep(POLL_S)
            for rank, proc in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                del running[rank]
                if code == 0:
                    _say(f"rank {rank} (process {proc.pid}) finished")
                    continue
                _say(f"rank {rank} (process {proc.pid}) exited with code {code}: stopping the other ranks")
                _stop(procs)
                _say(f"every rank has ended; exiting with rank {rank}'s code")
                return exit_code(code)
        return 0
    except _Stopped as stop:
        _say(f"signal {stop.args[0]}: stopping every rank")
        _stop(procs)
        _say("every rank has ended")
        return 1


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.launch.local_ranks",
                                     description="Start one rank per device on this machine.")
    parser.add_argument("--devices", required=True, help="device numbers, comma-separated, one rank each")
    parser.add_argument("--master_addr", default="127.0.0.1")
    parser.add_argument("--master_port", type=int, required=True)
    parser.add_argument("module_args", nargs=argparse.REMAINDER,
                        help="-- MODULE ARGS... (what `python -m` runs) or -- FILE.py ARGS... (a script)")
    args = parser.parse_args(argv)
    if args.module_args[:1] == ["--"]:
        args.module_args = args.module_args[1:]
    if not args.module_args:
        parser.error("no module to run: add -- MODULE ARGS...")
    return args


def main(argv: list[str]) -> int:
    args = _parse(argv)
    devices = [int(d) for d in args.devices.split(",") if d.strip()]
    return run(devices, args.master_addr, args.master_port, args.module_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
