"""Nodes that read a finished (or running) run folder: the loss curve and the sample grid as IMAGEs.

They read only `output/pipetrain/<run>/` (events.jsonl, samples/), so they work after a ComfyUI
restart, for runs trained headless, and next to a TrainPipeline whose RUN output they take.
"""
from __future__ import annotations

from pathlib import Path

from ..engine.config.checks import ConfigError
from ..engine.events import EVENTS_FILE, history, read_events
from ..engine.sample_files import SAMPLES_DIR
from . import compat
from .plot_draw import draw_loss_plot, grid_image
from .runs import runs_root
from .types import RUN

FROM_INPUT = "(the run input)"  # always listed first, so saved graphs that use the run input stay valid


def run_names() -> list[str]:
    """FROM_INPUT, then the runs with an events.jsonl under output/pipetrain/, newest first."""
    try:
        root = runs_root(compat.output_directory())
    except Exception:  # imported outside ComfyUI
        return [FROM_INPUT]
    runs = [p for p in root.iterdir() if (p / EVENTS_FILE).is_file()] if root.is_dir() else []
    runs.sort(key=lambda p: (p / EVENTS_FILE).stat().st_mtime, reverse=True)
    return [FROM_INPUT] + [p.name for p in runs]


def _run_dir(run_name: str, run=None) -> Path:
    if run is not None:
        return Path(run.run_dir)
    root = runs_root(compat.output_directory())
    if run_name == FROM_INPUT or "/" in run_name or "\\" in run_name or run_name.startswith("."):
        raise ConfigError(f"run_name {run_name!r}: pick a run from the list (folders of {root}), or connect a "
                          "TrainPipeline's run output to the run input.")
    path = root / run_name
    if not (path / EVENTS_FILE).is_file():
        raise ConfigError(f"run {run_name!r} has no {EVENTS_FILE} in {root}: pick another run (the list shows runs "
                          "that started training), or refresh the page.")
    return path


def _events_mtime(run_name: str, run=None, **_) -> float:
    try:
        return (_run_dir(run_name, run) / EVENTS_FILE).stat().st_mtime
    except Exception:  # noqa: BLE001 - validation reports it when the node runs
        return float("nan")


def _to_image(pil_images):
    import numpy as np
    import torch

    arrays = [np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in pil_images]
    return torch.from_numpy(np.stack(arrays))


_RUN_NAME_TIP = {"tooltip": "A run folder under output/pipetrain/ (newest first), or '(the run input)' to use "
                            "the connected TrainPipeline's run. Refresh the page to list new runs."}
_RUN_OPTIONAL = {"run": (RUN, {"tooltip": "The run output of TrainPipeline; overrides run_name."})}


class PipeTrainLossPlot:
    CATEGORY = "PipeTrain"
    DESCRIPTION = "Plot a run's loss (raw and smoothed) and learning rate from its events.jsonl, as an image."
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("plot",)
    OUTPUT_TOOLTIPS = ("The loss curve as an image (connect Preview Image or Save Image).",)
    FUNCTION = "plot"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "run_name": (run_names(), dict(_RUN_NAME_TIP)),
                "width": ("INT", {"default": 768, "min": 256, "max": 4096, "step": 8,
                                  "tooltip": "Width of the plot image in pixels."}),
                "height": ("INT", {"default": 432, "min": 160, "max": 4096, "step": 8,
                                   "tooltip": "Height of the plot image in pixels."}),
                "smoothing": ("FLOAT", {"default": 0.9, "min": 0.0, "max": 0.999, "step": 0.01, "tooltip":
                              "Exponential smoothing of the bold curve (TensorBoard-style); 0 = none."}),
            },
            "optional": dict(_RUN_OPTIONAL),
        }

    @classmethod
    def IS_CHANGED(cls, run_name, run=None, **kw):
        return _events_mtime(run_name, run)

    def plot(self, run_name, width, height, smoothing, run=None):
        run_dir = _run_dir(run_name, run)
        h = history(read_events(run_dir))
        if not h["steps"]:
            raise ConfigError(f"run {run_dir.name} has no training steps yet in {run_dir / EVENTS_FILE}: plot it once "
                              "it has trained a step.")
        return (_to_image([draw_loss_plot(h, run_dir.name, width, height, smoothing)]),)


class PipeTrainSampleGrid:
    CATEGORY = "PipeTrain"
    DESCRIPTION = ("A grid of the samples rendered during a run: one row per sampling step, one column per prompt. "
                   "Reads the PNGs in the run's samples/ folder, or decodes the saved latents with the VAE.")
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("grid",)
    OUTPUT_TOOLTIPS = ("The sample grid as an image (connect Preview Image or Save Image).",)
    FUNCTION = "grid"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "run_name": (run_names(), dict(_RUN_NAME_TIP)),
                "max_rows": ("INT", {"default": 8, "min": 1, "max": 64, "tooltip":
                             "At most this many sampling steps, spread evenly over the run (the last always "
                             "included)."}),
                "cell_size": ("INT", {"default": 256, "min": 32, "max": 2048, "step": 8, "tooltip":
                              "Longest side of each image in the grid, in pixels."}),
            },
            "optional": {
                **_RUN_OPTIONAL,
                "vae": ("VAE", {"tooltip": "Decodes samples that were saved only as latents (runs trained headless, "
                                           "without the node). Not needed for runs trained from the canvas."}),
            },
        }

    @classmethod
    def IS_CHANGED(cls, run_name, run=None, **kw):
        return _events_mtime(run_name, run)

    def grid(self, run_name, max_rows, cell_size, run=None, vae=None):
        run_dir = _run_dir(run_name, run)
        samples = history(read_events(run_dir))["samples"]
        if not samples:
            raise ConfigError(f"run {run_dir.name} has no samples: give TrainPipeline sample_prompts (and a CLIP and "
                              "VAE) to render samples while training.")
        rows = [samples[round(i * (len(samples) - 1) / max(1, max_rows - 1))] for i in range(min(max_rows, len(samples)))]
        if len(samples) > 1 and rows[-1] is not samples[-1]:
            rows[-1] = samples[-1]
        grid_rows = [(s["step"], self._images(run_dir, s, vae)) for s in rows]
        prompts = rows[-1]["prompts"]
        return (_to_image([grid_image(grid_rows, prompts, cell_size)]),)

    @staticmethod
    def _images(run_dir: Path, sample: dict, vae):
        from PIL import Image

        step = sample["step"]
        n = max(1, len(sample["prompts"]))
        pngs = [run_dir / SAMPLES_DIR / f"step{step:06d}_p{i}.png" for i in range(n)]
        if all(p.is_file() for p in pngs):
            return [Image.open(p).convert("RGB") for p in pngs]
        latent_file = Path(sample["path"])
        if not latent_file.is_file():
            latent_file = run_dir / SAMPLES_DIR / latent_file.name  # the run folder was moved
        if vae is None or not latent_file.is_file():
            raise ConfigError(f"the samples of step {step} of run {run_dir.name} were not decoded ({pngs[0].name} is "
                              f"missing): connect the run's VAE to this node to decode {latent_file.name}.")
        import numpy as np
        import torch

        from ..engine.sample_files import read_samples

        latents, _ = read_samples(latent_file)
        with torch.inference_mode():
            images = vae.decode(latents)
        images = images.reshape(-1, *images.shape[-3:])
        return [Image.fromarray((im.clamp(0, 1).cpu().float().numpy() * 255).round().astype(np.uint8)) for im in images]
