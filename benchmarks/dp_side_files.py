"""The files diffusion-pipe reads for benchmarks/diffusion_pipe_side.py, built offline: a random-init model of
the released shape in the folder layout its loaders expect (Flux: a diffusers FLUX.1-dev folder; Wan: the
Wan2.1-T2V-14B folder) with the smallest text encoders, VAE and tokenizers they accept, and a dataset of
generated images or videos with captions."""
from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

FLUX_DEV = {"patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128,
            "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768,
            "guidance_embeds": True, "axes_dims_rope": (16, 56, 56)}
FLUX_TINY = dict(FLUX_DEV, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
                 joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 6, 6))
WAN_T2V_14B = {"_class_name": "WanModel", "_diffusers_version": "0.30.0", "model_type": "t2v", "patch_size": [1, 2, 2],
               "text_len": 512, "in_dim": 16, "dim": 5120, "ffn_dim": 13824, "freq_dim": 256, "text_dim": 4096,
               "out_dim": 16, "num_heads": 40, "num_layers": 40, "window_size": [-1, -1], "qk_norm": True,
               "cross_attn_norm": True, "eps": 1e-06}
CHARS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]


# ----------------------------------------------------------------------------- random weights
def _init_value(name, shape, gen, device):
    """Seeded values that keep activations finite: norms 1, biases 0, weights N(0, 1/fan_in)."""
    import torch

    module = name.split(".")[-2] if "." in name else ""
    if name.endswith(("bias", "beta")):
        return torch.zeros(shape, dtype=torch.bfloat16, device=device)
    if len(shape) == 1 or name.endswith("gamma") or ("norm" in module and name.endswith("weight")):
        return torch.ones(shape, dtype=torch.bfloat16, device=device)
    fan_in = max(1, math.prod(shape[1:]))
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32 if device == "cpu" else torch.bfloat16)
    return (t * (1.0 / math.sqrt(fan_in))).to(torch.bfloat16)


def write_random_safetensors(shapes: dict, out_dir: Path, prefix: str, shard_gb: float = 4.0) -> int:
    """Fill every tensor of `shapes` (name -> shape) and write sharded safetensors plus an index."""
    import torch
    from safetensors.torch import save_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    names = list(shapes)
    shards, current, size = [], {}, 0
    for name in names:
        current[name] = _init_value(name, tuple(shapes[name]), gen, device).cpu()
        size += current[name].numel() * 2
        if size >= shard_gb * 2**30:
            shards.append(current)
            current, size = {}, 0
    if current:
        shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"{prefix}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
        for k, v in shard.items():
            weight_map[k] = fname
            total += v.numel() * 2
        shard.clear()
    (out_dir / f"{prefix}.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return total


def meta_shapes(build) -> dict:
    import torch

    with torch.device("meta"):
        module = build()
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


# ----------------------------------------------------------------------------- tokenizers / encoders
def clip_tokenizer(out: Path):
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in CHARS:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    tok = CLIPTokenizer(vocab=vocab, merges=[], unk_token="<|endoftext|>", bos_token="<|startoftext|>",
                        eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=77)
    tok.save_pretrained(str(out))
    return len(vocab)


def t5_tokenizer(out: Path, max_len: int = 512):
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -3.0) for c in CHARS] + [("\u2581" + c, -3.5) for c in CHARS]
    tok = T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=max_len)
    tok.save_pretrained(str(out))
    return len(pieces)


