"""Sample images during training, rendered with the current LoRA by ComfyUI's own sampler.

The node encodes the sample prompts with the graph's CLIP before launch and writes them to
`<run_dir>/samples/prompts.safetensors` (`write_prompts`). Every `sample.every` steps rank 0
renders one latent per prompt with `comfy.sample.sample` (the code path of ComfyUI's KSampler)
on the model being trained, LoRA included, and writes them as
`<run_dir>/samples/step000100.safetensors` ("latent": [N, C, (T,) h, w], ready for VAE decode),
then emits a `sample` event. The node decodes them with the graph's VAE (the engine never loads
a VAE) and shows them. Other ranks wait at the next collective meanwhile.

Prompts file layout: "p<i>.cross_attn" and "p<i>.<extra>" per positive prompt, "n.cross_attn" /
"n.<extra>" for the negative; metadata "prompts" (JSON list of the texts) and, per prefix,
"<prefix>.none" (extras whose value was None) and "<prefix>.json" (other JSON-able extras).
Tensors keep their batch dimension of 1, exactly as ComfyUI's CLIP returned them.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .cache_format import read_safetensors, unpack_extras
from .config import ConfigError, RunConfig

SAMPLES_DIR = "samples"
PROMPTS_FILE = "prompts.safetensors"
_NOT_DATA_KEYS = ("hooks",)  # ComfyUI hook objects: sampling-time machinery, not conditioning data


def sample_file(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / SAMPLES_DIR / f"step{step:06d}.safetensors"


def due(every: int, step: int, total: int) -> bool:
    """Whether samples are rendered after `step`: every N steps, and at the last step."""
    return every > 0 and (step % every == 0 or step == total)


# ---- the prompts file (node writes, engine reads) -------------------------------------------

def write_prompts(path: str | os.PathLike, prompts: list[str], positives: list[tuple[torch.Tensor, dict]],
                  negative: tuple[torch.Tensor, dict]) -> Path:
    """Store encoded prompts (ComfyUI's (cond, extras) pairs) atomically; returns the path."""
    if not prompts or len(prompts) != len(positives):
        raise ConfigError("sample prompts: give one prompt per line (at least one), each encoded once.")
    tensors: dict[str, torch.Tensor] = {}
    metadata = {"prompts": json.dumps(prompts)}
    for prefix, (cond, extras) in [(f"p{i}", c) for i, c in enumerate(positives)] + [("n", negative)]:
        tensors[f"{prefix}.cross_attn"] = cond
        none_keys, json_extras = [], {}
        for key, value in extras.items():
            if key in _NOT_DATA_KEYS:
                continue
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}.{key}"] = value
            elif value is None:
                none_keys.append(key)
            else:
                try:
                    json_extras[key] = json.loads(json.dumps(value))
                except (TypeError, ValueError):
                    continue  # an object that is not data (e.g. a callable): sampling works without it
        metadata[f"{prefix}.none"] = json.dumps(none_keys)
        metadata[f"{prefix}.json"] = json.dumps(json_extras)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, final)
    return final


def read_prompts(path: str | os.PathLike) -> tuple[list[str], list[list], list]:
    """(texts, positive conditionings, negative conditioning) in ComfyUI's [[cond, extras]] form."""
    try:
        meta, tensors = read_safetensors(path)
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise ConfigError(f"sample prompts file {path} cannot be read ({e}): re-queue TrainPipeline so it is "
                          "written again, or set sample_every to 0.") from e

    def conditioning(prefix: str) -> list:
        extras = unpack_extras(tensors, prefix, meta.get(f"{prefix}.none", "[]"), meta.get(f"{prefix}.json", "{}"))
        return [[tensors[f"{prefix}.cross_attn"], extras]]

    texts = json.loads(meta.get("prompts", "[]"))
    return texts, [conditioning(f"p{i}") for i in range(len(texts))], conditioning("n")


