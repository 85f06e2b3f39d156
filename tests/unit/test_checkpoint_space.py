"""A checkpoint write that fails on a full disk (engine/train/checkpoint_space.py through
checkpoints.save_checkpoint). A MOCK of the write failure: the engine writes part of a file, then
raises torch's own zip-writer error, and shutil.disk_usage reports a nearly full disk. The real full
disk (a small tmpfs) is tests/training/test_disk_full.py, where the machine allows mounting one."""
from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from PipeTrain.engine.train import checkpoint_space, checkpoints

TORCH_ERROR = "[enforce fail at inline_container.cc:672] . unexpected pos 996352 vs 996240"
Usage = namedtuple("Usage", "total used free")


class FullDiskEngine:
    """Writes 4000 bytes of the checkpoint, then fails as torch.save does when the disk is full."""

    def save_checkpoint(self, save_dir, tag, client_state, exclude_frozen_parameters, save_latest=True):
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True)
        (folder / "mp_rank_00_model_states.pt").write_bytes(b"x" * 4000)
        raise RuntimeError(TORCH_ERROR)


def _earlier_checkpoint(root: Path) -> bytes:
    (root / "step000002").mkdir(parents=True)
    data = b"y" * 10_000
    (root / "step000002" / "mp_rank_00_model_states.pt").write_bytes(data)
    (root / "latest").write_text("step000002")
    return data


@pytest.mark.parametrize("deepspeed", [True, False])
def test_a_full_disk_is_named_and_the_partial_folder_removed(tmp_path, monkeypatch, deepspeed):
    root = tmp_path / "checkpoints"
    earlier = _earlier_checkpoint(root)
    lora = tmp_path / "lora" / "lora_step000002.safetensors"
    lora.parent.mkdir()
    lora.write_bytes(b"lora")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 512, 512))
    with pytest.raises(checkpoint_space.CheckpointWriteError) as err:
        checkpoints.save_checkpoint(FullDiskEngine(), root, "step000004", {"step": 4}, deepspeed=deepspeed)
    message = str(err.value)
    assert message.startswith(f"disk full: the checkpoint {root / 'step000004'} could not be written")
    assert "needs about 9.8 KiB (the size of the previous checkpoint, step000002)" in message
    assert "512 bytes are free" in message and "continues from step000002" in message
    assert not (root / "step000004").exists(), "the partial folder stayed"
    assert (root / "latest").read_text() == "step000002"
    assert (root / "step000002" / "mp_rank_00_model_states.pt").read_bytes() == earlier
    assert lora.read_bytes() == b"lora"


def test_another_write_failure_is_raised_as_it_was(tmp_path, monkeypatch):
    """Plenty of space and no ENOSPC: not called a full disk; the partial folder still goes."""
    root = tmp_path / "checkpoints"
    _earlier_checkpoint(root)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**9, 10**11))
    with pytest.raises(RuntimeError, match="unexpected pos") as err:
        checkpoints.save_checkpoint(FullDiskEngine(), root, "step000004", {"step": 4}, deepspeed=False)
    assert not isinstance(err.value, checkpoint_space.CheckpointWriteError)
    assert not (root / "step000004").exists()


def test_enospc_is_a_full_disk_whatever_is_free(tmp_path):
    err = OSError(28, "No space left on device")
    assert checkpoint_space._no_space(RuntimeError("wrapped").with_traceback(None)) is False
    wrapped = RuntimeError("writer failed")
    wrapped.__cause__ = err
    assert checkpoint_space._no_space(wrapped)
