"""PipeTrainTrainPipeline: validate, write run.json, launch the engine out of process, relay progress.

Training blocks this node (SaveLoRA and the test sampler need its result). The launch and its relay (progress,
Cancel, the result) are in nodes/relay.py; a Wan 2.2 experts pair (the `experts` input) in nodes/expert_pair.py.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..engine.cache.caption_store import uncond_missing
from ..engine.config.checks import ConfigError
from ..engine.config.choices import SCHEDULERS
from ..engine.config.eval import EvalSpec
from ..engine.config.launch import LaunchSpec
from ..engine.config.objective import ObjectiveSpec
from ..engine.config.run import RunConfig
from ..engine.config.sections import TrainSpec
from ..engine.launch import launcher, run_lock
from ..engine.sample_files import unsupported_reason
from . import compat, ui_feed
from .cluster import announce_other_nodes, cluster_input, launch_cluster
from .model_sources import model_file_names, model_source
from .preflight import (
    check_batch,
    check_batch_sizes,
    check_cache_opens,
    check_devices,
    check_model,
    check_sample_size,
    part_inputs,
)
from .relay import relay
from .runs import (
    RESUME_LATEST,
    RESUME_OFF,
    check_resume,
    new_run_dir,
    resumable_runs,
    resume_run_dir,
)
from .save_checks import RunOutputs, check_save_names
from . import legacy_prompts
from .train_inputs import eval_inputs, sample_link_inputs
from .monitor_inputs import monitor_spec
from .train_options import TrainOptions
from .train_samples import parse_prompts, sample_spec, write_prompt_file
from .types import CACHE, EXPERTS, LORA, MEMORY, OBJECTIVE, RUN, TRAIN_OPTIONS

ui_feed.register_routes()  # GET /pipetrain/run_state: a reloaded page redraws a running node
legacy_prompts.register()  # API prompts that still give Train Options' settings to Train Pipeline


class PipeTrainTrainPipeline:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("Train a LoRA out of process with DeepSpeed (data parallel over GPUs; CPU processes when there "
                   "is no GPU), or in one plain PyTorch process where DeepSpeed is not installed. Writes output/pipetrain/<run>/ with run.json, events, TensorBoard logs, LoRA files "
                   "and checkpoints.")
    RETURN_TYPES = (RUN, "STRING")
    RETURN_NAMES = ("run", "summary")
    FUNCTION = "train"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model_name": (model_file_names(), {"tooltip":
                               "The model to train, from ComfyUI's diffusion_models (first) or checkpoints folders. "
                               "It is loaded by the training processes with ComfyUI's own loader. GGUF files "
                               "(.gguf, as ComfyUI-GGUF loads them) are listed too: a LoRA trains on them with "
                               "their weights kept quantized."}),
                "cache": (CACHE, {"tooltip": "The encoded dataset from PipeTrain Cache Latents."}),
                "lora": (LORA, {"tooltip": "LoRA settings from PipeTrain Configure LoRA."}),
                "memory": (MEMORY, {"tooltip": "Memory/speed settings from PipeTrain Memory Options."}),
                "steps": ("INT", {"default": 500, "min": 0, "max": 10_000_000, "tooltip":
                          "Optimizer steps to train (in total, when resuming). 0 = use epochs instead."}),
                "epochs": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100000.0, "step": 0.5, "tooltip":
                           "Passes over the dataset (with repeats); used only when steps is 0."}),
                "learning_rate": ("FLOAT", {"default": 1e-4, "min": 1e-7, "max": 10.0, "step": 1e-5,
                                  "round": False, "tooltip": "Peak learning rate. 1e-4 is a common LoRA start "
                                  "for the AdamW optimizers; prodigy wants 1.0, adafactor ~1e-2."}),
                "scheduler": (list(SCHEDULERS), {"default": "constant", "tooltip":
                              "Learning-rate shape after warmup: constant, linear decay to 0, or cosine."}),
                "warmup_steps": ("INT", {"default": 0, "min": 0, "max": 100000, "tooltip":
                                 "Steps over which the learning rate ramps up from near 0."}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 256, "tooltip":
                               "Images per process per micro step. Larger uses more memory."}),
                "grad_accum": ("INT", {"default": 1, "min": 1, "max": 1024, "tooltip":
                               "Micro steps per optimizer step. Effective batch = batch_size x grad_accum x GPUs."}),
                # No "control after generate": a seed that changed after every queue would retrain.
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1, "control_after_generate": False,
                                 "tooltip": "Seed for LoRA init, data order, noise and timesteps; the same seed "
                                            "repeats a run exactly."}),
                "save_every": ("INT", {"default": 0, "min": 0, "max": 10_000_000, "tooltip":
                               "Also save a LoRA every N steps (0 = only the final one)."}),
                "checkpoint_every": ("INT", {"default": 0, "min": 0, "max": 10_000_000, "tooltip":
                                     "Write a resumable checkpoint every N steps (0 = only at the end or on Cancel)."}),
                "num_gpus": ("INT", {"default": 1, "min": 1, "max": 1024, "tooltip":
                             "Training processes: one per GPU. Without a GPU they run on the CPU."}),
                "run_name": ("STRING", {"default": "pipetrain_lora", "tooltip":
                             "Folder name under output/pipetrain/. A taken name gets a _2, _3... suffix."}),
                "resume": ([RESUME_OFF, RESUME_LATEST] + resumable_runs(_output_dir_or_empty()), {"tooltip":
                           "off = new run; latest = continue the newest run that has a checkpoint; or continue the "
                           "named run. Resuming trains up to 'steps' in total."}),
            },
            # Saved UI workflows store widget values by position: add new inputs at the end only.
            "optional": {
                "cluster": cluster_input(),
                **sample_link_inputs(),
                "eval_cache": eval_inputs()["eval_cache"],
                "objective": (OBJECTIVE, {"tooltip":
                              "Objective settings from PipeTrain Objective Options: guidance for guidance-distilled "
                              "models, Flux's resolution-dependent shift, the loss (mse/huber/smooth_l1), min-SNR "
                              "and debiased weighting. Unconnected = their defaults (guidance 1, mse); a resumed run "
                              "keeps the ones it was trained with."}),
                "options": (TRAIN_OPTIONS, {"tooltip":
                            "The less often changed settings from PipeTrain Train Options: GPU ids and backend, "
                            "timestep sampling, shift and noise range, how samples are rendered, the eval interval, "
                            "EMA and accept_changes. Unconnected = that node's defaults."}),
                "model": ("MODEL", {"tooltip":
                          "Train the graph's own model: connect the MODEL of a UNETLoader or CheckpointLoaderSimple, "
                          "directly or through LoRA loaders (LoraLoaderModelOnly, LoraLoader). The training processes "
                          "load that file, merge the LoRA stack at its strengths and train a new LoRA on top; "
                          "model_name is then not used. Save LoRA saves only the new LoRA: apply it after the same "
                          "stack. Unconnected = model_name, as before."}),
                "experts": (EXPERTS, {"tooltip":
                            "Wan 2.2 A14B: train both experts in one run, from PipeTrain Wan 2.2 Experts. model_name "
                            "is then the high-noise expert; two runs, <run_name>_high_noise (noise above the "
                            "boundary) and <run_name>_low_noise (below it, on that node's low_noise_model), share "
                            "the cache and every setting, one after the other or at the same time on two halves of "
                            "the GPUs. Save LoRA saves them as a pair. Unconnected = one run, as before."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID", "prompt": "PROMPT"},  # prompt: check_save_names
        }

    def train(self, model_name, cache, lora, memory, steps, epochs, learning_rate, scheduler, warmup_steps,
              batch_size, grad_accum, seed, save_every, checkpoint_every, num_gpus, run_name, resume, cluster=None,
              clip=None, vae=None, sample_prompts="", eval_cache=None, objective=None, options=None, model=None,
              experts=None, unique_id=None, prompt=None):
        inputs = {k: v for k, v in locals().items() if k not in ("self", "experts")}
        if experts is not None:  # two runs, one per Wan 2.2 expert (nodes/expert_pair.py)
            from .expert_pair import train_pair

            return train_pair(experts, inputs)
        plan = prepare(**inputs)
        output = compat.output_directory()
        run_dir = new_run_dir(output, plan.cfg.run_name) if resume == RESUME_OFF else resume_run_dir(output, resume)
        with run_lock.claimed(run_dir):  # a folder a live run trains in is refused before run.json is touched
            cfg, config_path = open_run(plan, run_dir)
            announce_other_nodes(cfg, config_path)  # several machines: checked now, what to start on the others
            compat.free_accelerator_memory()
            return relay(cfg, config_path, plan.cuda, plan.model_name, node_id=unique_id,
                         vae=vae if plan.samples else None, notice=plan.notice)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A run checked and ready to start (prepare): its config without a folder yet, and what starting needs."""

    cfg: RunConfig
    model_name: str
    model_path: str
    cuda: bool
    samples: object  # SampleSpec or None
    prompts: tuple
    notice: str
    negative: str
    clip: object
    keep_objective: bool  # no Objective Options connected: a resumed run keeps the one it was trained with


