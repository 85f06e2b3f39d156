"""Sample images during training, rendered with the current LoRA by ComfyUI's own sampler.

Every `sample.every` steps rank 0 renders one latent per prompt of the run's prompts file
(engine/sample_files.py) with `comfy.sample.sample` (the code path of ComfyUI's KSampler) on the
model being trained, LoRA included, writes them to the run's sample file and emits a `sample`
event. The node decodes them with the graph's VAE (the engine never loads a VAE) and shows them.
Other ranks wait at the next collective meanwhile.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable

import torch

from ..config.checks import ConfigError
from ..config.run import RunConfig
from ..sample_files import due, read_prompts, unsupported_reason, write_samples


class SampleRenderer:
    """Renders the run's sample prompts with the model being trained (its LoRA included)."""

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, device: torch.device, events, memory_plan=None,
                 streams: list | None = None):
        """streams: the training rows' packed stream shapes (their `latent_shapes`: video, audio), or None."""
        import comfy.samplers

        spec = cfg.sample
        for name, value, known in (("sampler", spec.sampler, comfy.samplers.KSampler.SAMPLERS),
                                   ("scheduler", spec.scheduler, comfy.samplers.KSampler.SCHEDULERS)):
            if value not in known:
                raise ConfigError(f"sample.{name} {value!r} is not one this ComfyUI knows: choose one of "
                                  f"{', '.join(known)}.")
        self.cfg, self.spec, self.model, self.device, self.events = cfg, spec, model, device, events
        self.texts, self.positives, self.negative = read_prompts(spec.prompts_file)
        self.memory_plan = memory_plan  # engine.memory.options.MemoryPlan: block swap may be lifted while sampling
        self.streams = streams
        self._patcher = None
        self.failed = False

    @classmethod
    def create(cls, cfg: RunConfig, model, device, events, rank: int, memory_plan=None,
               streams: list | None = None) -> "SampleRenderer | None":
        """The renderer for rank 0 of a run with sample prompts; None otherwise (with a warning event
        when the run asked for samples this setup cannot render)."""
        if not cfg.sample.every or rank != 0:
            return None
        reason = unsupported_reason(cfg.memory.pipeline_stages)
        if reason:
            events.emit("warning", message=reason)
            return None
        return cls(cfg, model, device, events, memory_plan, streams)

    def _model_patcher(self):
        if self._patcher is None:
            self._patcher = _training_patcher(self.model, self.device)
        return self._patcher

    def empty_latent(self) -> torch.Tensor:
        """An empty latent of the sample size as KSampler gets it: zeros, then ComfyUI's own fix for empty latents
        (comfy.sample.fix_empty_latent_channels), which makes MiniMax H3's the video + audio pair it samples.
        LTX 2.x's latent format has no such fix (its graphs pack the video with LTXV Empty Latent Audio's
        zeros: LTXV Concat AV Latent): a run on packed rows samples the video with an empty audio stream of the
        rows' channels and bins, one frame long (one video frame at 25 latents a second)."""
        import comfy.sample

        fmt = self.model.latent_format
        ratio = int(getattr(fmt, "spacial_downscale_ratio", 8))
        shape = [1, int(fmt.latent_channels), max(1, self.spec.height // ratio), max(1, self.spec.width // ratio)]
        if int(getattr(fmt, "latent_dimensions", 2)) == 3:  # video models: one frame
            shape.insert(2, 1)
        latent = comfy.sample.fix_empty_latent_channels(self._model_patcher(), torch.zeros(shape))
        if latent.is_nested or not self.streams or len(self.streams) < 2:
            return latent
        import comfy.nested_tensor  # packed rows exist only on ComfyUI 0.33+, which has it

        audio = tuple(self.streams[1])
        return comfy.nested_tensor.NestedTensor((latent, torch.zeros((1, audio[1], 1, *audio[3:]))))

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
                        raise _Stopped()
                    latent = self.empty_latent()
                    noise = comfy.sample.prepare_noise(latent, self.spec.seed)
                    out = comfy.sample.sample(patcher, noise, self.spec.steps, self.spec.cfg, self.spec.sampler,
                                              self.spec.scheduler, positive, self.negative, latent,
                                              callback=_stop_between_steps(should_stop), disable_pbar=True,
                                              seed=self.spec.seed)
                    latents.append(_picture(out).float().cpu())
        except _Stopped:
            # Cancel during a render: stop within one sampler step, before the node's grace runs out and
            # the process group is killed without a checkpoint. Nothing of this render is written.
            return None
        finally:
            self.model.train(was_training)
        path = write_samples(self.cfg.run_dir, step, torch.cat(latents), self.texts)
        self.events.emit("sample", step=step, path=str(path), prompts=self.texts,
                         seconds=round(time.time() - started, 3))
        return path


def _picture(samples: torch.Tensor) -> torch.Tensor:
    """What the graph's VAE decodes: a video + audio pair's video (the first stream); other latents as they are."""
    return samples.unbind()[0] if getattr(samples, "is_nested", False) else samples


class _Stopped(Exception):
    """The run was asked to stop while a sample rendered (raised from the sampler's step callback)."""


def _stop_between_steps(should_stop: Callable[[], bool]):
    """A ComfyUI sampler callback (called after every sampler step) that ends the render once the run
    should stop: one step of a big video model takes seconds, a whole sample minutes."""
    def callback(step, denoised, x, total_steps):
        if should_stop():
            raise _Stopped()
    return callback


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
