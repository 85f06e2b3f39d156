"""The engine's cache mode: what the CacheLatents node does, from a shell and on N ranks.

    python -m engine cache --config cache.json            # validates, then starts the ranks
    python -m engine cache --config cache.json --worker   # one rank (what the launcher starts)

One process runs in place; several are started by the per-node launcher (one per GPU, CPU
processes without CUDA). Each rank loads the VAE and text encoder (and a CLIP-vision model, if the
config names one) with ComfyUI's own loaders and encodes the items i with i % N == rank
(engine/cache/writer.py). Rank 0 scans the dataset once and hands the plan to the others; each
rank writes its own shards, and after every rank finished rank 0 writes the metadata table and the
manifest (engine/cache/shards.py). The ranks only exchange that plan and a few counters, over gloo
(CPU), so no GPU collective is needed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

from ..config.cache import CacheConfig
from ..config.checks import ConfigError
from ..data.dataset_chain import part_name
from ..data.messages import DatasetError
from .format import CacheError, remove_cache


def load_encoders(cfg: CacheConfig):
    """(vae, clip) as ComfyUI's VAELoader / CLIPLoader / CheckpointLoaderSimple give them."""
    import comfy.sd
    import comfy.utils

    vae = clip = None
    if cfg.checkpoint and not (cfg.vae and cfg.clip):
        _, clip, vae, _ = comfy.sd.load_checkpoint_guess_config(cfg.checkpoint, output_vae=not cfg.vae,
                                                                output_clip=not cfg.clip, output_model=False)
        if (clip is None and not cfg.clip) or (vae is None and not cfg.vae):
            raise ConfigError(f"checkpoint {cfg.checkpoint} holds no {'text encoder' if clip is None else 'VAE'}: "
                              "give that file separately (\"clip\" / \"vae\").")
    if cfg.vae:
        vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(cfg.vae))
        vae.throw_exception_if_invalid()
    if cfg.clip:
        clip = comfy.sd.load_clip(ckpt_paths=list(cfg.clip), clip_type=getattr(comfy.sd.CLIPType, cfg.clip_type.upper()))
    return vae, clip


def load_clip_vision(cfg: CacheConfig):
    """The CLIP_VISION that ComfyUI's CLIPVisionLoader gives for cfg.clip_vision, or None when it is not set."""
    if not cfg.clip_vision:
        return None
    import comfy.clip_vision

    model = comfy.clip_vision.load(cfg.clip_vision)
    if model is None:  # ComfyUI recognises the vision encoders it ships configs for, by their layer count
        raise ConfigError(f"clip_vision: {cfg.clip_vision} is not a CLIP-vision model ComfyUI can load (its Load CLIP "
                          "Vision node refuses it too): give the file you load there for CLIPVisionEncode, e.g. "
                          "clip_vision_h.safetensors for Wan 2.1 i2v.")
    return model


def load_audio_vae(cfg: CacheConfig):
    """The audio VAE for cfg.audio_vae as Load LTXV Audio VAE loads it (an LTX 2.x checkpoint's audio_vae.* and
    vocoder.* keys), or as VAELoader loads a plain audio VAE file; None when it is not set."""
    if not cfg.audio_vae:
        return None
    import comfy.sd
    import comfy.utils

    sd, metadata = comfy.utils.load_torch_file(cfg.audio_vae, return_metadata=True)
    ltx = comfy.utils.state_dict_prefix_replace(sd, {"audio_vae.": "autoencoder.", "vocoder.": "vocoder."},
                                                filter_keys=True)
    vae = comfy.sd.VAE(sd=ltx or sd, metadata=metadata)
    vae.throw_exception_if_invalid()
    return vae


def _say(rank: int, message: str) -> None:
    if rank == 0:
        print(f"PipeTrain cache: {message}", flush=True)


