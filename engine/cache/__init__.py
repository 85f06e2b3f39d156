"""The latent cache: the dataset encoded once with the graph's VAE and CLIP, read by training.

- format.py: the layout, the fingerprint and the item packing both formats share.
- shards.py (format 2: shards + metadata table) and legacy.py (format 1: one file per item).
- reader.py: CachedDataset, what training and the node's checks open; joined.py: the caches of
  chained datasets read as one (what training opens).
- writer.py: plan a cache, encode one rank's share, finish it; items.py: one item's pixels and
  conditioning; first_frame.py: image-to-video conditioning; encoders.py: the VAE/CLIP identity.
- cli.py: `python -m engine cache`, the same on N ranks from a shell.
"""
