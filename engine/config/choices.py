"""The values run.json's settings may take (the node dropdowns offer the same lists), and what each
optimizer costs. Plain data, no torch. Import names from this file.
"""
from __future__ import annotations

import re

LORA_TARGET_PRESETS = ("attention", "attention_mlp", "all_linear")
LORA_DTYPES = ("float32", "bfloat16")
# Adapter kinds (engine/train/adapter_kinds.py): lora = low-rank B @ A; loha = Hadamard product of two low-rank
# products; lokr = Kronecker product of a small and a (low-rank) large factor; dora = LoRA plus a learned magnitude
# per output row (weight-decomposed LoRA); full = no adapter: the model's block weights train (engine/train/full_tune.py).
ADAPTER_KINDS = ("lora", "loha", "lokr", "dora", "full")
BASE_DTYPES = ("auto", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
CHECKPOINTING = ("off", "on", "cpu_offload")  # activation checkpointing modes (engine/memory/activation_checkpointing.py)
# torch.compile modes for compile_blocks: "default" = inductor's; "cuda_graphs" = inductor's reduce-overhead
# (each compiled block region replayed as a CUDA graph: fewer kernel launches from the host).
COMPILE_MODES = ("default", "cuda_graphs")
# memory.plan: manual = the memory settings as given; fit = a probe before step 1 picks checkpointing, block swap,
# fp8 base and optimizer to fit memory.vram_gib (engine/memory/fit_plan.py, engine/memory/fit_probe.py).
MEMORY_PLANS = ("manual", "fit")
OPTIMIZERS = ("adamw", "adamw8bit", "adamw8bit_kahan", "adafactor", "prodigy", "adamw_cpu_offload")
# What each optimizer costs and saves, one sentence each (the MemoryOptions tooltip; docs/optimizers.md).
OPTIMIZER_NOTES = {
    "adamw": "AdamW with float32 state: 8 bytes of optimizer state per LoRA weight; the reference.",
    "adamw8bit": "bitsandbytes AdamW8bit: moments stored in 8 bits, ~2 bytes per weight (a quarter of adamw) "
                 "at about the same speed and quality.",
    "adamw8bit_kahan": "8-bit AdamW (~2 bytes per weight) plus Kahan-compensated updates, so a bfloat16 LoRA "
                       "(lora dtype) keeps its small updates for 2 more bytes per weight; on float32 weights it "
                       "is plain 8-bit AdamW.",
    "adafactor": "torch Adafactor: factored second moment, well under 1 byte per weight; learning_rate is a "
                 "relative step (1e-2 typical), training starts slower from a zero-initialised LoRA.",
    "prodigy": "Prodigy (pytorch-optimizer): finds the step size itself, set learning_rate to 1.0; 16 bytes per "
               "weight (twice adamw) and a little slower per step; pipeline_stages must be 1.",
    "adamw_cpu_offload": "AdamW with float32 master weights and state in CPU RAM (12 bytes per weight there, none "
                         "on the GPU); the step runs on the CPU, slower per step for large LoRAs.",
}
# Learning rates that make sense per optimizer (inclusive). Outside them training does nothing
# visible or diverges, so the config is refused before launch with the range in the message.
OPTIMIZER_LR_RANGES = {
    "adamw": (1e-7, 0.05),
    "adamw8bit": (1e-7, 0.05),
    "adamw8bit_kahan": (1e-7, 0.05),
    "adafactor": (1e-3, 1.0),
    "prodigy": (0.1, 10.0),
    "adamw_cpu_offload": (1e-7, 0.05),
}
SCHEDULERS = ("constant", "linear", "cosine")
TIMESTEP_SAMPLING = ("uniform", "logit_normal")
LOSSES = ("mse", "huber", "smooth_l1")  # the loss on the native-target error (engine/train/losses.py)
BACKENDS = ("deepspeed", "plain")  # plain = one PyTorch process, no DeepSpeed (engine/train/plain.py)
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:%-]{0,252}$")  # a host name, IPv4 or IPv6 address
WANDB_MODES = ("online", "offline")  # monitor.wandb_mode (engine/config/monitor.py)
