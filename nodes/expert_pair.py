"""Train Pipeline with Wan 2.2 Experts connected: two runs, one LoRA per expert, sharing the cache and settings.

`<run_name>_high_noise` trains model_name on noise levels above the boundary, `<run_name>_low_noise` the
experts' low_noise_model below it. Both halves are checked as a whole run would be (settings, files, devices,
caches, model against cache, save names) before either folder is made, so a bad second half cannot fail after
the first has trained for an hour. Then the two launch one after the other on the same GPUs (the node shows
each in turn) or at the same time on two halves of the GPUs (the node shows the high-noise run, the log both);
Cancel stops both; when one fails the other is stopped after a checkpoint and the error names the expert.

Resume: `resume` naming either half (or the pair's name, or latest) continues the pair: a half with a checkpoint
resumes from it, a half that already reached `steps` is kept as it is, a half that never checkpointed starts
again in its folder.
"""
from __future__ import annotations

import dataclasses
import time
from contextlib import ExitStack
from pathlib import Path

from ..engine.config.checks import MAX_NAME_CHARS, ConfigError, check_run_name
from ..engine.events import iter_events
from ..engine.launch import run_lock
from . import compat
from .relay import POLL_S, RunFailed, RunRelay, newest_lora
from .runs import RESUME_LATEST, RESUME_OFF, RunResult, checkpoint_step, resumable_runs, runs_root, summary_text
from .train_options import TrainOptions
from .train_pipeline import open_run, prepare
from .wan_experts import AT_THE_SAME_TIME, HIGH, LOW, ExpertsSpec

HALVES = (HIGH, LOW)
LABELS = {HIGH: "high-noise", LOW: "low-noise"}
FRESH, RESUMED, FINISHED = "fresh", "resumed", "finished"  # what a half does this time


def train_pair(experts: ExpertsSpec, inputs: dict) -> dict:
    """Train Pipeline's result for both experts: RUN is the high-noise RunResult carrying the low-noise one."""
    experts.validate()
    o = inputs.get("options") or TrainOptions()
    _refuse_conflicts(experts, inputs, o)
    base = inputs["run_name"].strip()
    check_run_name(base)
    longest = MAX_NAME_CHARS - len("_" + HIGH) - 3  # room for the suffix and a _NN of a taken name
    if len(base) > longest:
        raise ConfigError(f"run_name {base!r} is too long for a Wan 2.2 experts pair ({len(base)} characters): the "
                          f"runs are named <run_name>_{HIGH} and <run_name>_{LOW}, so use at most {longest}.")
    output = compat.output_directory()
    resume = inputs["resume"]
    dirs, modes = (None, None) if resume == RESUME_OFF else _resumed_pair(output, resume, inputs["steps"])
    groups = experts.gpu_groups(inputs["num_gpus"], o.gpu_ids.strip().replace(" ", ""), compat.cuda_available())
    plans = {}
    for n, half in enumerate(HALVES):
        lo, hi = experts.noise_range(half)
        num_gpus, gpu_ids = groups[n]
        options = dataclasses.replace(o, min_t=lo, max_t=hi, gpu_ids=gpu_ids)
        half_inputs = {**inputs, "model_name": inputs["model_name"] if half == HIGH else experts.low_noise_model,
                       "run_name": f"{base}_{half}", "num_gpus": num_gpus, "options": options,
                       "resume": RESUME_LATEST if modes and modes[half] == RESUMED else RESUME_OFF, "pair": True}
        try:
            plans[half] = prepare(**half_inputs)
        except ConfigError as e:
            raise ConfigError(f"Wan 2.2 Experts, the {LABELS[half]} run ({half_inputs['model_name']}, noise "
                              f"{lo:g}-{hi:g}, {num_gpus} process(es)): {e}") from None
    if dirs is None:
        dirs, modes = _new_pair_dirs(output, base), {HIGH: FRESH, LOW: FRESH}
    with ExitStack() as claims:
        runs = {}
        for half in HALVES:  # both folders are claimed and both run.json written before the first launch
            claims.enter_context(run_lock.claimed(dirs[half]))
            if modes[half] != FINISHED:
                try:  # a resumed half is checked against its checkpoint here
                    runs[half] = open_run(plans[half], dirs[half])
                except ConfigError as e:
                    raise ConfigError(f"Wan 2.2 Experts, the {LABELS[half]} run: {e}") from None
        compat.free_accelerator_memory()
        node, vae = inputs.get("unique_id"), inputs.get("vae")
        relays = {half: RunRelay(cfg, path, plans[half].cuda, plans[half].model_name, node_id=node,
                                 vae=vae if plans[half].samples else None, notice=plans[half].notice,
                                 shown=half == HIGH or experts.order != AT_THE_SAME_TIME or len(runs) == 1)
                  for half, (cfg, path) in runs.items()}
        if experts.order == AT_THE_SAME_TIME:
            done = _side_by_side(relays)
        else:
            done = _one_after_the_other(relays)
    for half in HALVES:
        if modes[half] == FINISHED:
            done[half] = _finished_result(dirs[half], plans[half].model_name)
    high, low = done[HIGH], done[LOW]
    result = dataclasses.replace(high[0], low_noise=low[0])
    text = f"{high[1]}\n\n{low[1]}"
    ui = {"text": [text]}
    images = high[2].get("images") or low[2].get("images")
    if images:
        ui["images"] = images
    return {"ui": ui, "result": (result, text)}