def run_rank(cfg: CacheConfig, worker: bool) -> int:
    """Encode this rank's share; rank 0 writes the metadata table and manifest. Returns the exit status."""
    import torch
    import torch.distributed as dist

    from ..launch.comfy_bootstrap import import_comfy
    from .encoders import cache_identity, identity_text
    from .items import ItemOptions
    from .vae_frame_rate import check_clip_lengths

    rank, world = (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))) if worker else (0, 1)
    if torch.cuda.is_available():  # before ComfyUI picks its device: each rank its own GPU
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) if worker else 0)
    import_comfy(cfg.comfyui_root)
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.timeout_s))
    try:
        vae, clip = load_encoders(cfg)
        options = ItemOptions(cfg.first_frame, load_clip_vision(cfg), cfg.clip_vision_crop != "none", cfg.control_style,
                              load_audio_vae(cfg))
        identity = cache_identity(vae, clip, options)
        if cfg.expect_identity and identity_text(identity) != cfg.expect_identity:
            raise CacheError(f"the encoders loaded from the files are not the ones expected (identity "
                             f"{identity_text(identity)}, expected {cfg.expect_identity}): the graph changes them after loading (CLIP Set Last "
                             "Layer, a LoRA on the text encoder, ...). Cache with gpus 1 (the graph's own encoders), "
                             "or connect the loaders straight to CacheLatents.")
        for part in cfg.dataset.parts:  # before any rank encodes: the VAE's 4k+1 (8k+1...) rule, every dataset
            check_clip_lengths(part, vae)
        for number, part in enumerate(cfg.dataset.parts, start=1):  # chained datasets: each cached on its own
            if len(cfg.dataset.parts) > 1:
                _say(rank, f"{part_name(part, number)} of {len(cfg.dataset.parts)}")
            _cache_part(cfg, part, rank, world, vae, clip, options, identity)
        return 0
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _cache_part(cfg: CacheConfig, part, rank: int, world: int, vae, clip, options, identity) -> None:
    """One dataset's cache on every rank (rank 0 writes the metadata table and manifest)."""
    import torch.distributed as dist

    from .vae_frame_rate import resolve_target_fps
    from .writer import ShardResult, encode_shard, find_trusted_cache, finish_cache, plan_cache

    dataset = resolve_target_fps(part, vae, lambda m: _say(rank, m), lambda m: _say(rank, f"warning: {m}"))
    if cfg.trust_cache and not cfg.regenerate:
        trusted = find_trusted_cache(dataset, identity)  # every rank finds the same one
        if trusted is not None:
            _say(rank, f"trust_cache is on, reusing {trusted.cache_dir} without checking the files")
            return
        _say(rank, "trust_cache is on but no complete cache matches; checking every file")
    plan = plan_cache(dataset, identity, lambda m: _say(0, f"warning: {m}")) if rank == 0 else None
    if world > 1:  # the others take rank 0's scan: the files are read once, and every rank has the same plan
        box = [plan]
        dist.broadcast_object_list(box, src=0)
        plan = box[0]
        if plan.identity != identity:
            raise CacheError(f"rank {rank} loaded other encoders than rank 0 (identity {identity} vs "
                             f"{plan.identity}): every rank must see the same model files.")
    if rank == 0 and cfg.regenerate and plan.cache_dir.exists():
        _say(rank, f"regenerate is on, deleting {plan.cache_dir}")
        remove_cache(plan.cache_dir)
    if world > 1:
        dist.barrier()  # nobody writes into the folder rank 0 is deleting
    start, mine = time.monotonic(), len(range(rank, len(plan.entries), world))
    _say(rank, f"{len(plan.entries)} item(s) on {world} rank(s) -> {plan.cache_dir}")
    result = encode_shard(plan, vae, clip, rank, world, cfg.regenerate, options,
                          progress=_progress(rank, mine, start))
    parts = [result]
    if world > 1:
        parts = [None] * world
        dist.all_gather_object(parts, result)
    if rank != 0:
        return
    merged = ShardResult.merge(parts)
    spec = finish_cache(plan, merged, lambda m: _say(0, f"warning: {m}"))
    _say(rank, f"{merged.reused} item(s) reused, {merged.copied} copied from the previous cache, {merged.encoded} "
               f"encoded in {time.monotonic() - start:.1f}s -> {spec.cache_dir} ({spec.count} item(s))")


def _progress(rank: int, total: int, start: float):
    """Rank 0 prints how far its share is, about every tenth of it (shares of 20 or more items)."""
    step, done = max(1, total // 10), [0]

    def tick() -> None:
        done[0] += 1
        if rank == 0 and total >= 20 and (done[0] % step == 0 or done[0] == total):
            print(f"PipeTrain cache: rank 0 {done[0]}/{total} ({time.monotonic() - start:.0f}s)", flush=True)
    return tick


def launcher_command(cfg: CacheConfig, config_path: str, master_port: int) -> list[str]:
    from ..launch.launcher import local_launcher

    ids = [int(i) for i in cfg.gpu_ids.split(",")] if cfg.gpu_ids else list(range(cfg.processes))
    return local_launcher(ids, master_port, ["engine", "cache", "--config", config_path, "--worker"])


def start(cfg: CacheConfig, config_path: str, output=None) -> subprocess.Popen:
    """Start cfg.processes ranks with the per-node launcher (engine/launch/local_ranks.py; the workers use
    torch.distributed's gloo, not DeepSpeed), cwd = the pack root, in a process group of their own
    (launcher.kill_tree ends them all); output: where their stdout and stderr go (None: ours)."""
    from ..launch import launcher

    import torch

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if not torch.cuda.is_available():
        env["DS_ACCELERATOR"] = "cpu"
        # ranks share the cores: without this each rank starts one thread per core
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.processes)))
    kwargs = {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if os.name == "nt" else {"start_new_session": True}
    streams = {} if output is None else {"stdout": output, "stderr": subprocess.STDOUT}
    return subprocess.Popen(launcher_command(cfg, os.path.abspath(config_path), launcher.free_port()),
                            cwd=str(launcher.PACK_ROOT), env=env, stdin=subprocess.DEVNULL, **streams, **kwargs)


def launch(cfg: CacheConfig, config_path: str) -> int:
    """Start the ranks (start()) and wait for them."""
    from ..launch import launcher

    proc = start(cfg, config_path)
    try:
        return proc.wait()
    except KeyboardInterrupt:  # finished items are on disk: the next run resumes from them
        launcher.kill_tree(proc)
        return 130


def main(config_path: str, worker: bool = False) -> int:
    try:
        cfg = CacheConfig.load(config_path)
        if cfg.processes > 1 and not worker:
            return launch(cfg, config_path)
        if cfg.gpu_ids and not worker:  # one process: pick its GPU before torch looks
            os.environ["CUDA_VISIBLE_DEVICES"] = cfg.gpu_ids
        return run_rank(cfg, worker)
    except (ConfigError, CacheError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