def read_samples(path: str | os.PathLike) -> tuple[torch.Tensor, list[str]]:
    """A sample file's latents [N, ...] and the prompt of each."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        return f.get_tensor("latent"), json.loads(meta.get("prompts", "[]"))


# ---- rendering (engine side, rank 0) -----------------------------------------------------------

def unsupported_reason(pipeline_stages: int) -> str:
    """Why samples cannot be rendered for a run with these settings ("" when they can)."""
    if pipeline_stages > 1:
        return (f"samples during training are not supported with pipeline_stages {pipeline_stages} "
                "(each GPU holds only part of the model); training continues without them. Use pipeline_stages 1, "
                "or test the saved LoRA with a KSampler after training.")
    return ""


class SampleRenderer:
    """Renders the run's sample prompts with the model being trained (its LoRA included)."""

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, device: torch.device, events, memory_plan=None):
        import comfy.samplers

        spec = cfg.sample
        for name, value, known in (("sampler", spec.sampler, comfy.samplers.KSampler.SAMPLERS),
                                   ("scheduler", spec.scheduler, comfy.samplers.KSampler.SCHEDULERS)):
            if value not in known:
                raise ConfigError(f"sample.{name} {value!r} is not one this ComfyUI knows: choose one of "
                                  f"{', '.join(known)}.")
        self.cfg, self.spec, self.model, self.device, self.events = cfg, spec, model, device, events
        self.texts, self.positives, self.negative = read_prompts(spec.prompts_file)
        self.memory_plan = memory_plan  # engine.memory.MemoryPlan: block swap may be lifted while sampling
        self._patcher = None
        self.failed = False

    @classmethod
    def create(cls, cfg: RunConfig, model, device, events, rank: int, memory_plan=None) -> "SampleRenderer | None":
        """The renderer for rank 0 of a run with sample prompts; None otherwise (with a warning event
        when the run asked for samples this setup cannot render)."""
        if not cfg.sample.every or rank != 0:
            return None
        reason = unsupported_reason(cfg.memory.pipeline_stages)
        if reason:
            events.emit("warning", message=reason)
            return None
        return cls(cfg, model, device, events, memory_plan)

    def _model_patcher(self):
        if self._patcher is None:
            self._patcher = _training_patcher(self.model, self.device)
        return self._patcher

    def empty_latent(self) -> torch.Tensor:
        fmt = self.model.latent_format
        ratio = int(getattr(fmt, "spacial_downscale_ratio", 8))
        shape = [1, int(fmt.latent_channels), max(1, self.spec.height // ratio), max(1, self.spec.width // ratio)]
        if int(getattr(fmt, "latent_dimensions", 2)) == 3:  # video models: one frame
            shape.insert(2, 1)
        return torch.zeros(shape)

    def maybe_render(self, step: int, total: int, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Render if this step is due. A failure (e.g. out of memory) stops the samples, not the training."""
        if self.failed or not due(self.spec.every, step, total):
            return
        try:
            self.render(step, should_stop)
        except Exception as e:  # noqa: BLE001 - reported as a warning event; training goes on
            import traceback

            self.failed = True
            self.events.emit("warning", step=step, message=f"sampling failed at step {step}, no more samples this "
                             f"run ({type(e).__name__}: {e}); training continues.",
                             traceback=traceback.format_exc(limit=8))

    def render(self, step: int, should_stop: Callable[[], bool] = lambda: False) -> Path | None:
        """Render every prompt at this step; writes the sample file and a `sample` event."""
        import comfy.sample

        started = time.time()
        self.events.emit("sampling", step=step, prompts=len(self.texts))
        patcher = self._model_patcher()
        was_training = self.model.training
        self.model.eval()  # LoRA dropout off
        latents = []
        placement = (self.memory_plan.for_sampling(self.cfg.memory.block_swap_sampling) if self.memory_plan
                     else contextlib.nullcontext())
        try:
            with torch.no_grad(), placement:
                for positive in self.positives:
                    if should_stop():
                        return None
                    latent = self.empty_latent()
                    noise = comfy.sample.prepare_noise(latent, self.spec.seed)
                    out = comfy.sample.sample(patcher, noise, self.spec.steps, self.spec.cfg, self.spec.sampler,
                                              self.spec.scheduler, positive, self.negative, latent,
                                              disable_pbar=True, seed=self.spec.seed)
                    latents.append(out.float().cpu())
        finally:
            self.model.train(was_training)
        path = sample_file(self.cfg.run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        save_file({"latent": torch.cat(latents).contiguous()}, str(tmp),
                  metadata={"prompts": json.dumps(self.texts), "step": str(step)})
        os.replace(tmp, path)
        self.events.emit("sample", step=step, path=str(path), prompts=self.texts,
                         seconds=round(time.time() - started, 3))
        return path


def _training_patcher(model: torch.nn.Module, device: torch.device):
    """A ComfyUI ModelPatcher over the model being trained whose weights ComfyUI never moves.

    ComfyUI's sampler asks its memory manager to load the model, which moves (or partially
    offloads and casts) weights. The engine owns placement here (block swap keeps blocks in CPU
    RAM, fp8 bases cast per layer, optimizer state fills the GPU), so this patcher reports itself
    fully loaded and turns load/unload into no-ops: sampling runs on the weights where they are.
    """
    import comfy.model_patcher

    class TrainingModelPatcher(comfy.model_patcher.ModelPatcher):
        def loaded_size(self):
            return self.model_size()

        def current_loaded_device(self):
            return self.load_device

        def load(self, *args, **kwargs):
            return None

        def partially_load(self, *args, **kwargs):
            return 0

        def partially_unload(self, *args, **kwargs):
            return 0

        def unpatch_model(self, *args, **kwargs):
            return None

        def detach(self, *args, **kwargs):
            return self

    return TrainingModelPatcher(model, load_device=device, offload_device=device)
