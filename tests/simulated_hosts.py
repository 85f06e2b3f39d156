"""Two "hosts" on one machine for the multi-node tests: network namespaces joined by a veth pair.

Host A (node 0) is 10.77.0.1/24 and host B (node 1) 10.77.0.2/24, each with its own loopback, so
the only way between them is the veth link, as between two machines (they still share the
filesystem: the shared-filesystem setup of docs/multi-node.md). Names carry a tag that includes
the test process's PID, so parallel runs never collide. Needs root (CAP_NET_ADMIN) and iproute2's
`ip` (scripts/bootstrap.sh installs it where apt is available).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time


class SimulatedHosts:
    ADDRESSES = ("10.77.0.1", "10.77.0.2")

    def __init__(self, tag: str):
        self.netns = (f"{tag}a", f"{tag}b")
        self.links = (f"{tag}x", f"{tag}y")  # interface names: at most 15 characters
        self.procs: list[subprocess.Popen] = []

    def create(self) -> None:
        if shutil.which("ip") is None:
            raise RuntimeError("the multi-node tests need iproute2's `ip` (scripts/bootstrap.sh installs it with apt)")
        a, b = self.netns
        x, y = self.links
        for ns in self.netns:  # left by a killed test process that had our PID (it is gone: PIDs are unique)
            if os.path.exists(f"/var/run/netns/{ns}"):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._ip("netns", "add", a)
        self._ip("netns", "add", b)
        self._ip("link", "add", x, "type", "veth", "peer", "name", y)
        for ns, link, addr in ((a, x, self.ADDRESSES[0]), (b, y, self.ADDRESSES[1])):
            self._ip("link", "set", link, "netns", ns)
            self._ip("-n", ns, "addr", "add", f"{addr}/24", "dev", link)
            self._ip("-n", ns, "link", "set", link, "up")
            self._ip("-n", ns, "link", "set", "lo", "up")

    def popen(self, host: int, cmd: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
        """Start `cmd` inside host A (0) or B (1).

        gloo binds each rank to the address of the machine's host name unless GLOO_SOCKET_IFNAME
        names an interface; both namespaces share the host name (and it resolves to neither), so
        each host names its veth, as users do on machines with several networks (docs/multi-node.md).
        """
        env = {**(os.environ if env is None else env), "GLOO_SOCKET_IFNAME": self.links[host]}
        proc = subprocess.Popen(["ip", "netns", "exec", self.netns[host], *cmd], start_new_session=True, env=env,
                                **kwargs)
        self.procs.append(proc)
        return proc

    def pids(self, host: int) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.netns[host]], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill(self, host: int, timeout: float = 10.0) -> None:
        """SIGKILL every process in the host's namespace (they are all ours: the namespace is)."""
        deadline = time.time() + timeout
        while (pids := self.pids(host)) and time.time() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for proc in self.procs:  # reap the ones this process started
            if proc.poll() is None and self._in_host(proc, host):
                proc.wait(timeout=5)

    def set_link(self, host: int, up: bool) -> None:
        """Unplug (or plug back) a host's cable: no FIN or RST reaches the other side."""
        self._ip("-n", self.netns[host], "link", "set", self.links[host], "up" if up else "down")

    def destroy(self) -> None:
        for host in (0, 1):
            if os.path.exists(f"/var/run/netns/{self.netns[host]}"):
                self.kill(host)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
        for ns in self.netns:  # deleting a namespace deletes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def _in_host(self, proc: subprocess.Popen, host: int) -> bool:
        return proc.args[:4] == ["ip", "netns", "exec", self.netns[host]]

    @staticmethod
    def _ip(*args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()} (the multi-node tests need "
                               "root, i.e. CAP_NET_ADMIN, to create network namespaces)")