def write_flux_folder(root: Path, tiny: bool) -> dict:
    """A diffusers FLUX.1-dev folder: random full-size transformer, smallest encoders/VAE it accepts."""
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxTransformer2DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    cfg = FLUX_TINY if tiny else FLUX_DEV
    root.mkdir(parents=True, exist_ok=True)
    (root / "transformer").mkdir(exist_ok=True)
    shapes = meta_shapes(lambda: FluxTransformer2DModel(**cfg))
    with torch.device("meta"):
        FluxTransformer2DModel(**cfg).save_config(str(root / "transformer"))
    nbytes = write_random_safetensors(shapes, root / "transformer", "diffusion_pytorch_model")

    torch.manual_seed(0)
    clip_dim, t5_dim = cfg["pooled_projection_dim"], cfg["joint_attention_dim"]
    n_clip = clip_tokenizer(root / "tokenizer")
    CLIPTextModel(CLIPTextConfig(vocab_size=n_clip, hidden_size=clip_dim, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=max(1, clip_dim // 64), projection_dim=clip_dim,
                                 max_position_embeddings=77, bos_token_id=0, eos_token_id=1, pad_token_id=1)
                  ).to(torch.bfloat16).save_pretrained(str(root / "text_encoder"))
    n_t5 = t5_tokenizer(root / "tokenizer_2")
    T5EncoderModel(T5Config(vocab_size=n_t5, d_model=t5_dim, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
                            feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
                            decoder_start_token_id=0)).to(torch.bfloat16).save_pretrained(str(root / "text_encoder_2"))
    AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                  block_out_channels=(32,) * 4, layers_per_block=1, latent_channels=16, norm_num_groups=32,
                  sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                  use_post_quant_conv=False).save_pretrained(str(root / "vae"))
    FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                    base_image_seq_len=256, max_image_seq_len=4096).save_pretrained(str(root / "scheduler"))
    import diffusers

    (root / "model_index.json").write_text(json.dumps({
        "_class_name": "FluxPipeline", "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"], "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "T5TokenizerFast"], "transformer": ["diffusers", "FluxTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"]}, indent=1))
    return {"transformer_bytes": nbytes, "transformer_params": sum(math.prod(s) for s in shapes.values())}


def write_wan_folder(root: Path, dp: Path, tiny: bool) -> dict:
    """The Wan2.1-T2V-14B folder layout diffusion-pipe reads, random weights (T5/VAE at full size: fixed there)."""
    import torch

    sys.path.insert(0, str(dp))
    from models.wan.model import (
        WanModel,  # diffusion-pipe's own class: its parameter names are the file's keys
    )
    from models.wan.t5 import umt5_xxl
    from models.wan.vae2_1 import WanVAE_

    cfg = dict(WAN_T2V_14B, num_layers=1, dim=1536, ffn_dim=256, num_heads=12) if tiny else WAN_T2V_14B
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg, indent=1))
    model_cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    shapes = meta_shapes(lambda: WanModel(**model_cfg))
    nbytes = write_random_safetensors(shapes, root, "diffusion_pytorch_model")
    t5_shapes = meta_shapes(lambda: umt5_xxl(encoder_only=True, return_tokenizer=False, dtype=torch.bfloat16, device="meta"))
    tmp = root / "_t5"
    tmp.mkdir(exist_ok=True)
    write_random_safetensors(t5_shapes, tmp, "t5", shard_gb=64)
    from safetensors.torch import load_file

    torch.save(load_file(str(next(tmp.glob("t5-*.safetensors")))), root / "models_t5_umt5-xxl-enc-bf16.pth")
    shutil.rmtree(tmp)
    torch.manual_seed(0)
    vae = WanVAE_(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                  temperal_downsample=[False, True, True], dropout=0.0)
    torch.save(vae.state_dict(), root / "Wan2.1_VAE.pth")
    t5_tokenizer(root / "google" / "umt5-xxl")
    return {"transformer_bytes": nbytes, "transformer_params": sum(math.prod(s) for s in shapes.values())}


# ----------------------------------------------------------------------------- data and configs
def write_images(folder: Path, n: int, size: int):
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        base = rng.integers(0, 256, (size // 16, size // 16, 3), dtype=np.uint8)
        Image.fromarray(base).resize((size, size), Image.BILINEAR).save(folder / f"img{i:03d}.png")
        (folder / f"img{i:03d}.txt").write_text(f"a photo of pattern {i} in many colors")


def write_videos(folder: Path, n: int, size: int, frames: int):
    import av  # PyAV: diffusion-pipe decodes videos through ComfyUI's av-based loader
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        with av.open(str(folder / f"vid{i:03d}.mp4"), "w") as box:
            stream = box.add_stream("mpeg4", rate=16)
            stream.width = stream.height = size
            stream.pix_fmt = "yuv420p"
            for f in range(frames):
                img = np.roll(rng.integers(0, 256, (size, size, 3), dtype=np.uint8) // 4 + 64 * (f % 4), f, axis=1)
                for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    box.mux(packet)
            for packet in stream.encode():
                box.mux(packet)
        (folder / f"vid{i:03d}.txt").write_text(f"a video of pattern {i} moving")
