"""CacheLatents on several GPUs: the engine's cache mode on N ranks, started and watched from the node.

The ranks (engine/cache/cli.py) load the encoder files the graph's loaders loaded (nodes/cache_sources.py),
check that they are the encoders the graph gave the node (the same identity), split the items by
rank and write the cache where the node would. The node then reads the finished cache the way it
always does, so its output and report are those of a one-GPU run that found everything cached.
Cancel ends every rank; what they finished stays on disk and the next run continues from it.
"""
from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from ..engine.cache import cli
from ..engine.cache.format import CacheError
from ..engine.config.cache import CacheConfig
from ..engine.data.scan import DatasetSpec
from ..engine.launch.launcher import kill_tree
from . import compat

log = logging.getLogger("PipeTrain")
POLL_S = 0.5


def cache_on_ranks(dataset: DatasetSpec, files: dict, processes: int, identity: str, regenerate: bool,
                   options: dict) -> str:
    """Encode `dataset` on `processes` ranks; returns the ranks' last report line. options: CacheLatents'
    first_frame_conditioning, first_frame_style, control_style, clip_vision_crop, trust_cache."""
    cfg = CacheConfig(comfyui_root=compat.comfyui_root(), dataset=dataset, vae=files.get("vae", ""),
                      clip=tuple(files.get("clip", ())), clip_type=files.get("clip_type", "stable_diffusion"),
                      checkpoint=files.get("checkpoint", ""), clip_vision=files.get("clip_vision", ""),
                      audio_vae=files.get("audio_vae", ""), regenerate=regenerate, processes=processes, expect_identity=identity, **options)
    cfg.validate()
    with tempfile.TemporaryDirectory(prefix="pipetrain-cache-") as folder:
        config_path, log_path = Path(folder) / "cache.json", Path(folder) / "cache.log"
        cfg.save(config_path)
        with open(log_path, "ab") as output:
            proc = cli.start(cfg, str(config_path), output)
        log.info("PipeTrain CacheLatents: encoding on %d processes (pid %d)", processes, proc.pid)
        offset, lines = 0, []
        try:
            while True:
                done = proc.poll() is not None
                offset, new = _read_new(log_path, offset)
                for line in new:
                    lines.append(line)
                    if "PipeTrain cache:" in line or line.startswith("error:"):
                        log.info("PipeTrain CacheLatents: %s", line)
                if done:
                    break
                compat.raise_if_interrupted()
                time.sleep(POLL_S)
        finally:
            kill_tree(proc)  # nothing after a cancel or an error in this loop; a no-op once it ended
        if proc.returncode != 0:
            errors = [line for line in lines if line.startswith("error:")]
            tail = "\n".join(errors or lines[-30:])
            raise CacheError(f"caching on {processes} processes failed (exit code {proc.returncode}):\n{tail}")
    reports = [line.partition("PipeTrain cache: ")[2] for line in lines if "PipeTrain cache: " in line]
    return reports[-1] if reports else ""


def _read_new(path: Path, offset: int) -> tuple[int, list[str]]:
    """The complete lines appended to `path` since `offset`, and the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset, []
    end = data.rfind(b"\n") + 1
    text = data[:end].decode("utf-8", errors="replace")
    return offset + end, [line.strip() for line in text.splitlines() if line.strip()]
