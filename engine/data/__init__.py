"""The dataset on disk: folder scan, aspect-ratio buckets, captions, images and video clips, loss
masks and control images. What LoadDataset outputs and CacheLatents reads; no torch, no ComfyUI.

- dataset_spec.py: DatasetSpec (LoadDataset's output) and FolderSpec; dataset_chain.py: several datasets
  in one run (LoadDataset's add_to); batch_sizes.py: a batch size per resolution.
- scan.py: the folder scan and its report (it re-exports the spec); scan_memo.py keeps a
  scan for CacheLatents while no file changes. folders.py: typed folder lines -> folders.
- buckets.py: which (width, height) each file trains at. captions.py: caption files.
- images.py, video.py, png_chunks.py, file_kinds.py: reading the files. pairs.py: masks and control
  images paired by name. messages.py: the scan's errors and grouped warnings.
"""