def prepare(model_name, cache, lora, memory, steps, epochs, learning_rate, scheduler, warmup_steps, batch_size,
            grad_accum, seed, save_every, checkpoint_every, num_gpus, run_name, resume, cluster=None, clip=None,
            vae=None, sample_prompts="", eval_cache=None, objective=None, options=None, model=None, unique_id=None,
            prompt=None, pair=False) -> RunPlan:
    """Every check Train Pipeline makes before it creates a run folder: the settings, the save nodes it feeds,
    files, devices, caches, the model against the caches and the samples. Reads files; writes none. pair: a
    half of a Wan 2.2 experts pair (Save LoRA then writes <name>_high_noise and <name>_low_noise)."""
    o = options or TrainOptions()
    base_loras = ()
    if model is not None:  # the graph's model: its file and LoRA stack (nodes/model_sources.py)
        source = model_source(prompt, unique_id)
        if os.path.basename(source.model_path) != model_name:
            compat.log.info("[PipeTrain] model is connected: training %s (model_name %s is not used)",
                            source.describe(), model_name)
        model_path, base_loras = source.model_path, source.loras
        model_name = os.path.basename(model_path)
    else:
        model_path = compat.full_path("diffusion_models", model_name) or compat.full_path("checkpoints", model_name)
    if not model_path:
        raise ConfigError(f"model_name {model_name!r} is not in ComfyUI's diffusion_models or checkpoints "
                          "folders: put the file there and refresh, or pick another.")
    train = TrainSpec(steps=steps, epochs=float(epochs), learning_rate=float(learning_rate), scheduler=scheduler,
                      warmup_steps=warmup_steps, batch_size=batch_size, grad_accum=grad_accum, seed=seed,
                      save_every=save_every, checkpoint_every=checkpoint_every,
                      timestep_sampling=o.timestep_sampling, timestep_shift=float(o.timestep_shift),
                      min_t=float(o.min_t), max_t=float(o.max_t), ema_decay=float(o.ema_decay),
                      ema_start_step=int(o.ema_start_step))
    launch = LaunchSpec(num_gpus=num_gpus, gpu_ids=o.gpu_ids.strip().replace(" ", ""),
                        backend=launcher.resolve_backend(o.backend), cluster=launch_cluster(cluster))
    cfg = RunConfig(run_name=run_name.strip(), run_dir="", comfyui_root=compat.comfyui_root(),
                    model_path=model_path, cache_dir=cache.cache_dir,
                    more_cache_dirs=tuple(part.cache_dir for part in cache.more), lora=lora, memory=memory, train=train,
                    launch=launch, eval=eval_spec(eval_cache, cache, o.eval_every, o.eval_before_start,
                                                  o.eval_early_stop),
                    objective=objective or ObjectiveSpec(), resume=resume != RESUME_OFF,
                    accept_changes=bool(o.accept_changes),
                    monitor=monitor_spec(o.wandb_project, o.wandb_run_name, o.wandb_mode, o.wandb_entity),
                    base_loras=base_loras)
    cfg.validate()  # every setting and rule, once (reads no file); each rank validates run.json again
    # a taken name or a save node this run cannot feed is found now, not after training
    check_save_names(prompt, unique_id, RunOutputs(full=lora.kind == "full", ema=train.ema_decay > 0,
                                                   eval=cfg.eval.enabled or resume != RESUME_OFF, pair=pair))
    cfg.check_files()  # before any folder is made; the samples' prompts file is written by open_run
    cuda = check_devices(launch)
    for part in cache.parts:  # chained datasets: every cache (LoadDataset's add_to)
        check_cache_opens(part.cache_dir)
        check_batch(batch_size, part)
    missing = uncond_missing(cfg.objective.cfg_augment, [part.cache_dir for part in cache.parts])
    if missing:
        raise ConfigError(missing)
    check_batch_sizes(cache, batch_size, memory.pipeline_stages)
    found = check_model(model_name, model_path, lora, {**part_inputs(cache), "eval_cache": eval_cache},
                        train.timestep_shift, cfg.objective)
    prompts = parse_prompts(sample_prompts)
    notice = unsupported_reason(memory.pipeline_stages) if prompts else ""
    samples = None if notice else sample_spec(prompts, clip, vae, o.sample_every, o.sample_width, o.sample_height,
                                              o.sample_steps, o.sample_cfg, o.sample_seed, o.sample_sampler,
                                              o.sample_scheduler)
    if notice:
        compat.log.warning("[PipeTrain] %s", notice)
    check_sample_size(samples, found, model_name)
    return RunPlan(cfg=cfg, model_name=model_name, model_path=model_path, cuda=cuda, samples=samples,
                   prompts=tuple(prompts), notice=notice, negative=o.sample_negative, clip=clip,
                   keep_objective=objective is None)


