"""Run a real ComfyUI server in a subprocess (the demo and the end-to-end tests).

The pack is installed the way a user installs it (a folder in `custom_nodes/`; here a symlink to
this repository) and graphs go through the same HTTP API the browser uses, so a test sees what a
user would: node registration, validation errors, execution errors.

    with ComfyServer(comfy_root, base_dir) as server:
        entry = server.wait(server.queue(prompt), timeout=60)

It lives in tools/, not tests/: once ComfyUI is on sys.path its own `tests` package would
shadow ours.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import requests

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACK_NAME = "PipeTrain"


class ComfyError(RuntimeError):
    """The server rejected a prompt or failed running it; the message carries its explanation."""


class ComfyInterrupted(ComfyError):
    """The prompt stopped because of an interrupt (POST /interrupt)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    def __init__(self, comfy_root: str, base_dir: str, python: str = sys.executable,
                 port: int | None = None, extra_args: tuple[str, ...] = (), pack_root: str = REPO_ROOT,
                 env: dict[str, str] | None = None, startup_timeout: float = 120.0):
        self.comfy_root = os.path.abspath(comfy_root)
        self.base_dir = os.path.abspath(base_dir)
        self.python = python
        self.port = port
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})  # added to this process's environment for the server
        self.pack_root = os.path.abspath(pack_root)
        self.startup_timeout = startup_timeout
        self.log_path = os.path.join(self.base_dir, "comfyui.log")
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------ lifecycle

    def _link_pack(self) -> None:
        custom_nodes = os.path.join(self.base_dir, "custom_nodes")
        os.makedirs(custom_nodes, exist_ok=True)
        link = os.path.join(custom_nodes, PACK_NAME)
        if os.path.islink(link):
            if os.path.realpath(link) == os.path.realpath(self.pack_root):
                return
            os.remove(link)  # a link left by another checkout: ours must be the one under test
        elif os.path.exists(link):
            raise RuntimeError(f"{link} exists and is not a symlink; remove it so the pack under test is used.")
        os.symlink(self.pack_root, link, target_is_directory=True)

    def start(self) -> "ComfyServer":
        if self.proc is not None:
            raise RuntimeError("ComfyServer already started")
        main_py = os.path.join(self.comfy_root, "main.py")
        if not os.path.isfile(main_py):
            raise FileNotFoundError(f"No ComfyUI at {self.comfy_root}: run scripts/bootstrap.sh or set COMFYUI_PATH.")
        os.makedirs(os.path.join(self.base_dir, "user"), exist_ok=True)
        self._link_pack()
        self.port = self.port or _free_port()
        cmd = [
            self.python, main_py, "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
            "--base-directory", self.base_dir, "--disable-auto-launch",
            # ComfyUI keeps its sqlite database inside its own tree by default; servers of
            # concurrent test sessions must not share (or write into) the install.
            "--database-url", "sqlite:///" + os.path.join(self.base_dir, "user", "comfyui.db"),
            *self.extra_args,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)  # unbuffered: the log is current when a test fails
        self._log_file = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(cmd, cwd=self.base_dir, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._log_file, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ComfyError(f"ComfyUI exited with code {self.proc.returncode} while starting.\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/system_stats", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise ComfyError(f"ComfyUI did not answer /system_stats within {self.startup_timeout:.0f} s.\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server (its own PID only): Ctrl-C first, as a user stops ComfyUI, so exit
        handlers run (the pack must stop its training ranks then); SIGTERM, then SIGKILL if it hangs."""
        if self.proc is not None:
            for send in (lambda: self.proc.send_signal(signal.SIGINT), self.proc.terminate, self.proc.kill):
                if self.proc.poll() is not None:
                    break
                send()
                try:
                    self.proc.wait(timeout / 3)
                except subprocess.TimeoutExpired:
                    continue
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "ComfyServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ logs

    def log_text(self) -> str:
        if not os.path.isfile(self.log_path):
            return ""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def log_tail(self, lines: int = 60) -> str:
        tail = self.log_text().splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.log_path} ---\n" + "\n".join(tail)

    def import_failed(self, name: str = PACK_NAME) -> bool:
        """True when ComfyUI's start-up summary marks custom node folder `name` as IMPORT FAILED."""
        return any("IMPORT FAILED" in line and line.rstrip().endswith(os.sep + name)
                   for line in self.log_text().splitlines())

    # ------------------------------------------------------------ HTTP API

    def _check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise ComfyError(f"ComfyUI is not running (exit code {code}).\n{self.log_tail()}")

    def object_info(self, node_class: str) -> dict:
        """The node's definition, or {} when ComfyUI has no node of that class."""
        self._check_alive()
        r = requests.get(f"{self.url}/object_info/{node_class}", timeout=30)
        r.raise_for_status()
        return r.json().get(node_class, {})

    def queue(self, prompt: dict, client_id: str | None = None) -> str:
        """POST an API-format graph; returns its prompt_id. A rejected graph raises with node_errors."""
        self._check_alive()
        body = {"prompt": prompt}
        if client_id:
            body["client_id"] = client_id
        r = requests.post(self.url + "/prompt", json=body, timeout=60)
        if r.status_code != 200:
            raise ComfyError(f"POST /prompt answered {r.status_code}: {r.text}")
        return r.json()["prompt_id"]

    def wait(self, prompt_id: str, timeout: float = 120.0, poll: float = 0.2) -> dict:
        """Poll /history until the prompt finishes; returns its history entry or raises its error."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            r = requests.get(f"{self.url}/history/{prompt_id}", timeout=30)
            r.raise_for_status()
            entry = r.json().get(prompt_id)
            status = (entry or {}).get("status") or {}
            if status.get("status_str") == "error":
                raise self._execution_error(prompt_id, status)
            if entry is not None and status.get("completed", True):
                return entry
            if time.monotonic() > deadline:
                raise TimeoutError(f"prompt {prompt_id} did not finish within {timeout:.0f} s.\n{self.log_tail()}")
            time.sleep(poll)

    def run(self, prompt: dict, timeout: float = 120.0) -> dict:
        return self.wait(self.queue(prompt), timeout=timeout)

    @staticmethod
    def _execution_error(prompt_id: str, status: dict) -> ComfyError:
        for event, data in status.get("messages", []):
            if event == "execution_interrupted":
                return ComfyInterrupted(f"prompt {prompt_id} interrupted at node {data.get('node_id')} ({data.get('node_type')})")
            if event == "execution_error":
                trace = "".join(data.get("traceback") or [])
                return ComfyError(
                    f"prompt {prompt_id} failed in node {data.get('node_id')} ({data.get('node_type')}): "
                    f"{data.get('exception_type')}: {data.get('exception_message')}\n{trace}")
        return ComfyError(f"prompt {prompt_id} failed: {status}")

    def running_prompt_ids(self) -> list[str]:
        """Prompts the server is executing now (GET /queue: queue_running items are [n, prompt_id, ...])."""
        self._check_alive()
        r = requests.get(self.url + "/queue", timeout=30)
        r.raise_for_status()
        return [item[1] for item in r.json().get("queue_running", [])]

    def interrupt(self) -> None:
        """POST /interrupt. ComfyUI clears the flag when a prompt starts: interrupt a running one."""
        self._check_alive()
        requests.post(self.url + "/interrupt", timeout=30).raise_for_status()

    def image_paths(self, entry: dict) -> list[str]:
        """Absolute paths of the images a finished prompt's output nodes saved."""
        roots = {"output": "output", "temp": "temp", "input": "input"}
        paths = []
        for node_output in entry.get("outputs", {}).values():
            for image in node_output.get("images", []):
                folder = roots.get(image.get("type", "output"), "output")
                paths.append(os.path.join(self.base_dir, folder, image.get("subfolder", ""), image["filename"]))
        return paths
