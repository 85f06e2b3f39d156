"""Which checkpoint folders pruning removes (engine/train/checkpoints.py): never the one `latest`
names or the one just written; folders a kill left half-written after it do go."""
from __future__ import annotations

from pathlib import Path

from PipeTrain.engine.train.checkpoints import prune


def _folders(root: Path, *tags: str) -> None:
    for tag in tags:
        (root / tag).mkdir(parents=True)
        (root / tag / "mp_rank_00_model_states.pt").write_bytes(b"x")


def _left(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def test_resumed_run_keeps_latest_and_removes_the_half_written_future(tmp_path):
    """The issue's case: complete step7, partial step10 and step14 (killed), resumed from 7, step8 written."""
    _folders(tmp_path, "step000007", "step000010", "step000014", "step000008")
    (tmp_path / "latest").write_text("step000008")
    prune(tmp_path, "step000008", keep=2)
    assert _left(tmp_path) == ["step000007", "step000008"]


def test_another_node_keeps_what_latest_still_names(tmp_path):
    """On a node that prunes before rank 0 moved `latest`, the checkpoint `latest` names stays."""
    _folders(tmp_path, "step000002", "step000004", "step000006")
    (tmp_path / "latest").write_text("step000002")
    prune(tmp_path, "step000006", keep=1)
    assert _left(tmp_path) == ["step000002", "step000006"]


def test_old_checkpoints_beyond_keep_go(tmp_path):
    _folders(tmp_path, *(f"step{s:06d}" for s in (2, 4, 6, 8)))
    (tmp_path / "latest").write_text("step000008")
    removed = prune(tmp_path, "step000008", keep=2)
    assert _left(tmp_path) == ["step000006", "step000008"]
    assert sorted(p.name for p in removed) == ["step000002", "step000004"]
