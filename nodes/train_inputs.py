"""Groups of TrainPipeline's and Train Options' inputs (samples, eval set, noise range, EMA, launch), in
the order the nodes list them. Saved UI workflows store widget values by position: a new input goes at the
end of its node (web/pipetrain.js converts workflows saved before the settings moved to Train Options)."""
from __future__ import annotations

from ..engine.config.choices import BACKENDS, TIMESTEP_SAMPLING
from . import compat
from .types import CACHE


def sample_link_inputs() -> dict:
    """TrainPipeline's sample inputs: the graph's encoders and the prompts (samples are off until a line)."""
    inputs = sample_inputs()
    return {name: inputs[name] for name in ("clip", "vae", "sample_prompts")}


def sample_setting_inputs() -> dict:
    """Train Options' sample settings: everything about the samples but the encoders and the prompts."""
    return {name: spec for name, spec in sample_inputs().items() if name not in sample_link_inputs()}


def sample_inputs() -> dict:
    """Optional inputs for samples during training (all off until sample_prompts has a line)."""
    return {
        "clip": ("CLIP", {"tooltip": "The graph's text encoder (the one given to CacheLatents); it encodes the "
                                     "sample prompts before training starts. Needed only for samples."}),
        "vae": ("VAE", {"tooltip": "The graph's VAE; it decodes the samples into images while training runs. "
                                   "Needed only for samples."}),
        "sample_prompts": ("STRING", {"default": "", "multiline": True, "tooltip":
                           "Prompts to sample while training, one per line (empty = no samples). Each is rendered "
                           "with the current LoRA every sample_every steps (Train Options) and at the end; the newest show on "
                           "this node, all of them are kept in the run folder (samples/) and TensorBoard."}),
        "sample_negative": ("STRING", {"default": "", "tooltip": "Negative prompt for the samples (used when "
                                                                 "sample_cfg > 1)."}),
        "sample_every": ("INT", {"default": 100, "min": 1, "max": 10_000_000, "tooltip":
                         "Render the sample prompts every N training steps (and after the last step). Sampling "
                         "pauses training on all GPUs while it runs."}),
        "sample_width": ("INT", {"default": 512, "min": 16, "max": 8192, "step": 8, "tooltip":
                         "Width of the sample images in pixels."}),
        "sample_height": ("INT", {"default": 512, "min": 16, "max": 8192, "step": 8, "tooltip":
                          "Height of the sample images in pixels."}),
        "sample_steps": ("INT", {"default": 20, "min": 1, "max": 1000, "tooltip":
                         "Sampler steps per sample image."}),
        "sample_cfg": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01, "tooltip":
                       "Classifier-free guidance for the samples: 1 = none (fastest; right for Flux-style "
                       "distilled models); SD1.5/SDXL usually 5-7."}),
        "sample_seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1, "control_after_generate": False,
                                "tooltip": "Noise seed of the samples; the same for every sampling, so the "
                                           "images show what the LoRA changed."}),
        "sample_sampler": (compat.sampler_names(), {"default": "euler", "tooltip":
                           "ComfyUI sampler used for the samples (as in KSampler)."}),
        "sample_scheduler": (compat.scheduler_names(), {"default": "simple", "tooltip":
                             "ComfyUI scheduler used for the samples (as in KSampler)."}),
    }


def eval_inputs() -> dict:
    """The held-out eval set's inputs (off until eval_cache is connected; eval_cache is TrainPipeline's,
    the others Train Options')."""
    return {
        "eval_cache": (CACHE, {"tooltip": "A held-out eval set: a second Cache Latents output (its own images, "
                               "same VAE and CLIP). Its loss is measured with fixed noise at 5 fixed noise levels "
                               "(quantiles 0.1-0.9 of this run's timestep distribution), comparable between runs; "
                               "training is unchanged by it. Unconnected = no eval."}),
        "eval_every": ("INT", {"default": 100, "min": 0, "max": 10_000_000, "tooltip":
                       "Measure the eval loss every N training steps and after the last step (0 = only before "
                       "the start, if eval_before_start). Needs eval_cache."}),
        "eval_before_start": ("BOOLEAN", {"default": True, "tooltip":
                              "Also measure the eval loss before the first step (the model without the new "
                              "LoRA's training), the baseline the later evals compare with. Needs eval_cache."}),
    }


