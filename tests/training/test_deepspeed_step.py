"""DeepSpeed's engine as the train loop sets it up steps like torch does by hand: its gradients averaged over
the replicas and divided by the accumulation steps, clipped by the norm over all of them (engine/train/
grad_norm.py, DeepSpeed's own clipping off) and the norm reported before clipping; with one replica it never
runs its gradient all-reduce (engine/patches/deepspeed.py, skip_lone_replica_allreduce). Real gloo ranks
(tests/deepspeed_step_rank.py)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

import deepspeed_step_rank as rank_script

pytestmark = pytest.mark.slow
MAX_NORM = 0.05  # below every step's norm (checked): each step is clipped


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(world: int, max_norm: float) -> list[subprocess.Popen]:
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, rank_script.__file__, str(max_norm)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def results(procs: list[subprocess.Popen]) -> list[dict]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def by_hand(world: int, max_norm: float) -> tuple[list[float], list[torch.Tensor]]:
    """The same steps in one process: every replica's micro-batches, averaged, clipped, AdamW."""
    net = rank_script.model()
    params = list(net.parameters())
    optimizer = torch.optim.AdamW(params, lr=rank_script.LR)
    norms = []
    for step in range(rank_script.STEPS):
        for rank in range(world):
            for micro in range(rank_script.GRAD_ACCUM):
                loss = rank_script.loss_of(net, *rank_script.batch(step, micro, rank))
                (loss / (rank_script.GRAD_ACCUM * world)).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))))
        optimizer.step()
        optimizer.zero_grad()
    return norms, [p.detach().flatten() for p in params]


def test_deepspeed_steps_clip_and_average_like_torch_and_one_replica_skips_the_allreduce():
    runs = {world: start_ranks(world, MAX_NORM) for world in (1, 2)}  # at once: the imports take most of it
    for world, procs in runs.items():
        norms, weights = by_hand(world, MAX_NORM)
        assert min(norms) > MAX_NORM  # every step was clipped, so a step left unclipped would show below
        for got in results(procs):
            assert got["norms"] == pytest.approx(norms, rel=1e-5), (world, got["rank"])
            for mine, theirs in zip(got["weights"], weights):
                torch.testing.assert_close(torch.tensor(mine), theirs, rtol=1e-5, atol=1e-6)
            # one all-reduce per optimizer step between replicas; none within one replica
            assert got["allreduces"] == (rank_script.STEPS if world > 1 else 0), (world, got)


def test_the_unclipped_steps_differ():
    """The clipped comparison above could not pass with clipping left out: the same run unclipped ends elsewhere."""
    clipped, unclipped = by_hand(1, MAX_NORM)[1], by_hand(1, 0.0)[1]
    assert max((a - b).abs().max().item() for a, b in zip(clipped, unclipped)) > 1e-3
