"""Several machines through DeepSpeed's launcher, simulated with two network namespaces.

Host A (node 0, 10.77.0.1) and host B (node 1, 10.77.0.2) each run `python -m engine.launch.launcher
run.json --node_rank N` (DeepSpeed's no-ssh per-node mode, as under SLURM), gloo over the veth
link. pipeline_stages = 2 over 2 nodes x 2 processes: stage 0 on A, stage 1 on B, 2-way data
parallel within each host. It must train exactly like one host with 4 processes; losing a host
mid-run must end the survivor within the collective timeout with a clear error; resume must work.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import tiny_wan
from engine_runs import final_lora, run_to_end
from simulated_hosts import SimulatedHosts
from PipeTrain.engine.config.launch import ClusterSpec, LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec
from PipeTrain.engine.events import EventTail
from PipeTrain.engine.launch.launcher import PACK_ROOT

TIMEOUT_S = 30  # cluster.timeout_s of these runs: how long a rank waits for a lost peer
EXIT_SLACK_S = 30  # on top of it: the exception, process exit, the launchers' 1 s polls, a busy machine
STEPS = 8  # ~0.3 s each here: a host is cut after step 2, well before the end


@pytest.fixture(scope="module")
def wan_files(comfy_root, tmp_path_factory):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)
    root = tmp_path_factory.mktemp("tiny-wan")
    return str(tiny_wan.write_model(root / "tiny_wan.safetensors")), tiny_wan.write_cache(root / "data")


@pytest.fixture
def hosts():
    net = SimulatedHosts(f"pt{os.getpid()}")
    try:
        net.create()
        yield net
    finally:  # even when create() or the test failed half-way
        net.destroy()


def _config(run_dir: Path, comfy_root: str, wan_files, cluster: ClusterSpec, num_gpus: int,
            steps: int = STEPS, resume: bool = False) -> RunConfig:
    cfg = RunConfig(run_name=run_dir.name, run_dir=str(run_dir), comfyui_root=comfy_root, model_path=wan_files[0],
                    cache_dir=wan_files[1], lora=LoraSpec(rank=4, targets="attention_mlp"),
                    memory=MemorySpec(pipeline_stages=2),
                    train=TrainSpec(steps=steps, learning_rate=1e-3, batch_size=1, grad_accum=2, seed=1,
                                    scheduler="cosine", warmup_steps=1, checkpoint_every=1),
                    launch=LaunchSpec(num_gpus=num_gpus, cluster=cluster), resume=resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.save(run_dir / "run.json")
    return RunConfig.load(run_dir / "run.json")


def _two_host_config(tmp_path: Path, comfy_root: str, wan_files, port: int, resume: bool = False) -> RunConfig:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two simulated hosts, two processes each\nhostA slots=2\nhostB slots=2\n")
    cluster = ClusterSpec(hostfile=str(hostfile), master_addr=SimulatedHosts.ADDRESSES[0], master_port=port,
                          no_ssh=True, timeout_s=TIMEOUT_S)
    return _config(tmp_path / "run", comfy_root, wan_files, cluster, num_gpus=2, resume=resume)


@pytest.fixture(scope="module")
def one_host(tmp_path_factory, comfy_root, wan_files):
    """The reference: the same training on one host with 4 processes (same world size)."""
    cfg = _config(tmp_path_factory.mktemp("one-host") / "run", comfy_root, wan_files, ClusterSpec(), num_gpus=4)
    return run_to_end(cfg, timeout=400)


# ---- fast: settings, the flags DeepSpeed gets, the start-up comparison ---------------------------

def _unvalidated(num_gpus: int = 2, stages: int = 2, **cluster) -> RunConfig:
    """A RunConfig for plan(), which checks only the launch settings (no files needed)."""
    return RunConfig(run_name="r", run_dir="/nonexistent", comfyui_root="", model_path="", cache_dir="",
                     memory=MemorySpec(pipeline_stages=stages),
                     launch=LaunchSpec(num_gpus=num_gpus, cluster=ClusterSpec(**cluster)))


def test_cluster_settings_are_refused_with_the_setting_and_the_fix(tmp_path):
    from PipeTrain.engine.launch import cluster
    from PipeTrain.engine.config.checks import ConfigError

    def refused(match: str, **kw) -> None:
        num_gpus, stages = kw.pop("num_gpus", 2), kw.pop("stages", 2)
        with pytest.raises(ConfigError, match=match):
            cluster.plan(_unvalidated(num_gpus, stages, **kw))

    refused(r"num_nodes is 2 without a hostfile.*set no_ssh", num_nodes=2)
    refused(r"node_rank is 2 but num_nodes is 2: node ranks go from 0 to 1", num_nodes=2, no_ssh=True, node_rank=2)
    refused(r"node_rank is 1 but the run has one node", node_rank=1)
    refused(r"master_addr 'node 0' is not a host name", master_addr="node 0", num_nodes=2, no_ssh=True)
    refused(r"master_addr is empty: with no_ssh.*--master_addr", num_nodes=2, no_ssh=True)
    refused(r"cannot be read on this machine", hostfile=str(tmp_path / "missing"))
    bad = tmp_path / "bad"
    bad.write_text("# comment\nhostA slots=2\nhostB 2\n")
    refused(rf"{bad} line 3 'hostB 2' is not `host slots=N`", hostfile=str(bad), no_ssh=True, master_addr="10.0.0.1")
    small = tmp_path / "small"
    small.write_text("hostA slots=2\nhostB slots=1\n")
    refused(r"gives hostB slots=1, but num_gpus/gpu_ids use 2", hostfile=str(small), no_ssh=True, master_addr="h")
    refused(r"6 GPUs \(3 nodes x 2\) cannot be split into 4 pipeline stages", num_nodes=3, no_ssh=True,
            master_addr="h", stages=4)
    with pytest.raises(ConfigError, match="several nodes need DeepSpeed"):
        LaunchSpec(backend="plain", cluster=ClusterSpec(num_nodes=2, no_ssh=True)).validate()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("hostA slots=2\nhostB slots=2\n")
    if shutil.which("pdsh") is None:  # DeepSpeed's ssh mode would fail later with "launcher 'pdsh' not installed"
        refused(r"pdsh, which is not installed.*or set cluster.no_ssh", hostfile=str(hostfile))


def test_deepspeed_runner_reads_the_generated_flags_as_one_launcher_per_node(tmp_path):
    """DeepSpeed's own parser and resource logic, fed with what the launcher passes on node 1."""
    from deepspeed.launcher import runner

    from PipeTrain.engine.launch import cluster
    from PipeTrain.engine.launch.launcher import launcher_command

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("hostA slots=4\nhostB slots=4\nhostC slots=4\n")
    cfg = _unvalidated(num_gpus=2, stages=2, hostfile=str(hostfile), num_nodes=2, no_ssh=True,
                       master_addr="10.0.0.1", master_port=29600)
    node = cluster.plan(cfg, node_rank=1)
    cmd = launcher_command(cfg, "run.json", 0, node, node.hostfile)
    args = runner.parse_args(cmd[cmd.index("deepspeed.launcher.runner") + 1:])
    assert (args.no_ssh, args.node_rank, args.master_addr, args.master_port) == (True, 1, "10.0.0.1", 29600)
    assert (args.num_nodes, args.num_gpus, args.module, args.user_script) == (2, 2, True, "engine")
    assert list(runner.fetch_hostfile(args.hostfile)) == ["hostA", "hostB", "hostC"]
    # gpu_ids: the same GPUs on every node of the run, through DeepSpeed's --include.
    cfg = dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, gpu_ids="1,3"))
    node = cluster.plan(cfg, node_rank=1)
    args = runner.parse_args(launcher_command(cfg, "run.json", 0, node, node.hostfile)[4:])
    active = runner.parse_inclusion_exclusion(runner.fetch_hostfile(args.hostfile), args.include, args.exclude)
    assert dict(active) == {"hostA": [1, 3], "hostB": [1, 3]}
    # One machine: our per-node launcher (engine/launch/local_ranks.py), read by its own parser, with the
    # GPUs gpu_ids names (as this process numbers them: through its CUDA_VISIBLE_DEVICES where set).
    from PipeTrain.engine.launch import local_ranks

    one = _unvalidated(num_gpus=2, stages=2)
    one = dataclasses.replace(one, launch=dataclasses.replace(one.launch, gpu_ids="1,3"))
    for visible, devices in ((None, "1,3"), ("4,5,6,7", "5,7")):
        with pytest.MonkeyPatch.context() as env:
            env.delenv("CUDA_VISIBLE_DEVICES", raising=False)
            if visible:
                env.setenv("CUDA_VISIBLE_DEVICES", visible)
            cmd = launcher_command(one, "run.json", 29500, None)
        args = local_ranks._parse(cmd[cmd.index("engine.launch.local_ranks") + 1:])
        assert (args.master_addr, args.master_port, args.devices) == ("127.0.0.1", 29500, devices)
        assert args.module_args == ["engine", "--config", "run.json"]
    # num_nodes without a hostfile: a generated one, one line per node.
    cfg = _unvalidated(num_gpus=2, stages=2, num_nodes=2, no_ssh=True, master_addr="10.0.0.1")
    node = cluster.plan(cfg, node_rank=0)
    path = cluster.write_generated_hostfile(node, str(tmp_path))
    assert dict(runner.fetch_hostfile(path)) == {"node0": 2, "node1": 2}
    # What node 0 (the TrainPipeline node's machine) tells the user to start on the others.
    (line,) = cluster.other_node_commands("/runs/r/run.json", node)
    assert line.endswith("python -m engine.launch.launcher /runs/r/run.json --node_rank 1") and line.startswith("node 1:")