def open_run(plan: RunPlan, run_dir: Path) -> tuple[RunConfig, str]:
    """Write the run's run.json (and samples' prompts) into run_dir, claimed by the caller; returns the config
    and its path. A resumed run (plan.cfg.resume) is checked against its checkpoint first."""
    cfg = plan.cfg
    if cfg.resume:  # unconnected objective: the run goes on with the one it was trained with
        cfg = check_resume(run_dir, cfg, keep_objective=plan.keep_objective)
        check_model(plan.model_name, plan.model_path, cfg.lora, {}, cfg.train.timestep_shift, cfg.objective)
    cfg = dataclasses.replace(cfg, run_name=run_dir.name, run_dir=str(run_dir))
    if plan.samples is not None:  # encoded with the graph's CLIP now; the engine never loads a text encoder
        samples = dataclasses.replace(plan.samples, prompts_file=write_prompt_file(str(run_dir), list(plan.prompts),
                                                                                  plan.negative, plan.clip))
        cfg = dataclasses.replace(cfg, sample=samples)  # validated by sample_spec
    config_path = run_dir / "run.json"
    cfg.save(config_path)
    return cfg, str(config_path)


def eval_spec(eval_cache, cache, every: int, before_start: bool, early_stop: int = 0) -> EvalSpec:
    """The run's EvalSpec from the node's eval inputs; off without an eval_cache."""
    if eval_cache is None:
        if early_stop:
            raise ConfigError(f"eval_early_stop is {early_stop} but Train Pipeline has no eval_cache: connect an eval "
                              "set (a Cache Latents output of held-out images) or set eval_early_stop to 0.")
        return EvalSpec()
    if tuple(eval_cache.latent_shape)[:1] != tuple(cache.latent_shape)[:1]:
        raise ConfigError(f"eval_cache holds {eval_cache.latent_shape[0]}-channel latents, the training cache "
                          f"{cache.latent_shape[0]}: cache the eval set with the same VAE as the training set.")
    spec = EvalSpec(cache_dir=eval_cache.cache_dir, every=int(every), before_start=bool(before_start),
                    early_stop=int(early_stop))
    spec.validate()  # early_stop without eval_every: refused here, before the launch
    if not spec.enabled:
        compat.log.warning("[PipeTrain] eval_cache is connected but eval_every is 0 and eval_before_start is off: "
                           "no eval this run.")
    return spec


def _output_dir_or_empty() -> str:
    try:
        return compat.output_directory()
    except Exception:  # imported outside ComfyUI
        return os.devnull
