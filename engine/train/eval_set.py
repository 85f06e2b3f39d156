"""The held-out eval loss: the same items, noise and noise levels at every evaluation, so runs compare.

Each eval item (a CacheLatents cache of its own, run.json `eval.cache_dir`) is scored at the
noise levels EVAL_QUANTILES of the run's own timestep distribution (engine/config/eval.py), with
one fixed noise per item drawn from a generator seeded by (eval.seed, item) alone. Nothing here
touches the training stream: the global RNG is forked, every module's train/eval mode is put
back, the sample stream and the optimizer are never seen. A run with eval trains exactly as the
same run without it.

The (item, quantile) pairs are shared round-robin over the data-parallel replicas; the sums are
all-reduced, so 2 ranks report what 1 process reports. With pipeline_stages > 1 each replica's
pairs run through DeepSpeed's eval_batch (no grad) and the last stage holds the losses.
"""
from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torch.distributed as tdist

from ..cache.reader import CachedDataset
from ..config.checks import ConfigError
from ..config.eval import EVAL_QUANTILES
from ..config.run import RunConfig
from ..latent_fit import accepted_channels, wanted_latents
from . import distributed as dist
from .objective import DiffusionObjective, transformer_options
from .sample_order import collate
from .timesteps import quantile_time

__all__ = ["EvalSet", "eval_noise", "quantile_time", "report"]


def eval_noise(seed: int, item: int, shape: torch.Size) -> torch.Tensor:
    """The fixed noise of eval item `item`: its own generator, apart from the training draws."""
    gen = torch.Generator(device="cpu").manual_seed((seed * 2_147_483_659 + item * 7_919 + 987_654_321) % (2**63 - 1))
    return torch.randn(shape, generator=gen)


class _Items:
    """collate() reads items through a stream; the eval set reads them by index."""

    @staticmethod
    def item_at(position: int) -> int:
        return position


class EvalSet:
    def __init__(self, cfg: RunConfig, objective: DiffusionObjective, device: torch.device, replica: int,
                 replicas: int):
        self.spec, self.objective, self.device = cfg.eval, objective, device
        self.dataset = CachedDataset(cfg.eval.cache_dir)
        shape, fmt = self.dataset.latent_shape, objective.base.latent_format
        if shape[0] not in accepted_channels(fmt, shape):
            raise ConfigError(f"the eval cache {cfg.eval.cache_dir} holds {shape[0]}-channel latents but the model "
                              f"expects {wanted_latents(fmt, shape)}: cache the eval set with the same VAE as the "
                              "training set.")
        self._sigmas: dict[tuple, list[float]] = {}  # per latent shape: the resolution shift depends on it
        self.sigmas = self.sigmas_for(torch.zeros((1, *shape)))  # reported; the first item's size
        pairs = [(item, qi) for item in range(len(self.dataset)) for qi in range(len(EVAL_QUANTILES))]
        if len(pairs) < replicas:
            raise ConfigError(f"the eval set has {len(self.dataset)} item(s) x {len(EVAL_QUANTILES)} noise levels, "
                              f"fewer than the {replicas} data-parallel replicas: add eval items or use fewer GPUs.")
        self.mine: dict[int, list[int]] = {}
        for item, qi in pairs[replica::replicas]:
            self.mine.setdefault(item, []).append(qi)

    @classmethod
    def create(cls, cfg: RunConfig, objective: DiffusionObjective, device: torch.device, engine,
               pipelined: bool) -> EvalSet | None:
        if not cfg.eval.enabled:
            return None
        if pipelined:
            replica, replicas = engine.grid.get_data_parallel_rank(), engine.grid.get_data_parallel_world_size()
        else:
            replica, replicas = dist.rank(), dist.world_size()
        return cls(cfg, objective, device, replica, replicas)

    def sigmas_for(self, latents: torch.Tensor) -> list[float]:
        """The EVAL_QUANTILES of the noise levels the run trains latents of this shape at."""
        key = tuple(latents.shape[1:])
        if key not in self._sigmas:
            self._sigmas[key] = [self.objective.quantile_sigma(latents, q) for q in EVAL_QUANTILES]
        return self._sigmas[key]

    def _batches(self):
        """(quantile index, Prepared) for this replica's pairs, each item read once."""
        for item, qis in self.mine.items():
            latents, conds, _ = collate(self.dataset, _Items, [item], self.device)
            noise = eval_noise(self.spec.seed, item, self.objective.noise_shape(latents)).unsqueeze(0)
            for qi in qis:
                yield qi, self.objective.prepare_at(latents, conds, noise, [self.sigmas_for(latents)[qi]])

    def _plain_losses(self) -> list[tuple[int, float]]:
        base = self.objective.base
        out = []
        for qi, b in self._batches():
            denoised = base.apply_model(b.xt, b.sigma, transformer_options=transformer_options(b.sigma), **b.kwargs)
            out.append((qi, float(self.objective.loss(denoised, b))))
        return out

    def _pipeline_losses(self, engine, adapter) -> list[tuple[int, float]]:
        def micro_batches():
            for _, b in self._batches():
                yield (tuple(x.contiguous() for x in adapter.first_stage_inputs(b)),
                       tuple(x.contiguous() for x in DiffusionObjective.labels(b)))

        order = [qi for qis in self.mine.values() for qi in qis]  # the order _batches yields them in
        engine.reset_activation_shape()  # eval items may differ in shape from the training batches
        losses = engine.eval_batch(micro_batches(), reduce_output=None, bcast_loss=False,
                                   num_micro_batches=len(order))
        engine.reset_activation_shape()
        if not engine.is_last_stage():  # the losses live on the last stage; the others add nothing
            return []
        return [(qi, float(loss)) for qi, loss in zip(order, losses)]

    def run(self, engine=None, adapter=None) -> dict[str, Any]:
        """Every rank calls this at the same step; returns the summed-over-ranks result on every rank."""
        started = time.time()
        model = self.objective.base
        modes = {m: m.training for m in model.modules()}
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            try:
                if adapter is None:
                    model.eval()  # LoRA dropout off
                    losses = self._plain_losses()
                else:
                    losses = self._pipeline_losses(engine, adapter)
            finally:
                for m, training in modes.items():
                    m.training = training
        q = len(EVAL_QUANTILES)
        sums = torch.zeros(2 * q, dtype=torch.float64)
        for qi, loss in losses:
            sums[qi] += loss
            sums[q + qi] += 1
        if tdist.is_initialized():
            on_device = sums.to(self.device)
            tdist.all_reduce(on_device)
            sums = on_device.cpu()
        per_q = (sums[:q] / sums[q:].clamp_min(1)).tolist()
        return {"loss": sum(per_q) / q, "losses": per_q, "quantiles": list(EVAL_QUANTILES), "sigmas": self.sigmas,
                "items": len(self.dataset), "seconds": round(time.time() - started, 3)}


def report(result: dict[str, Any], step: int, events, tb) -> None:
    """Rank 0: the eval event, TensorBoard scalars and a train.log line."""
    events.emit("eval", step=step, **result)
    if tb is not None:
        tb.add_scalar("eval/loss", result["loss"], step)
        for q, loss in zip(result["quantiles"], result["losses"]):
            tb.add_scalar(f"eval/loss_q{q:g}", loss, step)
    parts = ", ".join(f"q{q:g} (sigma {s:.3g}) {loss:.5f}"
                      for q, s, loss in zip(result["quantiles"], result["sigmas"], result["losses"]))
    print(f"eval at step {step}: loss {result['loss']:.5f} over {result['items']} item(s); {parts}",
          file=sys.stderr, flush=True)
