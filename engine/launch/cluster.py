"""Several machines: the checks before launch and the flags for DeepSpeed's own multi-node launcher.

Standard library only (the TrainPipeline node uses it too). DeepSpeed does the launching, with the
flags its users know (`--hostfile`, `--no_ssh --node_rank N`, `--master_addr/--master_port`); this
module reads the settings (config.ClusterSpec), refuses those that cannot work with a message that
says what to change, and checks that the master can be reached before any rank starts. What needs
every rank (same versions, config and checkpoint on every node) is checked by the engine itself at
start: engine/train/node_checks.py.

Rank layout: DeepSpeed numbers ranks node by node in hostfile order (node 0 holds ranks
0..g-1 of its g GPUs), and its pipeline topology puts data parallelism innermost (rank = stage *
replicas + replica). So when the replicas (GPUs / pipeline_stages) divide g, each stage's
data-parallel group sits on one node (the gradient all-reduce stays on the fast local links) and
only activations between stages cross the network: 2 nodes x 2 GPUs with 2 stages puts stage 0 on
node 0 and stage 1 on node 1 (tests/training/test_multinode.py asserts it).
"""
from __future__ import annotations

import dataclasses
import errno
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from ..atomic_files import write_text
from ..config.checks import ConfigError
from ..config.rules import data_parallel_size
from ..config.run import RunConfig
from . import rank_exits

DEFAULT_MASTER_PORT = 29500  # DeepSpeed's and torch.distributed's usual port
_HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")  # what DeepSpeed's runner accepts (it ignores the rest)


class ClusterError(ConfigError):
    """The nodes cannot work together as configured (unreachable master, different versions...)."""


@dataclass(frozen=True)
class NodePlan:
    """One node's part in a multi-node launch."""

    hosts: tuple[tuple[str, int], ...]  # (host, slots) of every node, in node-rank order
    node_rank: int
    master_addr: str
    master_port: int
    no_ssh: bool
    gpus_per_node: int
    hostfile: str  # the user's hostfile, or "" when num_nodes was given (one is written at launch)

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.gpus_per_node


