"""PipeTrainObjectiveOptions: what the training loss is made of (run.json's `objective`). Unconnected, the
defaults apply (a resumed run keeps the settings it was trained with)."""
from __future__ import annotations

from ..engine.config.choices import LOSSES
from ..engine.config.objective import ObjectiveSpec
from .types import OBJECTIVE


class PipeTrainObjectiveOptions:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("Objective settings: the guidance a guidance-distilled model trains at, Flux's "
                   "resolution-dependent shift, the logit-normal scale, the loss (mse, huber, smooth_l1), "
                   "min-SNR / debiased weighting for SD1.5/SDXL and CFG-augmented training. Connect it to Train Pipeline's objective input.")
    RETURN_TYPES = (OBJECTIVE,)
    RETURN_NAMES = ("objective",)
    FUNCTION = "configure"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "guidance": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 100.0, "step": 0.1, "tooltip":
                    "Guidance-distilled models only (Flux.1 dev/Kontext, Flux 2 Dev, HunyuanVideo, HunyuanImage "
                    "2.1 distilled): the guidance value every training item gets, replacing one cached with the "
                    "dataset (Kontext's 2.5). 1 = how kohya, ai-toolkit and diffusion-pipe train them. 0 = each "
                    "item's cached guidance, else ComfyUI's default (3.5 for Flux), as runs before this setting "
                    "did. Other models: leave it at 1."}),
                "resolution_shift": ("BOOLEAN", {"default": False, "tooltip":
                    "Flux-style schedules only (Flux, Flux 2, Chroma, Qwen-Image): compute the shift (Flux's "
                    "exponent mu) of each image from its size, as ComfyUI's ModelSamplingFlux node does: "
                    "mu = base_shift + (max_shift - base_shift) x (tokens - 256) / 3840, tokens = width x height "
                    "/ 256. Larger images train at noisier levels. Needs timestep_shift 0."}),
                "base_shift": ("FLOAT", {"default": 0.5, "min": 0.0, "max": 100.0, "step": 0.01, "tooltip":
                    "With resolution_shift: mu at 256 image tokens (a 256x256 image). Flux's own: 0.5."}),
                "max_shift": ("FLOAT", {"default": 1.15, "min": 0.0, "max": 100.0, "step": 0.01, "tooltip":
                    "With resolution_shift: mu at 4096 image tokens (a 1024x1024 image). Flux's own: 1.15 (Flux 2 "
                    "samples at 2.02 there)."}),
                "sigmoid_scale": ("FLOAT", {"default": 1.0, "min": 0.1, "max": 10.0, "step": 0.1, "tooltip":
                    "With timestep_sampling logit_normal: noise levels t = sigmoid(sigmoid_scale x z), z from a "
                    "standard normal. 1 = the standard logit-normal (SD3); above 1 spreads them towards clean "
                    "and pure noise, below 1 gathers them in the middle."}),
                "loss": (list(LOSSES), {"default": "mse", "tooltip":
                    "The loss on the error in the model's own target space (noise, v or flow velocity). mse: "
                    "squared error. huber: half the squared error below huber_delta, linear above it (large "
                    "errors pull less). smooth_l1: huber divided by huber_delta."}),
                "huber_delta": ("FLOAT", {"default": 1.0, "min": 0.001, "max": 100.0, "step": 0.01, "tooltip":
                    "huber / smooth_l1: the error size where the loss turns from squared to linear. Leave at 1 "
                    "with mse."}),
                "min_snr_gamma": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 1000.0, "step": 0.5, "tooltip":
                    "eps / v-prediction models only (SD1.5, SD2, SDXL): min-SNR weighting, each sample's loss "
                    "times min(SNR, gamma) / SNR (v: / (SNR + 1)), SNR = 1 / sigma^2: less weight on the nearly "
                    "clean levels. 5 is the usual gamma; 0 = off. Refused for flow models."}),
                "debiased_estimation": ("BOOLEAN", {"default": False, "tooltip":
                    "eps / v-prediction models only (SD1.5, SD2, SDXL): weight each sample's noise-error loss by "
                    "1 / sqrt(SNR) (v-prediction: sqrt(SNR) / (SNR + 1), the same weighting in v's space). "
                    "Combines with min_snr_gamma by multiplying. Refused for flow models."}),
            },
            "optional": {  # new inputs go last: saved workflows store widget values by position
                "cfg_augment": ("FLOAT", {"default": 1.0, "min": 1.0, "max": 30.0, "step": 0.5, "tooltip":
                    "CFG-augmented training (diffusion-pipe's MiniMax H3 `cfg`): each sample also runs, without "
                    "gradient, on the empty caption, and the output trains as if guidance at this scale were "
                    "applied, so a model sampled with CFG keeps its guidance. Use the scale you sample at (4 for "
                    "MiniMax H3). 1 = off. Costs one more forward per sample; needs LoadDataset's "
                    "caption_dropout above 0 (the cache then holds the empty caption) and pipeline_stages 1."}),
            },
        }

    def configure(self, guidance, resolution_shift, base_shift, max_shift, sigmoid_scale, loss, huber_delta,
                  min_snr_gamma, debiased_estimation, cfg_augment=1.0):
        spec = ObjectiveSpec(guidance=float(guidance), resolution_shift=bool(resolution_shift),
                             base_shift=float(base_shift), max_shift=float(max_shift),
                             sigmoid_scale=float(sigmoid_scale), loss=loss, huber_delta=float(huber_delta),
                             min_snr_gamma=float(min_snr_gamma), debiased_estimation=bool(debiased_estimation),
                             cfg_augment=float(cfg_augment))
        spec.validate()
        return (spec,)
