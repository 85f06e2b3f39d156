"""PipeTrainCluster: train on several machines (DeepSpeed's multi-node launch). Optional input of
TrainPipeline; without it a run uses this machine only. This ComfyUI machine is node 0."""
from __future__ import annotations

from ..engine.config.launch import ClusterSpec
from ..engine.config.run import RunConfig
from ..engine.launch.cluster import other_node_commands, plan
from . import compat
from .types import CLUSTER


class PipeTrainCluster:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("Spread training over several machines with DeepSpeed's launcher: a hostfile reached over ssh "
                   "(pdsh), or one launcher per machine (no_ssh, SLURM-style). This ComfyUI machine is node 0; "
                   "num_gpus of Train Pipeline counts GPUs per machine. See docs/multi-node.md.")
    RETURN_TYPES = (CLUSTER,)
    RETURN_NAMES = ("cluster",)
    FUNCTION = "configure"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "hostfile": ("STRING", {"default": "", "tooltip":
                             "Path of a DeepSpeed hostfile: one `host slots=N` line per machine, this one first. "
                             "Empty = give num_nodes instead (needs no_ssh)."}),
                "num_nodes": ("INT", {"default": 0, "min": 0, "max": 4096, "tooltip":
                              "Number of machines. 0 = every host of the hostfile; without a hostfile, the number "
                              "of machines that each start a launcher (no_ssh)."}),
                "master_addr": ("STRING", {"default": "", "tooltip":
                                "This machine's address as the other machines reach it (e.g. 10.0.0.1). Needed "
                                "with no_ssh; with ssh, empty lets DeepSpeed ask the first host."}),
                "master_port": ("INT", {"default": 29500, "min": 1, "max": 65535, "tooltip":
                                "TCP port on this machine where the ranks meet; the same on every machine and open "
                                "in the firewall."}),
                "no_ssh": ("BOOLEAN", {"default": True, "tooltip":
                           "On: start `python -m engine.launch.launcher <run>/run.json --node_rank N` on every other "
                           "machine yourself (the console prints it). Off: DeepSpeed starts them over ssh (pdsh and "
                           "passwordless ssh needed)."}),
                "timeout_s": ("INT", {"default": 1800, "min": 10, "max": 604800, "tooltip":
                              "Seconds a rank waits for the others (to join, or in any exchange) before the run "
                              "fails: bounds how long a lost machine can stall the others."}),
            }
        }

    def configure(self, hostfile, num_nodes, master_addr, master_port, no_ssh, timeout_s):
        spec = ClusterSpec(hostfile=hostfile.strip(), num_nodes=int(num_nodes), node_rank=0,
                           master_addr=master_addr.strip(), master_port=int(master_port), no_ssh=bool(no_ssh),
                           timeout_s=int(timeout_s))
        spec.validate()
        return (spec,)


def cluster_input() -> tuple:
    """TrainPipeline's optional `cluster` input."""
    return (CLUSTER, {"tooltip": "Several machines: connect a PipeTrain Cluster node. Unconnected = this machine "
                                 "only. num_gpus then counts GPUs per machine."})


def launch_cluster(cluster: ClusterSpec | None) -> ClusterSpec:
    return cluster if cluster is not None else ClusterSpec()


def announce_other_nodes(cfg: RunConfig, config_path: str) -> None:
    """Validate the multi-node launch now (before anything starts); with no_ssh, say what to run elsewhere."""
    node = plan(cfg)
    if node is None:
        return
    for line in other_node_commands(config_path, node):
        compat.log.info("[PipeTrain] %s: start the other machines: %s", cfg.run_name, line)