def test_nodes_that_differ_are_named_with_both_values():
    from PipeTrain.engine.train.node_checks import disagreement

    def facts(rank, node, host, **change):
        f = {"rank": rank, "node": node, "host": host, "checkpoint": "",
             "versions": {"PipeTrain": "0.1.0", "ComfyUI": "0.3.75", "torch": "2.14.1", "DeepSpeed": "0.18.4"},
             "config": {"train.steps": 8, "lora.rank": 4}, "files": {"model file": "m.safetensors (10 bytes)"}}
        for key, value in change.items():  # "section__name" changes one entry of a section
            section, _, name = key.partition("__")
            f[section] = {**f[section], name: value} if name else value
        return f

    a0, a1 = facts(0, 0, "gpu-a"), facts(1, 0, "gpu-a")
    assert disagreement([a0, a1, facts(2, 1, "gpu-b")], "/runs/x") == ""
    msg = disagreement([a0, a1, facts(2, 1, "gpu-b", versions__PipeTrain="0.2.0")], "/runs/x")
    assert msg.startswith("node 1 (host gpu-b, rank 2) runs PipeTrain 0.2.0 but node 0 (host gpu-a) runs "
                          "PipeTrain 0.1.0: install the same"), msg
    msg = disagreement([a0, facts(1, 1, "gpu-b", **{"config__train.steps": 9})], "/runs/x")
    assert "node 1 (host gpu-b, rank 1) reads a run.json with train.steps = 9 but node 0 (host gpu-a) has 8" in msg
    msg = disagreement([a0, facts(1, 1, "gpu-b", **{"files__model file": "m.safetensors (11 bytes)"})], "/runs/x")
    assert "reads a different model file (m.safetensors (11 bytes))" in msg, msg
    msg = disagreement([facts(0, 0, "gpu-a", checkpoint="step000004"), facts(1, 1, "gpu-b", checkpoint="none")],
                       "/runs/x")
    assert "sees checkpoint 'none' in /runs/x/checkpoints but node 0 (host gpu-a) resumes from 'step000004'" in msg