def _refuse_conflicts(experts: ExpertsSpec, inputs: dict, o: TrainOptions) -> None:
    """Settings a pair cannot take, each refused with its fix before anything is checked further."""
    if (o.min_t, o.max_t) != (TrainOptions.min_t, TrainOptions.max_t):
        raise ConfigError(f"Train Options' min_t/max_t are {o.min_t:g}/{o.max_t:g} while Wan 2.2 Experts is "
                          f"connected, whose boundary ({experts.boundary:g}) sets each expert's noise range: set min_t "
                          "to 0 and max_t to 1, or disconnect Wan 2.2 Experts to train one model on a noise range.")
    if inputs.get("model") is not None:
        raise ConfigError("Train Pipeline's model input and Wan 2.2 Experts are both connected: with experts, "
                          "model_name is the high-noise expert and Wan 2.2 Experts' low_noise_model the other. "
                          "Disconnect model and pick the high-noise expert in model_name.")
    if inputs.get("cluster") is not None:
        raise ConfigError("Wan 2.2 Experts trains on one machine: disconnect PipeTrain Cluster, or train each expert "
                          "as its own run (Train Options' min_t/max_t) on the cluster.")
    if inputs["lora"].kind == "full":
        raise ConfigError("Wan 2.2 Experts trains a LoRA per expert, but Configure LoRA's adapter is 'full': choose "
                          "adapter 'lora', or disconnect Wan 2.2 Experts.")
    name = experts.low_noise_model
    if not (compat.full_path("diffusion_models", name) or compat.full_path("checkpoints", name)):
        raise ConfigError(f"Wan 2.2 Experts' low_noise_model {name!r} is not in ComfyUI's diffusion_models or "
                          "checkpoints folders: put the low-noise expert's file there and refresh, or pick another.")
    if name == inputs["model_name"]:
        compat.log.warning("[PipeTrain] Wan 2.2 Experts: low_noise_model is model_name (%s): both LoRAs train on "
                           "the same file", name)


def _new_pair_dirs(output: str, base: str) -> dict[str, Path]:
    """Fresh folders <base>_high_noise and <base>_low_noise, or <base>_2_high_noise ... where either is taken,
    so the two names always match."""
    root = runs_root(output)
    root.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        stem = base if n == 1 else f"{base}_{n}"
        high, low = root / f"{stem}_{HIGH}", root / f"{stem}_{LOW}"
        if not high.exists() and not low.exists():
            try:
                high.mkdir()
            except FileExistsError:
                n += 1
                continue
            try:
                low.mkdir()
                return {HIGH: high, LOW: low}
            except FileExistsError:
                high.rmdir()  # empty: made above
        n += 1


