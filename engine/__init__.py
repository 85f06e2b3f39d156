"""PipeTrain's training engine. Runs out of process (`python -m engine --config run.json`).

This package must stay importable without torch-heavy side effects: the ComfyUI nodes import
`engine.config.run` and `engine.cache.format` for validation. It never imports `nodes/`.
"""
