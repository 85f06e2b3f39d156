"""Starting a run: the DeepSpeed launcher and its stop, several machines, and the one place that
makes the host ComfyUI importable. The ComfyUI server imports launcher.py and cluster.py (standard
library only); comfy_bootstrap.py runs in every engine process.
"""
