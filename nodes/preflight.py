"""Checks before any training process starts: the GPUs asked for, and the picked model file against
the cache, the LoRA and the sample size.

ComfyUI's own model detection runs on the file's header alone: every tensor becomes an empty
"meta" tensor of the stored shape and dtype, so a 20 GB file is checked in milliseconds without
reading a weight. What it finds decides what the ranks would otherwise find out only after loading
the model (minutes for a large one): whether ComfyUI can train the file at all (a VAE or text
encoder picked as the model), whether the cache's latents and text conditioning have the channels
and width this model family takes, whether the LoRA rank and target_regex fit its layers. Anything
the header cannot decide (a .ckpt, a layout detection converts) is left to the engine, which
checks again on the loaded model.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.cache.first_frame import DEFAULT_STYLE, style_mismatch
from ..engine.config.checks import ConfigError
from ..engine.config.launch import LaunchSpec
from ..engine.latent_fit import accepted_channels, wanted_latents
from . import compat

_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
           "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


@dataclass(frozen=True)
class Detected:
    family: str  # ComfyUI's supported-model class name, e.g. "SDXL", "Flux", "WAN21_T2V"
    latent_channels: int
    downscale: int = 8  # image pixels per latent pixel (the VAE's spatial ratio)
    context_width: int = 0  # width of the text conditioning (cross_attn) it takes; 0 = not known here
    no_shift: bool = False  # an SD-style UNet (eps/v prediction): its noise schedule has no shift
    # Module name -> min(out, in) of every 2-D weight, as the model names its modules; empty when the
    # file's layout is converted on load (diffusers files): names then are not the model's.
    widths: dict = field(default_factory=dict)
    latent_format: object = field(default=None, compare=False)  # ComfyUI's LatentFormat instance
    in_channels: int = 0  # the model's input channels as detection read them (latents + concat); 0 = not known
    guidance_input: bool = False  # embeds a guidance value (guidance-distilled: detection's guidance_embed)


class NotADiffusionModel(Exception):
    """ComfyUI's detection recognises no diffusion model in the file (its hint, if any, is the message)."""


def _meta_state_dict(path: str) -> tuple[dict, dict]:
    import torch
    from safetensors import safe_open

    sd = {}
    with safe_open(path, framework="pt", device="cpu") as f:
        metadata = dict(f.metadata() or {})
        for key in f.keys():
            view = f.get_slice(key)
            dtype = getattr(torch, _DTYPES.get(view.get_dtype(), "float32"))
            sd[key] = torch.empty(view.get_shape(), dtype=dtype, device="meta")
    return sd, metadata


def model_config(sd: dict, metadata: dict | None = None) -> tuple:
    """(config, unet state dict, native) as ComfyUI's loader detects a diffusion-model state dict (meta
    tensors do): its supported_models config or None, the state dict without the model's key prefix,
    and whether it was read in its own layout (False: a diffusers layout converted for detection)."""
    import comfy.model_detection as md
    import comfy.utils

    prefix = md.unet_prefix_from_state_dict(sd)
    unet = comfy.utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True) or sd
    config = md.model_config_from_unet(unet, "", metadata=metadata)
    if config is not None:
        return config, unet, True
    converted = md.convert_diffusers_mmdit(unet, "")
    config = (md.model_config_from_unet(converted, "") if converted is not None
              else md.model_config_from_diffusers_unet(unet))
    return config, unet, False


def detect(path: str) -> Detected | None:
    """ComfyUI's detection (the steps of comfy.sd.load_diffusion_model) on the header; None = not decidable
    here. Raises NotADiffusionModel when ComfyUI would refuse the file."""
    if not path.lower().endswith(".safetensors"):
        return None
    try:
        import comfy.sd

        sd, metadata = _meta_state_dict(path)
        config, unet, native = model_config(sd, metadata)
        if config is None:
            hint = getattr(comfy.sd, "model_detection_error_hint", None)  # ComfyUI's own hint, where it has one
            detail = hint(path, sd) if hint is not None else ""
            raise NotADiffusionModel(str(detail or "").strip())
        widths = _widths(config.process_unet_state_dict(dict(unet))) if native else {}
        fmt = config.latent_format
        unet_config = config.unet_config
        return Detected(type(config).__name__, int(fmt.latent_channels), int(getattr(fmt, "spacial_downscale_ratio", 8)),
                        _context_width(unet_config), _no_shift(unet_config), widths,
                        fmt() if isinstance(fmt, type) else fmt,
                        int(unet_config.get("in_dim") or unet_config.get("in_channels") or 0),
                        bool(unet_config.get("guidance_embed", False)))
    except NotADiffusionModel:
        raise
    except Exception as e:  # noqa: BLE001 - a header this check cannot read is the engine's to judge
        compat.log.debug("[PipeTrain] header check of %s skipped: %r", path, e)
        return None


