"""ObjectiveSpec: what the training loss is made of, run.json's `objective` section (the Objective Options
node writes it; without that node the defaults apply). Plain data, no torch; the formulas are in
engine/train/objective.py, engine/train/timesteps.py and engine/train/losses.py, the rules that join
these settings with `train` in engine/config/rules.py, those that need the model in
engine/train/objective_checks.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from .checks import check
from .choices import LOSSES

# The line through (256 image tokens, base_shift) and (4096 tokens, max_shift) that gives Flux's mu
# per image size (ComfyUI's ModelSamplingFlux node: tokens = width * height / (16 * 16)).
FLUX_BASE_TOKENS, FLUX_MAX_TOKENS = 256, 4096


@dataclass(frozen=True)
class ObjectiveSpec:
    # Guidance-distilled models (Flux.1 dev/Kontext, Flux 2 Dev, HunyuanVideo, HunyuanImage 2.1 distilled):
    # the guidance value every item trains at, replacing any cached one. 0 = each item's cached guidance,
    # else ComfyUI's default for the model (3.5 for Flux): what PipeTrain did before this setting.
    guidance: float = 1.0
    # Flux-style schedules (Flux, Flux 2, Chroma, Qwen-Image): mu per image from its token count, on the
    # line through (256, base_shift) and (4096, max_shift), instead of one mu for every size.
    resolution_shift: bool = False
    base_shift: float = 0.5
    max_shift: float = 1.15
    sigmoid_scale: float = 1.0  # logit-normal timesteps: t = sigmoid(sigmoid_scale * z), z ~ N(0, 1)
    loss: str = "mse"  # mse | huber | smooth_l1, on the error in the model's native target space
    huber_delta: float = 1.0  # huber / smooth_l1: where the loss turns from squared to linear
    min_snr_gamma: float = 0.0  # eps/v models: weight min(SNR, gamma) (Hang et al. 2023); 0 = off
    debiased_estimation: bool = False  # eps/v models: weight 1/sqrt(SNR) of the noise error (Yu et al. 2024)
    # CFG-augmented training (engine/train/cfg_augment.py): the output trained as guided at this scale; 1 = off
    cfg_augment: float = 1.0

    @property
    def snr_weighting(self) -> bool:
        return self.min_snr_gamma > 0 or self.debiased_estimation

    def validate(self) -> None:
        check(0.0 <= self.guidance <= 100.0, f"objective.guidance is {self.guidance}: use 1 (how guidance-distilled "
              "models are usually trained), another value up to 100, or 0 for each item's cached guidance.")
        check(0.0 <= self.base_shift <= 100.0 and 0.0 <= self.max_shift <= 100.0,
              f"objective.base_shift/max_shift are {self.base_shift}/{self.max_shift}: use values in [0, 100] "
              "(Flux's own: 0.5 and 1.15).")
        check(self.resolution_shift or (self.base_shift, self.max_shift) == (0.5, 1.15),
              f"objective.base_shift/max_shift are {self.base_shift}/{self.max_shift} but resolution_shift is off, "
              "so they would do nothing: turn resolution_shift on, or set them back to 0.5 and 1.15.")
        check(0.1 <= self.sigmoid_scale <= 10.0, f"objective.sigmoid_scale is {self.sigmoid_scale}: use a value in "
              "[0.1, 10] (1 = the standard logit-normal; larger spreads the noise levels towards 0 and 1).")
        check(self.loss in LOSSES, f"objective.loss is {self.loss!r}: choose one of {', '.join(LOSSES)}.")
        check(self.huber_delta > 0, f"objective.huber_delta is {self.huber_delta}: use a positive value such as 1.0.")
        check(self.loss != "mse" or self.huber_delta == 1.0,
              f"objective.huber_delta is {self.huber_delta} but loss is 'mse', which has no delta: choose loss "
              "'huber' or 'smooth_l1', or set huber_delta back to 1.0.")
        check(1.0 <= self.cfg_augment <= 30.0, f"objective.cfg_augment is {self.cfg_augment}: use 1 (off) or the "
              "guidance scale the model samples at, such as 4 (at most 30).")
        check(0.0 <= self.min_snr_gamma <= 1000.0, f"objective.min_snr_gamma is {self.min_snr_gamma}: use 0 (off) "
              "or a positive gamma such as 5.")