def read_hostfile(path: str) -> list[tuple[str, int]]:
    """(host, slots) per line of a DeepSpeed/MPI hostfile; comments and blank lines are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(f"cluster.hostfile {path} cannot be read on this machine ({e.strerror}): give the path "
                          "of a file with one `host slots=N` line per node (the same path on every node).") from e
    hosts: list[tuple[str, int]] = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _HOSTFILE_LINE.match(line)
        if m is None:
            raise ConfigError(f"cluster.hostfile {path} line {number} {line!r} is not `host slots=N` (e.g. "
                              "`worker-1 slots=8`): fix that line.")
        host, slots = m.group(1), int(m.group(2))
        if any(h == host for h, _ in hosts):
            raise ConfigError(f"cluster.hostfile {path} lists {host} twice (line {number}): list each node once.")
        if slots < 1:
            raise ConfigError(f"cluster.hostfile {path} line {number}: {host} has slots={slots}; give it at "
                              "least 1 slot (one per GPU) or remove the line.")
        hosts.append((host, slots))
    if not hosts:
        raise ConfigError(f"cluster.hostfile {path} lists no nodes: add one `host slots=N` line per node.")
    return hosts


def plan(cfg: RunConfig, node_rank: int | None = None, master_addr: str | None = None,
         master_port: int | None = None) -> NodePlan | None:
    """Validate the multi-node settings (with command-line overrides); None for a one-machine run."""
    c = cfg.launch.cluster
    overrides = {k: v for k, v in (("node_rank", node_rank), ("master_addr", master_addr),
                                   ("master_port", master_port)) if v is not None}
    c = dataclasses.replace(c, **overrides)
    c.validate()
    if not c.multi_node:
        return None
    if c.no_ssh and not c.master_addr:  # not in run.json: under SLURM it is known only when the job starts
        raise ConfigError("cluster.master_addr is empty: with no_ssh every node needs node 0's address (e.g. "
                          "10.0.0.1), in run.json or as --master_addr on each node's command line.")
    per_node = cfg.launch.num_gpus
    if c.hostfile:
        hosts = read_hostfile(c.hostfile)
        if c.num_nodes:
            if c.num_nodes > len(hosts):
                raise ConfigError(f"cluster.num_nodes is {c.num_nodes} but {c.hostfile} lists {len(hosts)} "
                                  "node(s): add hosts or lower num_nodes (0 = all of them).")
            hosts = hosts[:c.num_nodes]  # DeepSpeed's --num_nodes takes the first ones too
        wanted = max(cfg.launch.device_ids()) + 1
        for host, slots in hosts:
            if slots < wanted:
                raise ConfigError(f"{c.hostfile} gives {host} slots={slots}, but num_gpus/gpu_ids use {wanted} GPU "
                                  f"slot(s) on every node: raise its slots, or lower num_gpus.")
    else:
        hosts = [(f"node{i}", per_node) for i in range(c.num_nodes)]
    if c.node_rank >= len(hosts):
        raise ConfigError(f"node_rank is {c.node_rank} but the run has {len(hosts)} nodes: use 0 to "
                          f"{len(hosts) - 1} (0 = the master, {hosts[0][0]}).")
    data_parallel_size(len(hosts) * per_node, cfg.memory.pipeline_stages, len(hosts))  # now the hosts are known
    if not c.no_ssh and shutil.which("pdsh") is None:
        raise ConfigError("DeepSpeed reaches the nodes of a hostfile over ssh with pdsh, which is not installed "
                          "here: install pdsh (and passwordless ssh to every node), or set cluster.no_ssh and start "
                          "`python -m engine.launch.launcher run.json --node_rank N` on every node (docs/multi-node.md).")
    return NodePlan(hosts=tuple(hosts), node_rank=c.node_rank, master_addr=c.master_addr,
                    master_port=c.master_port or DEFAULT_MASTER_PORT, no_ssh=c.no_ssh, gpus_per_node=per_node,
                    hostfile=c.hostfile)


def write_generated_hostfile(node: NodePlan, run_dir: str) -> str:
    """For num_nodes without a hostfile: DeepSpeed still wants one (names only label the nodes)."""
    path = Path(run_dir) / f".hostfile-node{node.node_rank}"  # one per node: no race on a shared run folder
    write_text(path, "".join(f"{h} slots={s}\n" for h, s in node.hosts))
    return str(path)


def runner_args(node: NodePlan, hostfile: str, gpu_ids: str) -> list[str]:
    """deepspeed.launcher.runner flags for this node (everything before `--module`)."""
    args = ["--hostfile", hostfile, "--master_port", str(node.master_port)]
    if node.master_addr:
        args += ["--master_addr", node.master_addr]
    if node.no_ssh:
        args += ["--no_ssh", "--node_rank", str(node.node_rank)]
    if gpu_ids:  # the same GPUs on every node; --include also limits the run to these hosts
        args += ["--include", "@".join(f"{host}:{gpu_ids}" for host, _ in node.hosts)]
    else:
        args += ["--num_nodes", str(len(node.hosts)), "--num_gpus", str(node.gpus_per_node)]
    return args


def check_master(node: NodePlan) -> None:
    """Before launch (one launcher per node): node 0 must own master_addr, with master_port free;
    any other node must have a route to it. Nothing waits here: node 0's ranks open the port while
    the other nodes' ranks start, and a rank that cannot join within cluster.timeout_s fails with
    the master's address and what to check (`rendezvous_failure`).
    With ssh (pdsh) the launching machine need not be node 0, so there is nothing to check here.
    """
    if not node.no_ssh:
        return
    addr, port = node.master_addr, node.master_port
    family = _resolve(addr, port, node.node_rank)
    if node.node_rank == 0:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store does
            try:
                s.bind((addr, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise ClusterError(f"master port {port} on {addr} is in use on node 0: set cluster.master_port "
                                       "to a free port (the same on every node), or stop the job that holds it.") from e
                raise ClusterError(f"this is node 0 (the master) but cluster.master_addr {addr} is not an address "
                                   f"of this machine ({e.strerror}): set master_addr to this machine's address as "
                                   "the other nodes reach it (`hostname -I` lists them), or start this launcher "
                                   "with the right --node_rank.") from e
        return
    with socket.socket(family, socket.SOCK_DGRAM) as s:  # connecting a UDP socket sends nothing: a route lookup
        try:
            s.connect((addr, port))
            own = s.getsockname()[0] == addr
        except OSError as e:
            raise ClusterError(f"node {node.node_rank} has no route to the master {addr}:{port} ({e.strerror}): "
                               f"set cluster.master_addr to node 0's address on a network this node is on "
                               "(`ip route get <address>` shows the route), and check the network between the "
                               "nodes.") from e
    if own or addr.startswith("127.") or addr in ("localhost", "::1"):
        raise ClusterError(f"node {node.node_rank} is given master_addr {addr}, an address of this machine itself: "
                           "use node 0's address as this node reaches it, or --node_rank 0 if this is the master.")


def _resolve(addr: str, port: int, node_rank: int) -> int:
    try:
        return socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as e:
        raise ClusterError(f"cluster.master_addr {addr!r} does not resolve on node {node_rank} ({e.strerror}): "
                           "use node 0's IP address, or a name that every node resolves.") from e


def other_node_commands(config_path: str, node: NodePlan) -> list[str]:
    """What to run on the other nodes of a no_ssh run that this machine (node 0) started."""
    if not node.no_ssh or node.node_rank != 0:
        return []
    return [f"node {rank}: cd <PipeTrain folder> && python -m engine.launch.launcher {config_path} --node_rank {rank}"
            for rank in range(1, len(node.hosts))]


# ---- failures at run time ------------------------------------------------------------------------
_COMM_TYPES = {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}  # torch.distributed's
_COMM_WORDS = ("gloo", "nccl", "connection closed by peer", "connection reset", "timed out", "broken pipe")


def is_comm_failure(exc: BaseException) -> bool:
    """Whether exc is torch.distributed's or gloo's / NCCL's way of saying a peer or the network is gone."""
    names = {c.__name__ for c in type(exc).__mro__}
    text = str(exc).lower()
    return bool(names & _COMM_TYPES) or (isinstance(exc, RuntimeError) and any(w in text for w in _COMM_WORDS))