def _context_width(unet_config: dict) -> int:
    """The cross_attn width detection read from the file, for the families whose text conditioning
    reaches the model unchanged (UNets: context_dim; Flux, Flux.2, HunyuanVideo: context_in_dim)."""
    if "model_channels" in unet_config and "image_model" not in unet_config:  # SD-style UNets
        return int(unet_config.get("context_dim") or 0)
    if unet_config.get("image_model") in ("flux", "flux2", "hunyuan_video"):
        return int(unet_config.get("context_in_dim") or 0)
    return 0


def _no_shift(unet_config: dict) -> bool:
    """SD1.x/2.x/SDXL/SVD-style UNets train eps or v targets on a discrete or EDM schedule, none with a
    shift (Stable Cascade, also a UNet, has one)."""
    return ("model_channels" in unet_config and "image_model" not in unet_config
            and "stable_cascade_stage" not in unet_config)


def _widths(sd: dict) -> dict:
    return {k[: -len(".weight")]: min(v.shape) for k, v in sd.items() if k.endswith(".weight") and v.dim() == 2}


def _cache_identity(cache_dir: str) -> dict:
    """The encoders and caching options the cache was made with (the manifest's "encoders"), or {}."""
    try:
        identity = json.loads(Path(cache_dir, "manifest.json").read_text(encoding="utf-8"))["encoders"]
    except Exception:  # noqa: BLE001 - the engine reports an unreadable cache itself
        return {}
    return identity if isinstance(identity, dict) else {}


def _cache_encoder(cache_dir: str, which: str) -> str:
    """The class of the VAE or CLIP the cache was encoded with (manifest's encoder identity), or ""."""
    try:
        return str(_cache_identity(cache_dir)[which]["class"])
    except Exception:  # noqa: BLE001 - only for the message
        return ""


def _cache_first_frame(cache) -> str:
    """The first-frame style a video cache stores (engine/cache/first_frame.py), "" for none or an image cache."""
    identity = _cache_identity(cache.cache_dir) if len(tuple(cache.latent_shape)) == 4 else {}
    if not identity.get("first_frame_conditioning"):
        return ""
    return str(identity.get("first_frame_style", DEFAULT_STYLE))


def _cache_text_width(cache_dir: str) -> int:
    """The width of the first cached item's text conditioning; 0 when it cannot be read here."""
    try:
        from ..engine.cache.reader import CachedDataset

        return int(CachedDataset(cache_dir)[0]["cross_attn"].shape[-1])
    except Exception:  # noqa: BLE001 - the engine reports an unreadable cache itself
        return 0


def check_model(model_name: str, model_path: str, lora, caches: dict, timestep_shift: float = 0.0,
                objective=None) -> Detected | None:
    """ConfigError when ComfyUI cannot train the file as a diffusion model, when a cache's latents do
    not fit the model (caches: input name -> PIPETRAIN_CACHE), or when the LoRA or objective settings
    cannot fit it."""
    try:
        found = detect(model_path)
    except NotADiffusionModel as e:
        hint = f" ComfyUI's hint: {e}" if str(e) else ""
        raise ConfigError(f"model_name {model_name!r}: ComfyUI does not recognise this file as a diffusion model "
                          "(its Load Diffusion Model node says 'Could not detect model type'; a VAE, text encoder "
                          "or LoRA file picked as the model looks like this). Pick the diffusion model or "
                          f"checkpoint the dataset was cached for.{hint}") from None
    if found is None:
        return None
    for input_name, cache in caches.items():
        if cache is None:
            continue
        shape = tuple(cache.latent_shape)
        channels = int(shape[0])
        if channels not in accepted_channels(found.latent_format, shape):
            vae = _cache_encoder(cache.cache_dir, "vae")
            made_with = f" made with the VAE {vae}" if vae else ""
            wanted = wanted_latents(found.latent_format, shape)
            raise ConfigError(
                f"{input_name} holds {channels}-channel latents{made_with}, but model_name {model_name!r} is a "
                f"{found.family} model (ComfyUI's detection) that trains on {wanted}: "
                f"cache the dataset with the {found.family} model's own VAE (connect it to Cache Latents), or pick "
                "the model the cache was made for.")
        style = _cache_first_frame(cache)
        mismatch = style_mismatch(style, found.family, found.in_channels, found.latent_channels) if style else None
        if mismatch:
            raise ConfigError(f"{input_name} holds first-frame conditioning ({style}) that model_name {model_name!r} "
                              f"cannot use: {mismatch}")
        width = _cache_text_width(cache.cache_dir) if found.context_width else 0
        if width and width != found.context_width:
            clip = _cache_encoder(cache.cache_dir, "clip")
            made_with = f" (made with the text encoder {clip})" if clip else ""
            raise ConfigError(
                f"{input_name} holds {width}-wide text conditioning{made_with}, but model_name {model_name!r} is a "
                f"{found.family} model that takes {found.context_width}-wide text conditioning: cache the dataset "
                f"with the {found.family} model's own text encoder (the CLIP connected to Cache Latents), or pick the "
                "model the cache was made for.")
    if timestep_shift > 0 and found.no_shift:
        raise ConfigError(f"timestep_shift is {timestep_shift:g} but model_name {model_name!r} is a {found.family} "
                          "model (eps/v prediction): its noise schedule has no shift, only flow models (SD3, Flux, "
                          "Wan, ...) have one. Set timestep_shift to 0.")
    if objective is not None:
        _check_objective(found, objective, model_name)
    _check_lora(found, lora, model_name)
    return found


