"""The ranks' watch of the ComfyUI server that started them (engine/launch/owner.py): it fires once
that process is gone or its pid belongs to another process; headless launches watch nothing."""
from __future__ import annotations

import json
import subprocess
import sys
import threading

from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.launch import launcher, processes
from PipeTrain.engine.launch.owner import OWNER_ENV, OwnerWatch, owner_value, watched_owner


def _cfg() -> RunConfig:
    return RunConfig(run_name="r", run_dir="/none", comfyui_root="/none", model_path="/none.safetensors",
                     cache_dir="/none")


def test_the_watch_fires_when_the_owner_is_killed():
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = threading.Event()
    try:
        watch = OwnerWatch(json.loads(owner_value(server.pid)), gone.set, poll_s=0.05, kill_after_s=3600)
        watch.start()
        assert not gone.wait(0.5)
        server.kill()
        assert gone.wait(5), "the watch did not notice the killed owner"
    finally:
        server.kill()
        server.wait()


def test_a_reused_pid_is_not_the_owner():
    me = processes.identity()
    assert processes.is_running(me)
    assert not processes.is_running({**me, "start": me["start"] + "0"})  # same pid, another start time


def test_headless_launches_watch_nothing(monkeypatch):
    monkeypatch.setenv(OWNER_ENV, owner_value(1))  # a shell that inherited the server's variable
    assert OWNER_ENV not in launcher.launcher_env(_cfg(), cuda=True)
    env = launcher.launcher_env(_cfg(), cuda=True, owner=12345)
    assert json.loads(env[OWNER_ENV])["pid"] == 12345


def test_an_owner_on_another_host_is_not_watched():
    value = json.dumps({**processes.identity(), "host": "elsewhere"})
    assert watched_owner({OWNER_ENV: value}) is None
    assert watched_owner({OWNER_ENV: owner_value(1)})["pid"] == 1
    assert watched_owner({}) is None and watched_owner({OWNER_ENV: "garbage"}) is None
