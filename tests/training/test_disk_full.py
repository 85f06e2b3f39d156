"""A real full disk during a checkpoint (issue 22): the run folder lives on a small tmpfs, mounted in
a mount namespace of its own (`unshare -rm`, no root needed where user namespaces are allowed). A
first run writes checkpoint step2 and its LoRA; the disk is then filled to half a checkpoint's space;
the resumed run's step-4 checkpoint cannot fit. The error says "disk full" with the path, the space
needed and free; the partial folder is gone; step2, `latest` and the LoRA are byte for byte as they
were; train.log holds the error and the launcher's last line. Where no tmpfs can be mounted the test is skipped:
tests/unit/test_checkpoint_space.py covers the same logic with a mocked write failure everywhere."""
from __future__ import annotations

import dataclasses
import filecmp
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine_runs import build_cache, make_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

SCRIPT = """set -e
mount -t tmpfs -o size=16m tmpfs "$DISK"
cd "$REPO"
"$PY" -m engine.launch.launcher "$OUT/first.json" > "$OUT/first.log" 2>&1
cp -a "$DISK/run" "$OUT/after_first"
"$PY" -c 'import os, shutil, sys
ckpt = sys.argv[2]
need = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ckpt) for f in fs)
with open(sys.argv[1], "wb") as f:
    f.write(bytes(shutil.disk_usage(sys.argv[1]).free - need // 2))' "$DISK/filler" "$DISK/run/checkpoints/step000002"
"$PY" -m engine.launch.launcher "$OUT/second.json" >"$OUT/second.out" 2>"$OUT/second.err" || echo $? >"$OUT/second.rc"
cp -a "$DISK/run" "$OUT/after_full"
"""


def _can_mount_tmpfs(where: Path) -> bool:
    where.mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs '{where}'"],
                           capture_output=True)
    return probe.returncode == 0


def test_a_full_disk_during_a_checkpoint_is_named_and_cleaned_up(tmp_path, comfy_root, demo_base):
    if shutil.which("unshare") is None or not _can_mount_tmpfs(tmp_path / "probe"):
        pytest.skip("no tmpfs can be mounted here (unshare -rm + mount): tests/unit/test_checkpoint_space.py mocks it")
    disk, out = tmp_path / "small_disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    cfg = make_config(tmp_path / "staging", comfy_root, demo_base, build_cache(comfy_root, demo_base), steps=2,
                      checkpoint_every=2)
    first = dataclasses.replace(cfg, run_name="run", run_dir=str(disk / "run"))
    first.save(out / "first.json")
    dataclasses.replace(first, resume=True, train=dataclasses.replace(first.train, steps=4)).save(out / "second.json")
    env = {"DISK": str(disk), "OUT": str(out), "REPO": str(REPO), "PY": sys.executable,
           "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    done = subprocess.run(["unshare", "-rm", "sh", "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout + done.stderr + _read(out / "first.log")
    assert (out / "second.rc").is_file(), "the resumed run did not fail: the disk was not full"

    error = _read(out / "second.err")
    before, after = out / "after_first", out / "after_full"  # copies of the run folder
    assert f"disk full: the checkpoint {disk / 'run' / 'checkpoints' / 'step000004'} could not be written" in error, \
        error + _read(out / "second.out")
    assert "(the size of the previous checkpoint, step000002)" in error and " free there" in error, error
    assert not (after / "checkpoints" / "step000004").exists(), "the partial checkpoint folder stayed"
    assert (after / "checkpoints" / "latest").read_text().strip() == "step000002"
    same = filecmp.dircmp(before / "checkpoints" / "step000002", after / "checkpoints" / "step000002")
    assert not (same.diff_files or same.left_only or same.right_only), "the earlier checkpoint changed"
    assert filecmp.cmp(before / "lora" / "lora_final.safetensors", after / "lora" / "lora_final.safetensors",
                       shallow=False)
    log = _read(after / "train.log")
    assert "CheckpointWriteError: disk full" in log and "exited with code 1: stopping the other ranks" in log, log[-3000:]
    assert log.splitlines()[-1] == "[local_ranks] every rank has ended; exiting with rank 0's code", log[-3000:]


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