def _check_objective(found: Detected, objective, model_name: str) -> None:
    """What the header tells of engine/train/objective_checks.py's rules (the engine checks them all again
    on the loaded model, e.g. which flow schedules are Flux-style)."""
    if objective.guidance not in (0.0, 1.0) and not found.guidance_input:
        raise ConfigError(f"objective guidance is {objective.guidance:g} but model_name {model_name!r} is a "
                          f"{found.family} model without a guidance input (not guidance-distilled), so it would do "
                          "nothing: set guidance to 1 in Objective Options.")
    if objective.snr_weighting and not found.no_shift:
        raise ConfigError(f"min_snr_gamma / debiased_estimation weight the loss of eps/v-prediction models (SD1.x, "
                          f"SD2, SDXL), but model_name {model_name!r} is a {found.family} model (not an SD-style "
                          "UNet): set min_snr_gamma to 0 and debiased_estimation off in Objective Options.")
    if objective.resolution_shift and found.no_shift:
        raise ConfigError(f"resolution_shift needs a Flux-style schedule (Flux, Flux 2, Chroma, Qwen-Image), but "
                          f"model_name {model_name!r} is a {found.family} model (eps/v prediction, no shift): turn "
                          "resolution_shift off in Objective Options.")


def _check_lora(found: Detected, lora, model_name: str) -> None:
    if not found.widths:
        return
    # A full fine-tune's all_linear regex filters parameter names, norms too: the engine checks that one.
    if lora.target_regex and not (lora.kind == "full" and lora.targets == "all_linear"):
        regex = re.compile(lora.target_regex)
        if not any(regex.search(name) for name in found.widths):
            raise ConfigError(f"lora target_regex {lora.target_regex!r} matches no layer name of {model_name!r} "
                              f"(e.g. {_examples(found.widths)}): loosen the regex, or clear it to train every "
                              "layer of the targets preset.")
    widest = max(_block_widths(found.widths).values(), default=0)
    if widest and lora.rank > widest and lora.kind != "full":  # a full fine-tune has no rank
        raise ConfigError(f"lora rank {lora.rank} is larger than any layer of {model_name!r} is wide (at most "
                          f"{widest}): a rank above a layer's width adds no capacity, only size. Use a rank of "
                          f"{widest} or less (16-64 is typical).")


def _block_widths(widths: dict) -> dict:
    """The layers inside block lists (what a LoRA targets; engine/memory/blocks.py finds them on the module tree):
    top-level lists with an entry of 2+ linear layers. All layers when no name looks like that."""
    per_entry: dict = {}
    for name in widths:
        parts = name.split(".")
        if len(parts) > 2 and parts[1].isdigit():
            per_entry[(parts[0], parts[1])] = per_entry.get((parts[0], parts[1]), 0) + 1
    roots = {root for (root, _), count in per_entry.items() if count >= 2}
    return {n: w for n, w in widths.items() if n.split(".")[0] in roots} or widths


