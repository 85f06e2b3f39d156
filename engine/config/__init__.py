"""run.json and the cache config: frozen, validated settings, the one contract between the ComfyUI
nodes and the engine. Plain data, no torch.

- run.py: RunConfig (the whole run.json), its load/save, validate() (pure: no file read) and
  check_files() (the files it names, at each boundary).
- rules.py: the rules that join settings, one function each, called wherever the rule applies.
- sections.py (lora, memory, train, sample), launch.py (launch, cluster), eval.py (eval), cache.py
  (CacheConfig: `python -m engine cache`): one file per section group.
- choices.py: the values each setting may take (the node dropdowns offer the same lists).
- checks.py: ConfigError and the checks the sections share.
"""
