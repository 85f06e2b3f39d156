"""engine/atomic_files.py: a file is replaced only by a complete one, and a failed write leaves the old
file and no temp file behind."""
from __future__ import annotations

import pytest
import torch

from pack import load_pack  # tests/pack.py: the repo as the package ComfyUI makes of it

load_pack()

from PipeTrain.engine import atomic_files  # noqa: E402


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "sub" / "file.txt"
    atomic_files.write_text(target, "old")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_files.replacing(target) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.txt"]


def test_writes_replace_the_target_whole(tmp_path):
    from safetensors.torch import load_file, safe_open

    path = atomic_files.write_safetensors(tmp_path / "w.safetensors", {"a": torch.ones(2)}, {"step": 3})
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"step": "3"}  # metadata values written as strings
    assert torch.equal(load_file(str(path))["a"], torch.ones(2))
    atomic_files.write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]
    assert atomic_files.temp_beside(path).parent == path.parent  # the rename never crosses a disk
