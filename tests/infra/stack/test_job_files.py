"""The view job's lock and scratch directory in its checkpoint (infra.stack.stack)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.stack.stack import StackError, job_lock, job_scratch


def test_a_second_job_on_a_checkpoint_is_refused_with_the_holders_pid(tmp_path: Path):
    with job_lock(tmp_path / "checkpoints"), \
            pytest.raises(StackError, match=r"another view job \(pid \d+\)"), \
            job_lock(tmp_path / "checkpoints"):
        pass


def test_the_scratch_starts_empty_under_the_lock(tmp_path: Path):
    checkpoints = tmp_path / "checkpoints"
    with job_lock(checkpoints):
        scratch = job_scratch(checkpoints)
        # What a SIGKILLed incarnation leaves: Spark's block manager, an unpacked library.
        (scratch / "blockmgr-1" / "0c").mkdir(parents=True)
        (scratch / "liblz4-java-1.so").write_bytes(b"\0" * 64)
    kept = checkpoints / "state-v3"
    kept.mkdir()
    with job_lock(checkpoints):
        again = job_scratch(checkpoints)
        assert again == scratch == checkpoints.resolve() / "tmp"
        assert again.is_dir() and not any(again.iterdir())
    assert kept.is_dir(), "only the scratch is emptied"
