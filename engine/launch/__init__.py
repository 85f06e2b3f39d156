"""Starting a run: the per-node launcher and its stop, several machines, and the one place that
makes the host ComfyUI importable. The ComfyUI server imports launcher.py and cluster.py (standard
library only); comfy_bootstrap.py runs in every engine process.

- run_lock.py: a run folder's owner (one live run per folder; stale locks taken over).
- owner.py: the ranks' watch of the ComfyUI server that started them (they stop when it is gone).
- local_ranks.py: the per-node launcher on one machine (the ranks' environment as DeepSpeed's sets it).
- processes.py: a pid with its start time; rank_exits.py: naming a rank that died of a signal.
- stop_files.py: the run-folder files that end a run (Cancel, Stop & save), named once for writers and ranks.
"""
