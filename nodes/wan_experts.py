"""PipeTrainWanExperts: both Wan 2.2 A14B experts in one Train Pipeline run (its `experts` input).

Wan 2.2 A14B denoises with two models: the high-noise expert above a boundary noise level, the low-noise
expert below it (ComfyUI's templates switch between two KSamplerAdvanced there). This node names the second
file, the boundary and whether the two LoRAs train one after the other or at the same time on two GPU groups;
nodes/expert_pair.py runs the pair.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..engine.config.checks import ConfigError, check
from .model_sources import model_file_names
from .types import EXPERTS

ONE_AFTER_THE_OTHER, AT_THE_SAME_TIME = "one_after_the_other", "at_the_same_time"
ORDERS = (ONE_AFTER_THE_OTHER, AT_THE_SAME_TIME)
HIGH, LOW = "high_noise", "low_noise"  # the run-name and LoRA-name suffixes of the two halves
DEFAULT_BOUNDARY = 0.875  # T2V; the I2V experts switch at 0.9


@dataclass(frozen=True)
class ExpertsSpec:
    """PIPETRAIN_EXPERTS: the low-noise expert's file name, the boundary sigma and the order of the two runs."""

    low_noise_model: str
    boundary: float = DEFAULT_BOUNDARY
    order: str = ONE_AFTER_THE_OTHER

    def validate(self) -> None:
        check(bool(self.low_noise_model.strip()), "Wan 2.2 Experts' low_noise_model is empty: pick the low-noise "
              "expert's file.")
        check(0.01 <= self.boundary <= 0.99, f"Wan 2.2 Experts' boundary is {self.boundary}: use a noise level "
              "between 0.01 and 0.99 (0.875 for the T2V experts, 0.9 for I2V).")
        check(self.order in ORDERS, f"Wan 2.2 Experts' order is {self.order!r}: choose one of {', '.join(ORDERS)}.")

    def noise_range(self, half: str) -> tuple[float, float]:
        """(min_t, max_t) of a half: the high-noise expert above the boundary, the low-noise one below."""
        return (self.boundary, 1.0) if half == HIGH else (0.0, self.boundary)

    def gpu_groups(self, num_gpus: int, gpu_ids: str, cuda: bool) -> tuple[tuple[int, str], tuple[int, str]]:
        """(num_gpus, gpu_ids) of the high- and the low-noise run. One after the other: the same for both. At
        the same time: two equal halves of the GPUs, of gpu_ids in order where given, else of 0..num_gpus-1 (named,
        so the two groups never share a GPU); CPU processes (no cuda) take no ids, only the count."""
        if self.order == ONE_AFTER_THE_OTHER:
            return (num_gpus, gpu_ids), (num_gpus, gpu_ids)
        if num_gpus < 2 or num_gpus % 2:
            raise ConfigError(f"Wan 2.2 Experts' order at_the_same_time splits Train Pipeline's num_gpus into two "
                              f"equal groups, and num_gpus is {num_gpus}: set num_gpus to an even number (2, 4, ...), "
                              "or choose order one_after_the_other.")
        half = num_gpus // 2
        if not gpu_ids and not cuda:
            return (half, ""), (half, "")
        ids = gpu_ids.split(",") if gpu_ids else [str(i) for i in range(num_gpus)]
        return (half, ",".join(ids[:half])), (half, ",".join(ids[half:]))


class PipeTrainWanExperts:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("Wan 2.2 A14B: train the high-noise and the low-noise expert's LoRAs in one Train Pipeline run. "
                   "Connect to Train Pipeline's experts input; its model_name is then the high-noise expert. Save "
                   "LoRA writes <name>_high_noise and <name>_low_noise.")
    RETURN_TYPES = (EXPERTS,)
    RETURN_NAMES = ("experts",)
    FUNCTION = "configure"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "low_noise_model": (model_file_names(), {"tooltip":
                                    "The low-noise expert's file (e.g. wan2.2_t2v_low_noise_14B_fp16.safetensors), "
                                    "from the same folders as Train Pipeline's model_name, which is the high-noise "
                                    "expert."}),
                "boundary": ("FLOAT", {"default": DEFAULT_BOUNDARY, "min": 0.01, "max": 0.99, "step": 0.005,
                             "round": 0.0001, "tooltip":
                             "The noise level (sigma) where sampling switches from the high-noise to the low-noise "
                             "expert, as in ComfyUI's Wan 2.2 templates: 0.875 for the T2V experts, 0.9 for I2V. "
                             "The high-noise LoRA trains above it, the low-noise LoRA below it."}),
                "order": (list(ORDERS), {"default": ONE_AFTER_THE_OTHER, "tooltip":
                          "one_after_the_other: the high-noise run, then the low-noise run, each on all of Train "
                          "Pipeline's GPUs. at_the_same_time: both at once, each on half of num_gpus (even, 2 or "
                          "more; gpu_ids split in order, the first half trains the high-noise expert)."}),
            },
        }

    def configure(self, low_noise_model, boundary, order):
        spec = ExpertsSpec(low_noise_model=low_noise_model, boundary=round(float(boundary), 6), order=order)
        spec.validate()
        return (spec,)
