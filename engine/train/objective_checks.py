"""What the loaded model allows of the objective settings (engine/config/objective.py), each refused with
the fix before training starts: the node checks the same on the file's header (nodes/preflight.py) where
it can, the engine here on the model itself.
"""
from __future__ import annotations

from torch import nn

from ..config.checks import ConfigError
from ..config.objective import ObjectiveSpec


def takes_guidance(model: nn.Module) -> bool:
    """Whether the diffusion model embeds a guidance value (guidance-distilled: Flux.1 dev/Kontext, Flux 2 Dev,
    HunyuanVideo, HunyuanImage 2.1 distilled: their `guidance_embed`). Chroma's approximator also reads a
    guidance, but Chroma is not guidance-distilled (ComfyUI feeds it 0): it keeps its conditioning's."""
    params = getattr(model.diffusion_model, "params", None)
    return bool(getattr(params, "guidance_embed", False))


def flux_style(model_sampling) -> bool:
    """A schedule with Flux's exponent mu (ComfyUI's ModelSamplingFlux: Flux, Flux 2, Chroma, Qwen-Image)."""
    import comfy.model_sampling

    return isinstance(model_sampling, comfy.model_sampling.ModelSamplingFlux)


def snr_prediction(model_sampling) -> str | None:
    """'eps' or 'v' for the SD-style prediction types min-SNR and debiased estimation are defined for;
    None for flow, EDM, x0 and the rest."""
    import comfy.model_sampling as ms

    if isinstance(model_sampling, (ms.CONST, ms.X0, ms.EDM)) or not isinstance(model_sampling, ms.EPS):
        return None
    return "v" if isinstance(model_sampling, ms.V_PREDICTION) else "eps"


def schedule_name(model_sampling) -> str:
    """ComfyUI's classes the model's sampling is made of ("ModelSamplingFlux + CONST"), for messages."""
    return " + ".join(c.__name__ for c in type(model_sampling).__bases__) or type(model_sampling).__name__


def patch_size(model: nn.Module) -> int:
    """The diffusion model's patch edge in latent cells (Flux, Qwen-Image 2; Flux 2 1)."""
    patch = getattr(model.diffusion_model, "patch_size", 1)
    return int(patch[-1] if isinstance(patch, (tuple, list)) else patch)


def check_objective(model: nn.Module, spec: ObjectiveSpec) -> None:
    """ConfigError (what to change) for an objective setting this model cannot use."""
    name = type(model).__name__
    if spec.guidance not in (0.0, 1.0) and not takes_guidance(model):
        raise ConfigError(f"objective.guidance is {spec.guidance:g} but {name} has no guidance input (it is not "
                          "guidance-distilled), so it would do nothing: set guidance to 1 (the default).")
    if spec.resolution_shift and not flux_style(model.model_sampling):
        raise ConfigError(f"objective.resolution_shift needs a Flux-style schedule (Flux, Flux 2, Chroma, "
                          f"Qwen-Image), but {name}'s is {schedule_name(model.model_sampling)}: turn "
                          "resolution_shift off (timestep_shift sets a flow model's one shift).")
    if spec.snr_weighting and snr_prediction(model.model_sampling) is None:
        what = " and ".join(n for n, on in (("min_snr_gamma", spec.min_snr_gamma > 0),
                                            ("debiased_estimation", spec.debiased_estimation)) if on)
        raise ConfigError(f"objective.{what} weight(s) the loss by the signal-to-noise ratio of eps/v-prediction "
                          f"models (SD1.x, SD2, SDXL), but {name} samples with "
                          f"{schedule_name(model.model_sampling)} (a flow or other model): set "
                          "min_snr_gamma to 0 and debiased_estimation off (flow models: shape the noise levels "
                          "with timestep_sampling / timestep_shift instead).")