def _resumed_pair(output: str, resume: str, steps: int) -> tuple[dict[str, Path], dict[str, str]]:
    """The pair's folders and what each half does: resume (a checkpoint), finished (at `steps`), fresh (none)."""
    if resume == RESUME_LATEST:
        found = [name for name in resumable_runs(output) if _pair_stem(name)]
        if not found:
            raise ConfigError(f"resume is 'latest' but no Wan 2.2 experts run (<name>_{HIGH} or <name>_{LOW}) in "
                              f"{runs_root(output)} has a checkpoint yet: set resume to 'off' to start the pair.")
        stem = _pair_stem(found[0])
    else:
        stem = _pair_stem(resume) or resume
    dirs = {half: runs_root(output) / f"{stem}_{half}" for half in HALVES}
    missing = [p.name for p in dirs.values() if not (p / "run.json").is_file()]
    if missing:
        raise ConfigError(f"resume {resume!r}: Wan 2.2 Experts continues the pair {stem}_{HIGH} and {stem}_{LOW}, "
                          f"but {', '.join(missing)} holds no run: pick a run of a pair in resume, or set resume "
                          "to 'off' to start the pair.")
    modes = {}
    for half, path in dirs.items():
        at = checkpoint_step(path)
        if at is None:
            modes[half] = FRESH
        elif steps and at >= steps and _done_event(path) is not None:
            modes[half] = FINISHED
        else:
            modes[half] = RESUMED
    if all(mode == FINISHED for mode in modes.values()):
        raise ConfigError(f"resume {resume!r}: both runs of the pair {stem} already reached {steps} steps, so there "
                          "is nothing left to train: raise steps to train further (steps counts the total), or set "
                          "resume to 'off' for a new pair.")
    return dirs, modes


def _pair_stem(name: str) -> str:
    for half in HALVES:
        if name.endswith("_" + half) and len(name) > len(half) + 1:
            return name[: -len(half) - 1]
    return ""


def _done_event(run_dir: Path) -> dict | None:
    done = None
    for ev in iter_events(run_dir):
        if ev.get("event") == "done":
            done = ev
    return done


def _finished_result(run_dir: Path, model_name: str) -> tuple[RunResult, str, dict]:
    """A half that had already reached its steps when the pair was resumed: its result from its own folder."""
    ev = _done_event(run_dir) or {}
    result = RunResult(run_dir=str(run_dir), run_name=run_dir.name,
                       lora_path=ev.get("lora") or newest_lora(str(run_dir)), steps=int(ev.get("step", 0)),
                       total_steps=int(ev.get("total", 0)), final_loss=float(ev.get("loss", float("nan"))),
                       model_name=model_name, status="done")
    text = summary_text(result) + " (finished before this resume)"
    return result, text, {}


def _one_after_the_other(relays: dict[str, RunRelay]) -> dict[str, tuple]:
    done = {}
    for half, run in relays.items():
        try:
            done[half] = run.follow()
        except RunFailed as e:
            after = f"; the {LABELS[LOW]} run was not started" if half == HIGH and LOW in relays else ""
            raise RunFailed(f"Wan 2.2 Experts: the {LABELS[half]} expert's run failed{after}.\n{e}") from None
    return done


def _side_by_side(relays: dict[str, RunRelay]) -> dict[str, tuple]:
    """Both launches at once (each on its own GPUs and master port), relayed together until both end."""
    done, running = {}, {}
    try:
        for half, run in relays.items():
            running[half] = run.start()
        while running:
            for half, run in list(running.items()):
                if run.poll():
                    continue
                del running[half]
                run.close()
                try:
                    done[half] = run.result()
                except RunFailed as e:
                    others = list(running)
                    for other in others:
                        running.pop(other).stop(f"stopped: the {LABELS[half]} run beside it failed")
                    stopped = f"; the {LABELS[others[0]]} run was stopped" if others else ""
                    raise RunFailed(f"Wan 2.2 Experts: the {LABELS[half]} expert's run failed{stopped}.\n{e}") from None
            compat.raise_if_interrupted()
            time.sleep(POLL_S)
    except compat.InterruptProcessingException:
        for run in running.values():
            run.cancel()
        raise
    finally:
        for run in relays.values():
            run.close()
    return done

