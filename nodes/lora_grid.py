"""PipeTrainLoRAGrid: a grid of a run's saved LoRA steps x LoRA strengths, drawn with the graph's own sampler.

Each cell is what a KSampler in the same graph draws with that LoRA file applied at that strength to the
connected MODEL (ComfyUI's LoRA loader and its common_ksampler, same seed for every cell), decoded with
the graph's VAE. Rows are the saved steps (save_every files and the final one, spread evenly when there
are more than max_rows, the last always kept); the step the eval set found best is marked.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..engine import best_step
from ..engine.config.checks import ConfigError
from . import compat
from .plot_draw import grid_image
from .run_plots import _to_image
from .types import RUN

STEP_FILE = re.compile(r"lora_step(\d+)\.safetensors$")


def saved_steps(run) -> list[tuple[int, Path]]:
    """(step, file) of every LoRA the run saved, in step order: its step files and the final one."""
    final = Path(run.lora_path) if run.lora_path else None
    if final is None or not final.is_file():
        raise ConfigError(f"run {run.run_name!r} has no LoRA file (a full fine-tune saves a model, a cancelled run "
                          "before its first save none): the LoRA Grid needs a LoRA run.")
    found = [(int(m.group(1)), p) for p in final.parent.glob("lora_step*.safetensors")
             if (m := STEP_FILE.search(p.name)) and int(m.group(1)) < run.steps]
    return sorted(found) + [(int(run.steps), final)]


def pick_rows(saved: list, max_rows: int) -> list:
    """At most max_rows of `saved`, spread evenly, the last always included."""
    if len(saved) <= max_rows:
        return list(saved)
    picked = [saved[round(i * (len(saved) - 1) / max(1, max_rows - 1))] for i in range(max_rows)]
    picked[-1] = saved[-1]
    return picked


def parse_strengths(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.replace(";", ",").split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"strengths {text!r}: give numbers separated by commas, e.g. '0, 0.5, 1'.") from None
    if not values or len(values) > 16:
        raise ConfigError(f"strengths {text!r}: give 1 to 16 numbers separated by commas, e.g. '0, 0.5, 1'.")
    return values


class PipeTrainLoRAGrid:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("A grid of the run's saved LoRAs (rows: the saved steps) at several strengths (columns), each "
                   "sampled with this graph's model, prompt, sampler and VAE at the same seed. Shows which step and "
                   "strength to keep; the step with the lowest eval loss is marked 'best'.")
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("grid",)
    OUTPUT_TOOLTIPS = ("The grid as an image (connect Preview Image or Save Image).",)
    FUNCTION = "grid"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "run": (RUN, {"tooltip": "The run output of Train Pipeline (use save_every to have several steps)."}),
            "model": ("MODEL", {"tooltip": "The model the LoRAs were trained on, as your sampling graph loads it "
                                           "(with the same LoRA stack when Train Pipeline trained on one)."}),
            "positive": ("CONDITIONING", {"tooltip": "The prompt, as for KSampler."}),
            "negative": ("CONDITIONING", {"tooltip": "The negative prompt, as for KSampler."}),
            "latent_image": ("LATENT", {"tooltip": "The latent to sample (Empty Latent Image: its size is the "
                                                   "cells' size)."}),
            "vae": ("VAE", {"tooltip": "Decodes each cell."}),
            "seed": ("INT", {"default": 0, "min": 0, "max": 0xffffffffffffffff, "control_after_generate": False,
                             "tooltip": "One seed for every cell, so the cells differ only by step and strength."}),
            "steps": ("INT", {"default": 20, "min": 1, "max": 10000, "tooltip": "Sampling steps, as for KSampler."}),
            "cfg": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01,
                              "tooltip": "Classifier-free guidance, as for KSampler."}),
            "sampler_name": (compat.sampler_names(), {"tooltip": "The sampler, as for KSampler."}),
            "scheduler": (compat.scheduler_names(), {"tooltip": "The scheduler, as for KSampler."}),
            "strengths": ("STRING", {"default": "0, 0.5, 1", "tooltip":
                          "LoRA strengths, one column each, separated by commas (0 = the model without the LoRA)."}),
            "max_rows": ("INT", {"default": 4, "min": 1, "max": 32, "tooltip":
                         "At most this many saved steps, spread evenly over the run (the final LoRA always "
                         "included). Cells = rows x strengths samplings."}),
            "cell_size": ("INT", {"default": 256, "min": 32, "max": 2048, "step": 8, "tooltip":
                          "Longest side of each cell in the grid, in pixels."}),
        }}

    def grid(self, run, model, positive, negative, latent_image, vae, seed, steps, cfg, sampler_name, scheduler,
             strengths, max_rows, cell_size):
        import torch
        from PIL import Image

        columns = parse_strengths(strengths)
        rows = pick_rows(saved_steps(run), max_rows)
        best = best_step.best(best_step.read(Path(run.run_dir)))
        grid_rows, cache = [], {}
        for step, path in rows:
            images = []
            for strength in columns:
                key = 0.0 if strength == 0 else (path, strength)  # strength 0: the model alone, drawn once
                if key not in cache:
                    patched = compat.load_lora_onto_model(model, str(path), strength) if strength else model
                    latent = compat.ksample(patched, seed, steps, cfg, sampler_name, scheduler, positive, negative,
                                            latent_image)
                    with torch.inference_mode():
                        decoded = vae.decode(latent["samples"])
                    first = decoded.reshape(-1, *decoded.shape[-3:])[0].clamp(0, 1).cpu().float().numpy()
                    cache[key] = Image.fromarray((first * 255).round().astype("uint8"))
                images.append(cache[key])
            label = step if not (best and best.get("file") == path.name) else f"{step} (best)"
            grid_rows.append((label, images))
        picture = grid_image(grid_rows, [f"strength {s:g}" for s in columns], cell_size)
        shown = f"{len(rows)} saved step(s) x {len(columns)} strength(s) of run {run.run_name}"
        return {"ui": {"text": [shown]}, "result": (_to_image([picture]),)}
