"""What PipeTrain changes in DeepSpeed's pipeline engine (engine/train/pipeline.py uses it), and the
gradient norm it records in both of DeepSpeed's engines (record_grad_norm).

Each piece sets or overrides a private part of DeepSpeed 0.18's PipelineModule / PipelineEngine;
tests/*/test_pipeline*.py compare pipelined runs with plain ones (losses, clipped gradients, LoRA,
gradient norms), so a DeepSpeed release that renames one fails there.
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


def clip_by_the_whole_replica(params) -> None:
    """DeepSpeed's clip_grad_norm_ sums the squared norm over the stages of a replica but counts only
    the first stage's own parameters unless they are marked model-parallel: without this, a
    pipelined run clips by stage 1's norm alone, unlike a plain run (tests/with_comfy/test_pipeline_chroma.py)."""
    for p in params:
        p.model_parallel = True


def record_grad_norm(engine, norm_of) -> None:
    """Keep `norm_of()` (engine/train/grad_norm.py) as engine.pipetrain_grad_norm at each optimizer step,
    just before DeepSpeed clips and steps (its _take_model_step: the gradients are averaged over the
    replicas by then). DeepSpeed's own get_global_grad_norm() stays None with a torch optimizer in fp32:
    that path drops the norm its clip_grad_norm_ computes, and computes none without clipping."""
    take_model_step = engine._take_model_step

    def measured_step(*args, **kwargs):
        engine.pipetrain_grad_norm = norm_of()
        return take_model_step(*args, **kwargs)

    engine._take_model_step = measured_step


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
