"""diffusion-pipe configs (tdrussell/diffusion-pipe's main TOML + dataset TOML) to and from PipeTrain.

- report.py: the per-key report (every key mapped to a PipeTrain setting, or named as not mapped, and why).
- values.py: reading TOML files and checking one value's type, with errors that name the file, key and fix.
- main_keys.py / dataset_keys.py: what each key of the main and the dataset TOML becomes.
- importer.py: from_diffusion_pipe(main, dataset) -> ({"run": run.json dict, "cache": cache config dict}, report).
- exporter.py: to_diffusion_pipe(run_json, dataset) -> (main TOML text, dataset TOML text, report);
  toml_text.py: the small TOML writer it uses.
- cli.py: `python -m engine import-dp` / `export-dp`.
Plain data: no torch, no comfy. The mapping table is docs/diffusion-pipe-configs.md.
"""