def check_cache_opens(cache_dir: str) -> None:
    """The training cache opens as the ranks will open it (engine/cache/reader.py): a cache set to
    caption_dropout without the empty caption's encoding, say, is refused here, before any rank starts."""
    from ..engine.cache.format import CacheError
    from ..engine.cache.reader import CachedDataset

    try:
        CachedDataset(cache_dir)
    except CacheError as e:
        raise ConfigError(str(e)) from None


def check_batch(batch_size: int, cache) -> None:
    """More images per batch than one pass over the dataset (items x repeats) has would repeat images
    inside every batch."""
    if batch_size <= int(cache.count):
        return
    try:
        from ..engine.cache.reader import CachedDataset

        dataset = CachedDataset(cache.cache_dir)
        per_epoch = sum(dataset.repeats(i) for i in range(len(dataset)))
    except Exception:  # noqa: BLE001 - the engine reports an unreadable cache itself
        return
    if batch_size > per_epoch:
        raise ConfigError(f"batch_size is {batch_size} but one pass over the cache has {per_epoch} images "
                          f"({cache.count} items with their repeats), so every batch would hold the same images "
                          f"several times: use batch_size {per_epoch} or less (grad_accum raises the effective "
                          "batch without that), or add images or repeats.")


def check_sample_size(samples, found: Detected | None, model_name: str) -> None:
    """Sample images must be a multiple of the model's VAE ratio (16 for some video/Flux.2 VAEs)."""
    ratio = found.downscale if found is not None else 8
    if samples is not None and (samples.width % ratio or samples.height % ratio):
        fit = f"{samples.width // ratio * ratio or ratio}x{samples.height // ratio * ratio or ratio}"
        raise ConfigError(f"sample_width x sample_height {samples.width}x{samples.height}: {model_name!r} makes "
                          f"images in steps of {ratio} pixels, the rest would be cut off: use e.g. {fit}.")


def _examples(names) -> str:
    picked = [n for n in names if "." in n][:: max(1, len(names) // 3)][:3]
    return ", ".join(repr(n) for n in picked)


def check_devices(launch: LaunchSpec) -> bool:
    """Whether the ranks get CUDA GPUs; a ConfigError for GPUs this machine does not have."""
    cuda = compat.cuda_available()
    if not cuda:
        if launch.gpu_ids:
            raise ConfigError(f"gpu_ids is {launch.gpu_ids!r} but this ComfyUI runs without a CUDA GPU (training "
                              "runs as CPU processes, where GPU numbers mean nothing): clear gpu_ids, or start "
                              "ComfyUI where it sees the GPUs.")
        cores = os.cpu_count() or 1
        if launch.num_gpus > max(2, cores):
            raise ConfigError(f"num_gpus is {launch.num_gpus} but this ComfyUI runs without a CUDA GPU, so each "
                              f"would be a CPU process, on {cores} CPU core(s): use num_gpus {max(2, cores)} or less "
                              "(1 is fastest on a small machine), or start ComfyUI where it sees the GPUs.")
        return False
    import torch

    visible = torch.cuda.device_count()
    bad = [i for i in launch.device_ids() if i >= visible]
    if bad:
        what = f"gpu_ids {launch.gpu_ids!r}" if launch.gpu_ids else f"num_gpus {launch.num_gpus}"
        raise ConfigError(f"{what} asks for GPU(s) {bad} but this machine shows {visible} GPU(s) (numbered 0 to "
                          f"{visible - 1}): lower num_gpus or fix gpu_ids.")
    return True


def part_inputs(cache) -> dict:
    """The training caches check_model checks, by the name its messages use: 'cache', then with chained
    datasets (LoadDataset's add_to) 'cache (dataset 2)' and on."""
    return {("cache" if n == 1 else f"cache (dataset {n})"): part for n, part in enumerate(cache.parts, start=1)}


def check_batch_sizes(cache, batch_size: int, pipeline_stages: int) -> None:
    """LoadDataset's batch_sizes (kept in each cache's manifest) that differ from batch_size need a data-parallel
    run: refused before launch as each rank would (engine/train/sample_order.py)."""
    from ..engine.data.batch_sizes import check_varied_batches

    for part in cache.parts:
        try:
            dataset = json.loads(Path(part.cache_dir, "manifest.json").read_text(encoding="utf-8")).get("dataset") or {}
        except (OSError, ValueError, AttributeError):
            continue  # the engine reports an unreadable cache itself
        check_varied_batches(any(b != batch_size for _, b in dataset.get("batch_sizes", [])), pipeline_stages)
