"""The encoder identity now lives in the engine (engine/encoder_identity.py), which the engine's
cache mode shares; this module keeps the node-side import path working."""
from __future__ import annotations

from ..engine.encoder_identity import (SAMPLED_TENSORS, SAMPLED_VALUES, _digest_obj, _digest_tensor,  # noqa: F401
                                       _patches_identity, _spread, cache_identity, clip_identity,
                                       encoder_identity,
                                       module_identity, vae_identity)
