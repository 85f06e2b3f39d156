"""What PipeTrain changes in DeepSpeed's pipeline engine (engine/train/pipeline.py uses it), and in both of
DeepSpeed's engines: the gradient norm and clipping (own_norm_and_clip), no all-reduce within one replica
(skip_lone_replica_allreduce).

Each piece sets or overrides a private part of DeepSpeed 0.18's PipelineModule / PipelineEngine /
DeepSpeedEngine; tests/*/test_pipeline*.py compare pipelined runs with plain ones (losses, clipped gradients,
LoRA, gradient norms) and tests/training/test_deepspeed_step.py compares the engine's steps with torch's by
hand and counts its all-reduces, so a DeepSpeed release that renames one fails there.
"""
from __future__ import annotations


def split_pipeline_module():
    """PipelineModule that also takes the stage boundaries as given (partition_method 'manual')."""
    from deepspeed.pipe import PipelineModule

    class SplitPipelineModule(PipelineModule):
        """PipelineModule that also takes the stage boundaries as given (partition_method 'manual')."""

        def __init__(self, parts, **kwargs):
            self._manual_parts = parts  # read by _partition_layers during PipelineModule.__init__
            super().__init__(**kwargs)

        def _partition_layers(self, method="uniform"):
            if method != "manual":
                return super()._partition_layers(method)
            self.parts = list(self._manual_parts)
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

    return SplitPipelineModule


def own_norm_and_clip(engine, norm_and_clip) -> None:
    """At each optimizer step, just before DeepSpeed steps (its _take_model_step: the gradients are averaged
    over the replicas by then), measure the gradient norm and clip by it with `norm_and_clip()`
    (engine/train/grad_norm.py), and keep the norm as engine.pipetrain_grad_norm. DeepSpeed's own clipping
    stays off (engine/train/distributed.py's config): its clip_grad_norm_ measures and scales each tensor on
    its own, counts a pipeline's later stages only when their weights are marked model-parallel, and its
    get_global_grad_norm() stays None with a torch optimizer in fp32."""
    take_model_step = engine._take_model_step

    def measured_step(*args, **kwargs):
        engine.pipetrain_grad_norm = norm_and_clip()
        return take_model_step(*args, **kwargs)

    engine._take_model_step = measured_step


def skip_lone_replica_allreduce(engine, replicas: int) -> None:
    """With one data-parallel replica (one GPU, or a pipeline over every GPU) DeepSpeed's gradient all-reduce
    averages each gradient with itself: it copies every gradient into one buffer, reduces it over a group of
    one rank and copies each back, a kernel launch per trained tensor (~1,500 for SDXL's LoRA) each optimizer
    step for the same numbers. Turned off then, in both engines (the flags their backward passes read)."""
    if replicas == 1:
        engine.enable_backward_allreduce = False  # DeepSpeedEngine._backward_epilogue
        if hasattr(engine, "pipeline_enable_backward_allreduce"):
            engine.pipeline_enable_backward_allreduce = False  # PipelineEngine._exec_reduce_grads


def stage_backward(engine) -> None:
    """Non-last stages backpropagate with torch.autograd.backward (DeepSpeed refuses unless this is
    on); the gradient they receive is already divided by gas, so it is not divided again."""
    engine._support_torch_style_backward = True
    if not engine.is_last_stage():
        engine._scale_wrt_gas = False


class UnsafeCheckpoint(ValueError):
    """A checkpoint file holds objects other than tensors and plain data."""


def load_tensors_only(engine) -> None:
    """Read this engine's checkpoint files with torch's weights-only unpickler.

    DeepSpeed's checkpoint engine reads every checkpoint file with full pickle (torch.load with
    weights_only=False), so a crafted run folder would run code on resume. Its files hold only
    tensors and plain data (module and optimizer state, client state, config), which the
    weights-only unpickler reads; anything else is refused with UnsafeCheckpoint.
    """
    import pickle

    import torch

    def load(path, map_location=None):
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpoint(
                f"the checkpoint file {path} holds objects other than tensors and plain data, which PipeTrain "
                "does not load (unpickling them could run code). Delete that checkpoint folder to resume from an "
                f"earlier one, or start a new run. ({str(e).splitlines()[0]})") from None

    engine.checkpoint_engine.load = load
