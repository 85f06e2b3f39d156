"""PipeTrain: train LoRAs for diffusion models from a ComfyUI graph (DeepSpeed, out of process).

ComfyUI imports this package from custom_nodes/. Nothing heavy is imported here, so importing
the package outside ComfyUI works too (the node modules import ComfyUI lazily).
"""
try:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
except ImportError:  # imported as a plain module (no parent package): nothing to register
    if __package__:
        raise
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = {}, {}

WEB_DIRECTORY = "./web"

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
