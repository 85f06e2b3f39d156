"""Memory options on any ComfyUI diffusion model, through its block lists (blocks.py): block swap,
activation checkpointing and torch.compile per block; options.py applies the chosen set. Rank-only.
"""