def test_cluster_node_builds_the_spec_and_train_pipeline_takes_it(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy
    from PipeTrain.engine.config.checks import ConfigError

    import_comfy(comfy_root)
    from PipeTrain.nodes import NODE_CLASS_MAPPINGS
    from PipeTrain.nodes.cluster import PipeTrainCluster
    from PipeTrain.nodes.train_pipeline import PipeTrainTrainPipeline

    assert NODE_CLASS_MAPPINGS["PipeTrainCluster"] is PipeTrainCluster
    inputs = PipeTrainCluster.INPUT_TYPES()["required"]
    assert all(opts.get("tooltip") for _, opts in inputs.values())
    (spec,) = PipeTrainCluster().configure(hostfile="", num_nodes=2, master_addr=" 10.0.0.1 ", master_port=29500,
                                           no_ssh=True, timeout_s=600)
    assert spec == ClusterSpec(num_nodes=2, master_addr="10.0.0.1", master_port=29500, no_ssh=True, timeout_s=600)
    with pytest.raises(ConfigError, match="without a hostfile"):
        PipeTrainCluster().configure(hostfile="", num_nodes=2, master_addr="", master_port=29500, no_ssh=False,
                                     timeout_s=600)
    kind, opts = PipeTrainTrainPipeline.INPUT_TYPES()["optional"]["cluster"]
    assert kind == "PIPETRAIN_CLUSTER" and opts["tooltip"]


def test_run_json_without_a_cluster_section_still_loads(tmp_path, comfy_root, wan_files):
    cfg = _config(tmp_path / "run", comfy_root, wan_files, ClusterSpec(), num_gpus=2)
    data = cfg.to_dict()
    del data["launch"]["cluster"]  # a run.json written before multi-node support
    assert RunConfig.from_dict(data).launch.cluster == ClusterSpec()


# ---- slow: two simulated hosts ----------------------------------------------------------------------

class NodeLaunches:
    """`python -m engine.launch.launcher run.json --node_rank N` on each simulated host."""

    def __init__(self, hosts: SimulatedHosts, config_paths: list[str]):
        self.hosts = hosts
        self.run_dir = Path(RunConfig.load(config_paths[0]).run_dir)
        self.tail = EventTail(self.run_dir, start_at_end=True)
        self.events: list[dict] = []
        self.outputs = [self.run_dir.parent / f"launcher-node{n}.{time.time_ns()}.out" for n in (0, 1)]
        self.procs = [hosts.popen(n, [sys.executable, "-m", "engine.launch.launcher", path, "--node_rank", str(n)],
                                  cwd=str(PACK_ROOT), stdout=open(out, "wb"), stderr=subprocess.STDOUT)
                      for n, (path, out) in enumerate(zip(config_paths, self.outputs))]

    def poll(self) -> list[dict]:
        new = self.tail.read_new()
        self.events += new
        return new

    def wait_for(self, kind: str, min_step: int = 0, timeout: float = 300) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for ev in self.poll():
                if ev["event"] == kind and ev.get("step", 0) >= min_step:
                    return ev
            if any(p.poll() is not None for p in self.procs):
                self.poll()
                raise AssertionError(f"a node exited before '{kind}':\n{self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"no '{kind}' event within {timeout} s:\n{self.log()}")

    def wait(self, timeout: float = 400) -> list[int]:
        deadline = time.time() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"the node launchers did not finish in {timeout} s:\n{self.log()}")
        self.poll()
        return [p.returncode for p in self.procs]

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def losses(self) -> list[float]:
        return [e["loss"] for e in self.of("step")]

    def log(self) -> str:
        parts = []
        for n, out in enumerate(self.outputs):
            parts.append(f"--- node {n} launcher ---\n" + out.read_text(errors="replace")[-3000:])
            log = self.run_dir / ("train.log" if n == 0 else f"train-node{n}.log")
            if log.exists():
                parts.append(f"--- node {n} {log.name} ---\n" + log.read_text(errors="replace")[-4000:])
        return "\n".join(parts)


@pytest.mark.slow
def test_two_hosts_train_like_one_host_with_stages_across_hosts(tmp_path, comfy_root, wan_files, hosts, one_host):
    cfg = _two_host_config(tmp_path, comfy_root, wan_files, port=29511)
    run = NodeLaunches(hosts, [str(Path(cfg.run_dir) / "run.json")] * 2)
    assert run.wait() == [0, 0], run.log()
    assert run.of("done"), run.log()
    # DeepSpeed numbers ranks node by node, and its pipeline topology puts data parallelism innermost:
    # stage 0 = ranks 0, 1 on host A, stage 1 = ranks 2, 3 on host B; the activations cross the link.
    (started,) = run.of("started")
    layout = sorted((r["rank"], r["node"], r["stage"], r["replica"]) for r in started["ranks"])
    assert layout == [(0, 0, 0, 0), (1, 0, 0, 1), (2, 1, 1, 0), (3, 1, 1, 1)]
    assert started["world_size"] == 4
    assert run.losses() == one_host.losses(), "two hosts must train exactly like one host with 4 processes"
    a, b = final_lora(one_host.cfg.run_dir), final_lora(cfg.run_dir)
    assert a.keys() == b.keys(), "the LoRA gathered over the two hosts misses some stage's weights"
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_lost_host_ends_the_survivor_within_the_timeout_and_resume_continues(tmp_path, comfy_root, wan_files, hosts,
                                                                             one_host):
    cfg = _two_host_config(tmp_path, comfy_root, wan_files, port=29521)
    config = str(Path(cfg.run_dir) / "run.json")
    run = NodeLaunches(hosts, [config] * 2)
    run.wait_for("checkpoint", min_step=2)
    # Host B goes away as a crashed machine does: its cable is unplugged first, so host A gets
    # no FIN or RST and only the collective timeout can end its wait. Then B's processes die.
    hosts.set_link(1, up=False)
    cut = time.monotonic()
    hosts.kill(1)
    survivor = run.procs[0]
    try:
        survivor.wait(timeout=TIMEOUT_S + EXIT_SLACK_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"host A still runs {TIMEOUT_S + EXIT_SLACK_S} s after losing host B:\n{run.log()}")
    waited = time.monotonic() - cut
    run.poll()
    assert survivor.returncode != 0, run.log()
    assert not run.of("done"), "the run finished before host B was cut: cut it earlier"
    errors = [e["message"] for e in run.of("error")]
    assert errors, f"no error event from host A:\n{run.log()}"
    assert "lost contact with the other ranks" in errors[0] and f"timeout_s = {TIMEOUT_S} s" in errors[0], errors
    latest = (Path(cfg.run_dir) / "checkpoints" / "latest").read_text().strip()
    assert f"resume to continue from the last checkpoint, {latest}" in errors[0], errors
    print(f"host A exited {waited:.1f} s after host B was cut (timeout_s = {TIMEOUT_S})")

    # Host B is back: both hosts resume from the last complete checkpoint and finish the run.
    hosts.set_link(1, up=True)
    resumed_cfg = _two_host_config(tmp_path, comfy_root, wan_files, port=29522, resume=True)
    resumed = NodeLaunches(hosts, [config] * 2)
    assert resumed.wait() == [0, 0], resumed.log()
    first = int(latest.removeprefix("step")) + 1
    assert first >= 3
    assert [e["step"] for e in resumed.of("step")] == list(range(first, STEPS + 1))
    assert resumed.losses() == one_host.losses()[first - 1:]
    a, b = final_lora(one_host.cfg.run_dir), final_lora(resumed_cfg.run_dir)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _comfyui_copy_with_version(comfy_root: str, folder: Path, version: str) -> str:
    """Another "install" of ComfyUI: links to the real one, except comfyui_version.py."""
    folder.mkdir()
    for entry in os.listdir(comfy_root):
        if entry != "comfyui_version.py":
            os.symlink(os.path.join(comfy_root, entry), folder / entry)
    (folder / "comfyui_version.py").write_text(f'__version__ = "{version}"\n')
    return str(folder)


@pytest.mark.slow
def test_another_comfyui_version_on_one_host_stops_both_with_a_clear_error(tmp_path, comfy_root, wan_files, hosts):
    # num_nodes instead of a hostfile; one process per host, data parallel only.
    cluster = ClusterSpec(num_nodes=2, no_ssh=True, master_addr=SimulatedHosts.ADDRESSES[0], master_port=29531,
                          timeout_s=TIMEOUT_S)
    cfg = _config(tmp_path / "run", comfy_root, wan_files, cluster, num_gpus=1)
    cfg = dataclasses.replace(cfg, memory=MemorySpec(pipeline_stages=1))
    cfg.save(Path(cfg.run_dir) / "run.json")
    other = dataclasses.replace(cfg, comfyui_root=_comfyui_copy_with_version(comfy_root, tmp_path / "comfy-b",
                                                                             "0.3.99"))
    (tmp_path / "node-b").mkdir()
    other.save(tmp_path / "node-b" / "run.json")  # host B's own copy of run.json: its own ComfyUI path
    run = NodeLaunches(hosts, [str(Path(cfg.run_dir) / "run.json"), str(tmp_path / "node-b" / "run.json")])
    codes = run.wait(timeout=300)
    assert all(code != 0 for code in codes), run.log()
    messages = [e["message"] for e in run.of("error")]
    assert messages, run.log()
    assert "node 1 (host" in messages[0] and "runs ComfyUI 0.3.99 but node 0 (host" in messages[0], messages
    assert "runs ComfyUI 0.3.75" in messages[0] and "same ComfyUI, PipeTrain" in messages[0], messages
    assert not run.of("started"), "training must not start on nodes with different versions"


@pytest.mark.slow
def test_unreachable_or_wrong_master_is_a_clear_error(tmp_path, comfy_root, wan_files, hosts):
    def launch(host: int, node_rank: int, master: str, port: int) -> tuple[int, str]:
        cluster = ClusterSpec(num_nodes=2, no_ssh=True, master_addr=master, master_port=port, timeout_s=5)
        cfg = _config(tmp_path / f"run{port}", comfy_root, wan_files, cluster, num_gpus=1)
        cfg = dataclasses.replace(cfg, memory=MemorySpec(pipeline_stages=1))
        cfg.save(Path(cfg.run_dir) / "run.json")
        out = tmp_path / f"out{port}"
        proc = hosts.popen(host, [sys.executable, "-m", "engine.launch.launcher", str(Path(cfg.run_dir) / "run.json"),
                                  "--node_rank", str(node_rank)], cwd=str(PACK_ROOT), stdout=open(out, "wb"),
                           stderr=subprocess.STDOUT)
        return proc.wait(timeout=180), out.read_text(errors="replace")

    # Before launch: node 0 must own the master address; another node needs a route to it.
    code, out = launch(0, 0, SimulatedHosts.ADDRESSES[1], 29541)
    assert code == 2 and "this is node 0 (the master) but cluster.master_addr 10.77.0.2 is not an address" in out, out
    code, out = launch(1, 1, "10.78.0.1", 29542)
    assert code == 2 and "node 1 has no route to the master 10.78.0.1:29542" in out, out
    # Host A is up but nothing listens (node 0 was never started): node 1's rank gives up after timeout_s.
    started = time.monotonic()
    code, out = launch(1, 1, SimulatedHosts.ADDRESSES[0], 29543)
    assert code != 0, out
    assert "could not join all 2 ranks at the master 10.77.0.1:29543 within cluster.timeout_s = 5 s" in out, out
    assert "Connection refused" in out and "launcher runs on every node" in out, out
    assert time.monotonic() - started < 120
