"""Sample prompts in, sample images out: TrainPipeline's side of samples during training.

Before launch the prompts are encoded with the graph's CLIP into `samples/prompts.safetensors`
(engine/train/samples.py renders them). While the run trains, each `sample` event's latents are
decoded with the graph's VAE into `samples/step<N>_p<i>.png` in the run folder, logged to
TensorBoard, and handed to the UI (node preview and the sample strip).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from ..engine.config.checks import ConfigError
from ..engine.config.sections import SampleSpec
from ..engine.sample_files import PROMPTS_FILE, SAMPLES_DIR, read_samples, write_prompts
from . import compat

log = logging.getLogger("PipeTrain")
MAX_PROMPTS = 16


def parse_prompts(text: str) -> list[str]:
    """One prompt per non-empty line."""
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


def sample_spec(prompts: list[str], clip, vae, every: int, width: int, height: int, steps: int,
                cfg: float, seed: int, sampler: str, scheduler: str) -> SampleSpec | None:
    """The SampleSpec to run with (prompts_file still empty), or None for no samples."""
    if not prompts:
        return None
    if len(prompts) > MAX_PROMPTS:
        raise ConfigError(f"sample_prompts has {len(prompts)} lines: use at most {MAX_PROMPTS} prompts (one per line).")
    if clip is None or vae is None:
        missing = " and ".join(n for n, v in (("clip", clip), ("vae", vae)) if v is None)
        raise ConfigError(f"sample_prompts are set but no {missing} is connected: connect the graph's CLIP and VAE "
                          "to TrainPipeline (they encode the prompts and decode the samples), or clear sample_prompts.")
    spec = SampleSpec(every=every, width=width, height=height, steps=steps, cfg=float(cfg), seed=seed,
                      sampler=sampler, scheduler=scheduler)
    spec.validate()  # its prompts file is checked once written (RunConfig.check_files, on every rank)
    return spec


def write_prompt_file(run_dir: str, prompts: list[str], negative: str, clip) -> str:
    """Encode the prompts (and the negative) with the graph's CLIP; returns the file's path."""
    import torch

    def encode(text: str):
        with torch.inference_mode():
            cond, extras = clip.encode_from_tokens_scheduled(clip.tokenize(text))[0]
        return cond, dict(extras)

    path = Path(run_dir) / SAMPLES_DIR / PROMPTS_FILE
    write_prompts(path, prompts, [encode(p) for p in prompts], encode(negative or ""))
    return str(path)


class SampleDecoder:
    """Turns the engine's sample latents into PNGs (run folder), TensorBoard images and UI refs."""

    def __init__(self, run_dir: str, vae):
        self.run_dir = Path(run_dir)
        self.vae = vae
        self._tb = None
        self.latest: list[dict] = []  # ComfyUI image refs of the newest samples ({filename, subfolder, type})
        self.latest_pil = None

    def decode(self, event: dict) -> list[dict]:
        import numpy as np
        import torch
        from PIL import Image

        latents, prompts = read_samples(event["path"])
        with torch.inference_mode():
            images = self.vae.decode(latents)
        if compat.cuda_available():  # the ranks are training on these GPUs: give the VAE's VRAM back
            compat.free_accelerator_memory()
        images = images.reshape(-1, *images.shape[-3:])  # video VAEs return [N, T, H, W, C]
        step = int(event["step"])
        folder = self.run_dir / SAMPLES_DIR
        refs, pils = [], []
        for i, image in enumerate(images):
            array = (image.clamp(0, 1).cpu().float().numpy() * 255).round().astype(np.uint8)
            pil = Image.fromarray(array)
            name = f"step{step:06d}_p{i}.png"
            tmp = folder / f".{name}.tmp{os.getpid()}"
            try:
                pil.save(tmp, format="PNG")
                os.replace(tmp, folder / name)
            except BaseException:  # e.g. a full disk: no half-written file stays behind
                tmp.unlink(missing_ok=True)
                raise
            refs.append(image_ref(folder / name))
            pils.append(pil)
            tb = self._writer()
            if tb is not None:
                tb.add_image(f"samples/prompt_{i}", array, step, dataformats="HWC")
        if self._tb is not None:
            self._tb.flush()
        self.latest, self.latest_pil = refs, pils[0] if pils else None
        return refs

    def _writer(self):
        if self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                return None
            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), filename_suffix=".samples")
        return self._tb

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def image_ref(path: Path) -> dict:
    """How ComfyUI's /view serves a file under the output folder."""
    rel = Path(os.path.relpath(path, compat.output_directory()))
    return {"filename": rel.name, "subfolder": rel.parent.as_posix(), "type": "output"}