def explain_comm_failure(exc: BaseException, cfg: RunConfig, rank: int, world: int, node_rank: int,
                         lost: list[dict] | None = None) -> str | None:
    """A clear message for a rank that lost its peers (a node died, the network failed); None otherwise.
    lost: the ranks on this host seen ended (engine/launch/rank_exits.py), named first when one was killed."""
    if world <= 1:
        return None
    if not is_comm_failure(exc):
        return None
    text = str(exc)
    first = text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
    killed = rank_exits.killed_peer(lost or [])
    if killed:
        return f"{killed} The other ranks stopped because it was gone (rank {rank}: {first})."
    if not cfg.launch.cluster.multi_node:
        return (f"rank {rank} lost contact with the other ranks: {first}. " + (rank_exits.stopped_peer(lost or []) or
                rank_exits.UNKNOWN_CAUSE))
    latest = Path(cfg.run_dir) / "checkpoints" / "latest"
    resume = (f"the last checkpoint, {latest.read_text().strip()}" if latest.is_file()
              else "the start (no checkpoint was written yet)")
    return (f"rank {rank} (node {node_rank}) lost contact with the other ranks: {first}. A node stopped or "
            f"crashed, or the network between the nodes failed (ranks wait at most cluster.timeout_s = "
            f"{cfg.launch.cluster.timeout_s} s for each other). Look for the first error in each node's train log; "
            f"once every node is up, launch again with resume to continue from {resume}.")


def rendezvous_failure(exc: BaseException, timeout_s: float) -> str:
    """Why a rank could not join the others at start (the per-node launcher sets the env variables)."""
    env = os.environ
    where = f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return (f"rank {env.get('RANK', '?')} (node {env.get('CROSS_RANK', '0')}) could not join all "
            f"{env.get('WORLD_SIZE', '?')} ranks at the master {where} within cluster.timeout_s = {timeout_s:g} s "
            f"({first}; the master's port now: {_probe(env.get('MASTER_ADDR', ''), env.get('MASTER_PORT', '0'))}). "
            "Check that the launcher runs on every node (each with its own --node_rank) with the same master_addr "
            "and master_port; that every node reaches that address and port (firewall: TCP from the other nodes); "
            "and the other nodes' train logs for why they did not join.")


def _probe(addr: str, port: str) -> str:
    try:
        with socket.create_connection((addr, int(port)), timeout=3):
            return "answers"
    except (OSError, ValueError) as e:
        return f"{getattr(e, 'strerror', None) or e}"
