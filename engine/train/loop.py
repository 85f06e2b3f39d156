"""The training loop. Read top to bottom: setup, resume, loop, save.

Every rank runs this file (the per-node launcher starts one process per GPU, or per CPU
"device" where there is no CUDA; without DeepSpeed it is one plain process). Rank 0 alone writes
events, TensorBoard and LoRA files; every rank takes part in checkpoints (DeepSpeed's rule).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from ..config import revisions
from ..config.run import RunConfig
from ..events import EventLog
from . import checkpoints, elastic, node_checks, wandb_log
from . import distributed as dist
from .setup_phases import SetupPhases
from .stop_flag import StopFlag, finish_message


def main(config_path: str, process_start: float | None = None) -> int:
    phases = SetupPhases(process_start)
    phases.done("python_imports")  # torch and this package
    cfg = RunConfig.load(config_path)
    cfg.check_files()  # this node's copies of the model, ComfyUI, the caches and the LoRA to start from
    from ..launch.comfy_bootstrap import import_comfy

    import_comfy(cfg.comfyui_root)
    phases.done("comfyui_import")
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.launch.backend == "deepspeed":
        dist.init(device_type, cfg.launch.cluster.timeout_s)
    if device_type == "cuda":
        torch.cuda.set_device(dist.local_rank())
        device = torch.device("cuda", dist.local_rank())
    else:
        device = torch.device("cpu")
    phases.done("distributed_init")
    events = EventLog(cfg.run_dir, enabled=dist.rank() == 0)
    # what the rank does while it loads, and since when (the node's status line)
    phases.announce = lambda name: events.emit("setup", phase=name, since=round(phases.start, 3))
    phases.announce("distributed_init")  # the phase that ended just before the event log existed
    peers: list = []  # every rank's facts (pid, host): a rank that dies is named by the others
    try:
        peers = node_checks.check_agreement(cfg)  # every node: same versions, run.json, files and checkpoint
        with wandb_log.session(cfg, dist.rank()) as wb:  # W&B (monitor.wandb_project), finished however it ends
            code = train(cfg, device, events, phases, wb)
        dist.leave()  # together: a rank that exits while a peer still reads from it can abort that peer
        return code
    except BaseException as e:  # report every failure before the launcher sees the exit code
        EventLog(cfg.run_dir).emit("error", rank=dist.rank(), pid=os.getpid(),
                                   message=node_checks.failure_message(e, cfg, peers),
                                   traceback=traceback.format_exc(limit=20))
        raise


def train(cfg: RunConfig, device: torch.device, events: EventLog, phases: SetupPhases | None = None,
          wb: wandb_log.WandbLog | None = None) -> int:
    from ..cache.caption_store import uncond_missing
    from ..cache.joined import open_caches
    from ..config.rules import data_parallel_size
    from ..data.batch_sizes import check_varied_batches
    from ..lora_files import ema_file
    from ..memory.options import apply_memory_options
    from ..models.loading import ModelLoadError
    from .ema import start_ema
    from .eval_watch import EvalWatch
    from .fit_setup import whole_model_load
    from .grad_norm import last_grad_norm
    from .lora import trained_parameters
    from .model_setup import build_model
    from .objective import DiffusionObjective
    from .optim import build_scheduler
    from .optimizers import build_optimizer
    from .sample_order import SampleStream, collate
    from .saving import RunSaver

    run_dir = Path(cfg.run_dir)
    rank, world = dist.rank(), dist.world_size()
    # A resume with settings that change the result is refused here, before the model loads (the node
    # refuses it before launch too); accepted changes are logged once the start step is known.
    resuming = cfg.resume and (run_dir / "checkpoints" / "latest").exists()
    replicas = data_parallel_size(world, cfg.memory.pipeline_stages)  # data-parallel copies of the model
    # another number of replicas may resume a checkpoint when the global batch stays (engine/config/global_batch.py)
    changes = revisions.check_resume(run_dir, cfg.to_dict(), replicas=replicas) if resuming else []
    replicas_before = revisions.last_replicas(run_dir) if resuming else None
    t = cfg.train
    phases = phases or SetupPhases()
    phases.done("node_checks")  # the nodes' agreement, the resume check and this function's imports
    stop = StopFlag(run_dir)  # also watches the ComfyUI server that started the run
    launched = time.time()

    # ---- data -------------------------------------------------------------------------
    dataset = open_caches(cfg.cache_dir, cfg.more_cache_dirs)  # chained datasets: every cache, one item list
    stream = SampleStream([dataset.repeats(i) for i in range(len(dataset))], seed=t.seed, buckets=dataset.buckets(),
                          batch=t.batch_size, batches=dataset.batches())  # batches never mix aspect buckets or
    # caption lengths; LoadDataset's batch_sizes give a resolution's batches their own size
    check_varied_batches(stream.varied, cfg.memory.pipeline_stages)
    missing = uncond_missing(cfg.objective.cfg_augment, [cfg.cache_dir, *cfg.more_cache_dirs])
    if missing:
        raise ModelLoadError(missing)
    total_steps = t.steps if t.steps > 0 else stream.steps_for_epochs(t.epochs, t.batch_size, t.grad_accum, replicas)

    # ---- model + LoRA -----------------------------------------------------------------
    pipelined = cfg.memory.pipeline_stages > 1
    full = cfg.lora.kind == "full"  # a full fine-tune: the block weights themselves train (engine/train/full_tune.py)

    with whole_model_load(cfg, device):  # plan 'fit': a model too big for the GPU gets its own message
        model, targets = build_model(cfg, dataset, device, phases)
    settings = cfg.to_dict()  # what the user set (config_history), whatever the fit plan picks below
    plan_record, plan_check = None, None  # memory plan 'fit': its record (memory_plan.json), step 1 measured against it
    if cfg.memory.plan == "fit":  # a probe picks checkpointing, block swap, fp8 base and optimizer (docs/memory.md)
        from .fit_setup import fit_memory, release_memory

        fitted, plan_record = fit_memory(cfg, model, dataset, device, events, resuming)
        if fitted.base_dtype != cfg.memory.base_dtype:  # an fp8 base: ComfyUI loads the file again in fp8
            del model  # before the new one loads: one model on the device at a time
            release_memory(device)
            model, targets = build_model(dataclasses.replace(cfg, memory=fitted), dataset, device, phases)
        cfg = dataclasses.replace(cfg, memory=fitted)
        phases.done("memory_plan")
    # Checkpointing, block swap, compile; places the model on the device unless pipelined.
    memory = apply_memory_options(model, cfg.memory, None if pipelined else device)
    phases.done("memory_options")  # compiling happens in the first step, not here
    if plan_record is not None:
        from .fit_setup import FirstStepCheck

        plan_check = FirstStepCheck(model, memory, device, plan_record)
    objective = DiffusionObjective(model, seed=t.seed, timestep_sampling=t.timestep_sampling,
                                   t_range=(t.min_t, t.max_t), objective=cfg.objective)
    if pipelined:
        from . import pipeline

        lora_names = {id(p): n for n, p in trained_parameters(model.diffusion_model, cfg.lora).items()}
        engine, adapter = pipeline.build_engine(cfg, model, objective,
                                                lambda ps: build_optimizer(cfg.memory.optimizer, ps, t),
                                                lambda opt: build_scheduler(opt, t, total_steps),
                                                dataset=dataset, device=device)  # checked against apply_model
        scheduler = engine.lr_scheduler
        params = [p for p in engine.module.parameters() if p.requires_grad]
    else:
        params = list(trained_parameters(model.diffusion_model, cfg.lora).values())
        optimizer = build_optimizer(cfg.memory.optimizer, params, t)
        scheduler = build_scheduler(optimizer, t, total_steps)
        with memory.hidden():  # DeepSpeed moves the whole model to the GPU: not the swapped blocks
            engine = build_trainer(cfg, objective, optimizer, scheduler, params)

    phases.done("engine")  # DeepSpeed's engine (pipelined: the stages, checked against apply_model)

    # ---- resume -----------------------------------------------------------------------
    ckpt_root = run_dir / "checkpoints"
    signature = {"targets": len(targets), "rank": cfg.lora.rank, "model": os.path.basename(cfg.model_path),
                 **({"kind": cfg.lora.kind} if cfg.lora.kind != "lora" else {})}  # lora: as checkpoints before kinds
    start_step, resumed_from = 0, None
    if cfg.resume and (ckpt_root / "latest").exists():
        # a pipelined run's checkpoint also resumes data parallel (engine/train/elastic.py)
        from_stages = elastic.stage_reader(model, lambda ps: build_optimizer(cfg.memory.optimizer, ps, t))
        start_step = checkpoints.resume(engine, ckpt_root, cfg.launch.backend, signature, cfg.memory.pipeline_stages,
                                        from_stages)
        resumed_from = checkpoints.latest_folder(ckpt_root)
    if rank == 0:
        revisions.record(run_dir, settings, start_step, replicas)  # the settings of the steps from here on
    phases.done("resume")  # the checkpoint loaded (if any) and the config revision kept

    layout = node_checks.rank_layout(engine, pipelined)  # node, stage and replica of every rank
    events.emit("started", step=start_step, total=total_steps, world_size=world, device=str(device),
                lora_targets=len(targets), trainable_params=sum(p.numel() for p in params),
                samples=len(stream), setup_seconds=round(time.time() - launched, 2), ranks=layout,
                setup_phases=phases.seconds)
    tb = _tensorboard(run_dir) if rank == 0 else None
    wb = wb or wandb_log.WandbLog()  # rank 0's W&B run, or nothing (engine/train/wandb_log.py)
    # The EMA of this rank's LoRA weights (train.ema_decay; engine/train/ema.py), by the names the files use.
    trained = ({lora_names[id(p)]: p for p in engine.module.parameters() if id(p) in lora_names} if pipelined else
               trained_parameters(model.diffusion_model, cfg.lora))
    ema = start_ema(t, trained, resumed_from, start_step, events, device=torch.device("cpu") if full else None)
    if rank == 0 and replicas_before not in (None, replicas):
        elastic.report(events, start_step, replicas_before, replicas, world)
    if changes and rank == 0:
        listed = [{"setting": name, "before": old, "after": new} for name, old, new in changes]
        events.emit("config_changed", step=start_step, changes=listed)
        if tb is not None:
            tb.add_text("config/changes", "; ".join(f"{c['setting']}: {c['before']!r} -> {c['after']!r}"
                                                    for c in listed), start_step)
    from .samples import SampleRenderer
    # samples with the current LoRA (rank 0), packed like the training rows (their stream shapes: an item read
    # only for a run that samples)
    streams = dataset[0]["extras"].get("latent_shapes") if cfg.sample.every and rank == 0 else None
    renderer = SampleRenderer.create(cfg, model, device, events, rank, memory, streams)
    saver = RunSaver(cfg, model, engine, events, ema=ema, lora_names=lora_names if pipelined else None,
                     signature=signature, fingerprint=dataset.fingerprint, total_steps=total_steps)
    # Held-out eval loss at fixed noise, the best saved step and early stop (engine/train/eval_watch.py)
    evaluate = EvalWatch(cfg, objective, device, engine, adapter if pipelined else None, saver, start_step,
                         events, tb, wb)

    # ---- loop ---------------------------------------------------------------------------
    step = start_step
    loss = float("nan")
    if step == 0:
        evaluate(0)  # eval.before_start: the loss before any training
    while step < total_steps:
        started = time.time()
        checking = plan_check is not None and step == start_step
        if checking:
            plan_check.start()
        lr = scheduler.get_last_lr()[0]
        micro_losses = []
        if pipelined:  # DeepSpeed runs all micro-batches of the step through the stages
            micro_losses.append(float(engine.train_batch(
                pipeline.micro_batches(cfg, engine, adapter, objective, dataset, stream, step, device))))
        else:
            for micro in range(t.grad_accum):
                positions = stream.micro_positions(step, micro, rank, world, t.grad_accum)
                latents, conds, ids = collate(dataset, stream, positions, device, cfg.objective.cfg_augment > 1.0)
                # LoRA dropout draws from the global RNG: seed it from the position, like the noise.
                torch.manual_seed(t.seed * 1_000_003 + positions[0])
                micro_loss = engine(latents, conds, ids)
                engine.backward(micro_loss)
                engine.step()
                micro_losses.append(micro_loss.item())
        if checking:
            plan_check.finish(events, step + 1)
        step += 1
        if ema is not None:
            ema.update(step)
        loss = dist.mean(sum(micro_losses) / len(micro_losses), device)
        grad_norm = last_grad_norm(engine)  # before clipping, over every replica and stage (the same on each rank)
        events.emit("step", step=step, total=total_steps, loss=loss, lr=lr, grad_norm=grad_norm,
                    seconds=round(time.time() - started, 4), **_gpu_memory(device))
        if tb is not None:
            tb.add_scalar("train/loss", loss, step)
            tb.add_scalar("train/lr", lr, step)
            tb.add_scalar("train/grad_norm", grad_norm, step)
        wb.step(step, loss, lr, grad_norm)
        stopped_early = evaluate(step)  # early_stop: ends the run normally (final LoRA) after this step
        if renderer is not None:
            renderer.maybe_render(step, total_steps, stop.requested)
        if saver.file_at(step) and step < total_steps:  # the final file is saved after the loop
            saver.weights(saver.step_file(step), step)
        cancel, finish = dist.any_true_each((stop.requested(), stop.finish_requested()), device)
        # Stop & save (the finish file): this step is the last, as with early_stop; a cancel wins over it.
        finishing = finish and not cancel and step < total_steps
        if (cancel or stopped_early or finishing or (t.checkpoint_every and step % t.checkpoint_every == 0)
                or step == total_steps):
            saver.checkpoint(step)
        if stopped_early and not cancel:
            if rank == 0:
                message = evaluate.stop_message(step)
                events.emit("early_stop", step=step, total=total_steps, message=message)
                print(message, file=sys.stderr, flush=True)
            break
        if finishing:
            if dist.local_rank() == 0:  # used up: a later resume of this folder must not stop at once
                stop.finish_file.unlink(missing_ok=True)
            if rank == 0:
                message = finish_message(step, total_steps)
                events.emit("finish_requested", step=step, total=total_steps, message=message)
                print(message, file=sys.stderr, flush=True)
            break
        if cancel:
            saver.weights(saver.step_file(step), step)
            events.emit("cancelled", step=step, total=total_steps, loss=loss, reason=stop.reason)
            _close(tb)
            return 0

    final = saver.final
    saver.weights(final.name, step)
    events.emit("done", step=step, total=total_steps, loss=loss, **{"model" if full else "lora": str(final)},
                **({("model_ema" if full else "lora_ema"): str(ema_file(final))} if ema else {}),
                seconds=round(time.time() - launched, 2))
    _close(tb)
    return 0


def build_trainer(cfg: RunConfig, objective: torch.nn.Module, optimizer, scheduler, params):
    """DeepSpeed's engine (data parallel over the launched ranks), or the single-process one; either measures
    the gradient norm of `params` (the LoRA) at each optimizer step and clips by it (engine/train/grad_norm.py)."""
    t = cfg.train
    if cfg.launch.backend == "plain":
        from .plain import PlainTrainer

        return PlainTrainer(objective, optimizer, scheduler, grad_accum=t.grad_accum, grad_clip=t.grad_clip)
    import deepspeed

    from ..patches.deepspeed import own_norm_and_clip, skip_lone_replica_allreduce
    from .grad_norm import norm_and_clip

    engine, _, _, _ = deepspeed.initialize(model=objective, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=dist.deepspeed_config(t))
    own_norm_and_clip(engine, lambda: norm_and_clip(params, t.grad_clip))  # the gradients are averaged by then
    skip_lone_replica_allreduce(engine, replicas=dist.world_size())  # every rank is a replica here
    return engine


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional for headless use
        return None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def _gpu_memory(device: torch.device) -> dict[str, float]:
    """Peak GPU memory so far (GiB), for the UI and the benchmarks; nothing on the CPU."""
    if device.type != "cuda":
        return {}
    return {"peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3),
            "reserved_gib": round(torch.cuda.max_memory_reserved(device) / 2**30, 3)}


def _close(tb) -> None:
    if tb is not None:
        tb.close()
