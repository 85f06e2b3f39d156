"""The launch section of run.json (`launch`): how many processes, which GPUs, which backend, and the
machines of a multi-node run (`launch.cluster`, used by engine/launch/cluster.py). Plain data, no torch;
engine/config/run.py builds them from run.json.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .checks import check
from .choices import BACKENDS, HOST_RE


@dataclass(frozen=True)
class ClusterSpec:
    """Several machines, launched by DeepSpeed's own launcher (engine/launch/cluster.py). Defaults = one machine.

    Two ways DeepSpeed users know: a hostfile (`host slots=N` lines) that DeepSpeed reaches over
    ssh (pdsh) from one node, or one launcher per node (`no_ssh`, SLURM-style) given its node_rank
    and node 0's address. run.json is the same on every node; a node's own rank and the master's
    address can also be given on the command line (`python -m engine.launch.launcher run.json --node_rank 1`).
    """

    hostfile: str = ""  # path of a DeepSpeed hostfile; "" = none
    num_nodes: int = 0  # machines; 0 = every host of the hostfile (1 without a hostfile)
    node_rank: int = 0  # this machine's index with no_ssh (0 = the master); the command line overrides it
    master_addr: str = ""  # node 0's address as every node reaches it (or --master_addr); ssh mode: "" = ask via ssh
    master_port: int = 0  # 0 = 29500 on several machines, a free port on one
    no_ssh: bool = False  # start one launcher per node (SLURM-style) instead of DeepSpeed's ssh fan-out
    timeout_s: int = 1800  # how long a rank waits for the others (joining, any collective) before it fails

    @property
    def multi_node(self) -> bool:
        return bool(self.hostfile) or self.num_nodes > 1

    def validate(self) -> None:
        check(0 <= self.num_nodes <= 4096, f"cluster.num_nodes is {self.num_nodes}: use 0 (from the hostfile) "
              "or the number of machines.")
        check(self.node_rank >= 0, f"cluster.node_rank is {self.node_rank}: use 0 for the master node, 1, 2, ... "
              "for the others.")
        check(0 <= self.master_port <= 65535, f"cluster.master_port is {self.master_port}: use a TCP port such as "
              "29500 (or 0 for the default).")
        check(1 <= self.timeout_s <= 7 * 86400, f"cluster.timeout_s is {self.timeout_s}: use a number of seconds "
              "such as 1800 (how long ranks wait for each other before failing).")
        if self.master_addr:
            check(HOST_RE.match(self.master_addr) is not None, f"cluster.master_addr {self.master_addr!r} is not a "
                  "host name or IP address: use node 0's address, e.g. 10.0.0.1.")
        if not self.multi_node:
            check(self.node_rank == 0, f"cluster.node_rank is {self.node_rank} but the run has one node: set "
                  "cluster.num_nodes or cluster.hostfile, or use node_rank 0.")
            return
        if self.num_nodes and not self.hostfile:
            check(self.no_ssh, f"cluster.num_nodes is {self.num_nodes} without a hostfile: DeepSpeed needs the "
                  "host names to reach the nodes over ssh. Give a hostfile, or set no_ssh and start "
                  "`python -m engine.launch.launcher run.json --node_rank N` on every node.")
            check(self.node_rank < self.num_nodes, f"cluster.node_rank is {self.node_rank} but num_nodes is "
                  f"{self.num_nodes}: node ranks go from 0 to {self.num_nodes - 1}.")


@dataclass(frozen=True)
class LaunchSpec:
    num_gpus: int = 1  # processes per node; on a machine without CUDA these are CPU processes
    gpu_ids: str = ""  # e.g. "0,1"; "" = the first num_gpus visible devices (on every node)
    backend: str = "deepspeed"
    cluster: ClusterSpec = field(default_factory=ClusterSpec)

    def nodes(self) -> int:
        """Machines in the run; 0 = not known before the hostfile is read (engine/launch/cluster.py)."""
        c = self.cluster
        return c.num_nodes or (0 if c.hostfile else 1)

    def validate(self) -> None:
        check(1 <= self.num_gpus <= 1024, f"launch.num_gpus is {self.num_gpus}: use 1 or more.")
        check(self.backend in BACKENDS, f"launch.backend is {self.backend!r}: choose one of {', '.join(BACKENDS)}.")
        check(self.backend == "deepspeed" or self.num_gpus == 1,
              f"{self.num_gpus} GPUs need DeepSpeed, which is not in use (backend '{self.backend}'): "
              "install it (pip install deepspeed, Linux) or train on 1 GPU.")
        self.cluster.validate()
        check(self.backend == "deepspeed" or not self.cluster.multi_node,
              f"several nodes need DeepSpeed, which is not in use (backend '{self.backend}'): install it "
              "(pip install deepspeed, Linux) or train on one machine.")
        if self.gpu_ids:
            check(re.fullmatch(r"\d+(,\d+)*", self.gpu_ids) is not None,
                  f"gpu_ids {self.gpu_ids!r} is not a comma-separated list of GPU numbers like '0,1'.")
            ids = self.gpu_ids.split(",")
            twice = sorted({i for i in ids if ids.count(i) > 1}, key=int)
            check(not twice, f"gpu_ids {self.gpu_ids!r} lists GPU {', '.join(twice)} more than once: list each GPU "
                  "once (one training process per GPU).")
            check(len(ids) == self.num_gpus, f"gpu_ids lists {len(ids)} GPUs but num_gpus is {self.num_gpus}: "
                  "make them agree.")

    def device_ids(self) -> list[int]:
        return [int(i) for i in self.gpu_ids.split(",")] if self.gpu_ids else list(range(self.num_gpus))