def noise_range_inputs() -> dict:
    """Optional inputs bounding the noise levels trained (Wan 2.2 A14B experts)."""
    return {
        "min_t": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.005, "round": 0.0001, "tooltip":
                  "Lowest noise level trained, 0-1 (for flow models the sigma, 1 = pure noise). Wan 2.2 A14B "
                  "high-noise expert: min_t 0.875 (0.9 for the I2V expert), max_t 1. 0 = from clean."}),
        "max_t": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.005, "round": 0.0001, "tooltip":
                  "Highest noise level trained, 0-1, above min_t. Wan 2.2 A14B low-noise expert: min_t 0, "
                  "max_t 0.875 (0.9 for the I2V expert). 1 = up to pure noise."}),
    }


def ema_inputs() -> dict:
    """Train Options' inputs for the EMA of the LoRA weights (off at ema_decay 0)."""
    return {
        "ema_decay": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 0.99999, "step": 0.0001, "round": False,
                      "tooltip": "Also keep an exponential moving average (EMA) of the LoRA weights and save it beside "
                      "each LoRA as <name>_ema.safetensors (Save LoRA's weights input picks it): after each step "
                      "ema = decay x ema + (1 - decay) x weights, an average over about 1 / (1 - decay) steps, "
                      "often smoother than the last weights. 0 = off; 0.999 for runs of thousands of steps, "
                      "0.99 for a few hundred. Training itself is unchanged. A full fine-tune (adapter 'full') "
                      "keeps the average of its trained weights in CPU memory (4 bytes each) and saves it beside "
                      "each model file; Save Model's weights input picks it."}),
        "ema_start_step": ("INT", {"default": 0, "min": 0, "max": 10_000_000, "tooltip":
                           "With ema_decay: the step from which the EMA averages; up to it the EMA copy equals the "
                           "weights, so the average leaves out the first, fast-changing steps. 0 = from the start "
                           "(the untrained LoRA included)."}),
    }


def launch_inputs() -> dict:
    """Train Options' process and noise-level settings (the first of its inputs)."""
    return {
        "gpu_ids": ("STRING", {"default": "", "tooltip":
                    "Which GPUs to use, e.g. '0,1' (must list Train Pipeline's num_gpus GPUs). Empty = the first "
                    "num_gpus."}),
        "backend": (["auto", *BACKENDS], {"default": "auto", "tooltip":
                    "auto = DeepSpeed when it is installed, else one plain PyTorch process (1 GPU; e.g. "
                    "Windows). plain works without DeepSpeed but only on one GPU."}),
        "timestep_sampling": (list(TIMESTEP_SAMPLING), {"default": "uniform", "tooltip":
                              "How noise levels are drawn: uniform, or logit-normal (favours the middle; "
                              "common for flow models such as SD3/Flux)."}),
        "timestep_shift": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100.0, "step": 0.1, "tooltip":
                           "Flow models only: shift the noise levels trained on (higher = noisier). SD3, "
                           "AuraFlow, Wan, HunyuanVideo: sigma = shift*t / (1 + (shift-1)*t) (3 is SD3's "
                           "own, 8 Wan's). Flux-style schedules (Flux, Flux 2, Chroma, Qwen-Image): the "
                           "exponent mu of sigma = e^mu / (e^mu + 1/t - 1), so there 3 is far noisier "
                           "(median sigma 0.953, SD3's 3 gives 0.75); Flux's own is 1.15, Flux 2's 2.02. "
                           "0 = the model's own shift, as ComfyUI samples."}),
        **noise_range_inputs(),
    }


def resume_inputs() -> dict:
    """Train Options' resume setting."""
    return {
        "accept_changes": ("BOOLEAN", {"default": False, "tooltip":
                           "Resume only: continue even though settings changed that make the run differ "
                           "from an uninterrupted one (learning rate, LoRA alpha or dropout, dataset ...). "
                           "Off = such a resume is refused with the list of changes. Every start's settings "
                           "are kept in the run folder (config_history/)."}),
    }
