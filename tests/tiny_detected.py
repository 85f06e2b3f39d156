"""Real engine runs (per-node launcher, gloo ranks) on tiny Qwen-Image / Chroma files.

ComfyUI's detection reads a file's block counts and some widths from its tensors, but pins others to
the released models' values (Qwen-Image: 24 heads of 128, a 3584-wide text input; Chroma: 24 heads,
rope axes 16+56+56, a 5-layer 5120-wide approximator). A file at those widths is hundreds of millions
of parameters, far too slow for CPU ranks. So each rank runs this file instead of `python -m engine`:
it wraps comfy.model_detection.detect_unet_config to replace exactly those pinned values with the tiny
ones of tests/family_configs.py, then calls the engine's own main. Everything else is real: the file
is loaded by comfy.sd.load_diffusion_model into ComfyUI's classes, and the engine trains it as usual.

Use `use_tiny_detection(monkeypatch)` in a test so launcher.spawn (EngineRun) starts this file.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

# What detection pins (it reads every other config value from the file's tensors).
PINNED = {
    "qwen_image": dict(attention_head_dim=32, num_attention_heads=2, joint_attention_dim=48, axes_dims_rope=(8, 12, 12)),
    "chroma": dict(num_heads=2, axes_dim=[8, 12, 12], out_dim=64, hidden_dim=32, n_layers=2),
    # LTX-Video: detection assumes 32 heads and a 4096-wide T5 input unless the file's metadata says otherwise.
    "ltxv": dict(num_attention_heads=2, attention_head_dim=32, caption_channels=48),
    "flux2": dict(num_heads=2, axes_dim=[8, 8, 8, 8]),
    # Z-Image's tiny config (detection pins these only at dim 3840, and only there does a cap_pad_token
    # turn on the token padding: _install_tiny_detection does that too). Loaded as the Lumina2 class:
    # the same NextDiT, shift 6 not 3.
    "lumina2": dict(n_heads=8, n_kv_heads=8, n_refiner_layers=1, axes_dims=[8, 12, 12], axes_lens=[1536, 512, 512],
                    rope_theta=256.0, ffn_dim_multiplier=8 / 3, multiple_of=16, z_image_modulation=True,
                    time_scale=1000.0),
    # OmniGen2: detection pins every width and count; these are its tiny config with 2 layers.
    "omnigen2": dict(axes_dim_rope=[8, 12, 12], hidden_size=64, multiple_of=16, num_attention_heads=2, num_kv_heads=1,
                     num_layers=2, num_refiner_layers=1, text_feat_dim=48),
}
TEXT_TOKENS = 6


def tiny_detection(detect):
    """comfy.model_detection.detect_unet_config `detect`, with the pinned values replaced by the tiny ones."""

    def tiny_detect(state_dict, key_prefix, metadata=None):
        config = detect(state_dict, key_prefix, metadata=metadata)
        if config is not None and config.get("image_model") in PINNED:
            config = {**config, **PINNED[config["image_model"]]}
            if config["image_model"] == "lumina2" and f"{key_prefix}cap_pad_token" in state_dict:
                config["pad_tokens_multiple"] = 32  # as detection's Z-Image branch does
        return config

    return tiny_detect


def _install_tiny_detection() -> None:
    import comfy.model_detection

    comfy.model_detection.detect_unet_config = tiny_detection(comfy.model_detection.detect_unet_config)


def use_tiny_detection(monkeypatch) -> None:
    """Make the engine launcher start this file on every rank instead of `-m engine`."""
    from PipeTrain.engine.launch import launcher

    command = launcher.launcher_command

    def tiny_command(*args, **kwargs):
        cmd = command(*args, **kwargs)
        i = cmd.index("--")  # engine/launch/local_ranks.py: what follows is what each rank runs
        assert cmd[i + 1] == "engine", cmd
        return cmd[:i + 1] + [str(Path(__file__).resolve())] + cmd[i + 2:]

    monkeypatch.setattr(launcher, "launcher_command", tiny_command)


def write_model(path: Path, family_name: str, seed: int = 0, **config) -> Path:
    """A tiny random-init file of the family (its family_configs config, changed by `config`)."""
    import comfy.supported_models
    import family_configs as fc
    from safetensors.torch import save_file

    family = next(f for f in fc.FAMILIES if f.name == family_name)
    config = fc.host_config(dict(family.recipe, **config))  # + what the host's classes require
    model = getattr(comfy.supported_models, family.supported)(config).get_model({})
    fc.init_weights(model.diffusion_model, seed)
    state = {k: v.contiguous() for k, v in model.diffusion_model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))
    return path


def write_cache(root: Path, latent: tuple[int, ...], text_width: int, items: int = 8, seed: int = 0,
                refs: tuple[tuple[int, ...], ...] = (), extras: dict | None = None) -> str:
    """A latent cache of seeded random items (PipeTrain's own cache writer). refs: the shape of each
    reference latent per item (Edit models); extras: the same extra conditioning for every item."""
    from PipeTrain.engine.cache.legacy import write_manifest
    from PipeTrain.engine.cache.writer import write_item
    from PipeTrain.engine.data.scan import DatasetSpec, FolderSpec

    gen = torch.Generator().manual_seed(seed)
    spec = DatasetSpec(folders=(FolderSpec(str(root)),), resolution=64)
    cache = root / "cache"
    entries = []
    for i in range(items):
        item_extras = dict(extras or {})
        for n, shape in enumerate(refs):
            item_extras[f"reference_latents.{n}"] = torch.randn((1, *shape), generator=gen)
        write_item(cache, i, torch.randn((1, *latent), generator=gen),
                   torch.randn((1, TEXT_TOKENS, text_width), generator=gen), item_extras, f"item{i}.png",
                   f"caption {i}", 1)
        entries.append({"file": f"items/{i:06d}.safetensors", "source": f"item{i}.png", "repeats": 1})
    write_manifest(cache, "0" * 16, spec, entries, list(latent), ["cross_attn"], {"test": "tiny detected"})
    return str(cache)


if __name__ == "__main__":  # one rank: the engine's own entry point, with the tiny detection
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the pack root, as for `python -m engine`
    from engine.__main__ import _parse
    from engine.launch.comfy_bootstrap import import_comfy
    from engine.config.run import RunConfig
    from engine.train.loop import main

    args = _parse(sys.argv[1:])
    import_comfy(RunConfig.load(args.config).comfyui_root)
    _install_tiny_detection()
    sys.exit(main(args.config))
