"""``fanout verify`` from its command line, against the session's broker and a SQLite view."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.checks.verify import served
from infra.cli import main
from ingest.generator import generate
from ingest.settings import BOOTSTRAP_ENV, PARTITIONS_ENV, TOPIC_PREFIX_ENV, KafkaSettings
from tests.support.changelog import produce
from views.changelog import read_changelog
from views.delta import Delta
from views.join import JoinConfig
from views.local import LocalJoin
from views.settings import STORE_ENV, TIMELINE_CAP_ENV
from views.stores.sqlite import SQLiteStore

CAP = 40


@pytest.fixture
def view(kafka_settings: KafkaSettings, tmp_path: Path, monkeypatch) -> Path:
    """A SQLite view of a small history in the topics, caught up with them; env set."""
    produce(kafka_settings, generate(50, 500, 400, seed=8).events())
    log_ = read_changelog(kafka_settings)
    path = tmp_path / "v.sqlite"
    with SQLiteStore(path, cap=CAP) as store:
        LocalJoin(JoinConfig.with_ratio(CAP, 100), store).run(log_.events)
        store.apply([Delta.source_offset(t, p, end - 1) for (t, p), end in log_.ends.items()
                     if end])
    for name, value in ((BOOTSTRAP_ENV, kafka_settings.bootstrap),
                        (TOPIC_PREFIX_ENV, kafka_settings.topic_prefix),
                        (PARTITIONS_ENV, str(kafka_settings.partitions)),
                        (STORE_ENV, f"sqlite:///{path}"), (TIMELINE_CAP_ENV, str(CAP))):
        monkeypatch.setenv(name, value)
    return path


def _verify(tmp_path: Path, *args: str) -> int:
    return main(["--run-dir", str(tmp_path / "no-stack"), "verify", *args])


def test_verify_with_one_reader_process_finds_the_view_equal(view, tmp_path, capsys):
    assert _verify(tmp_path, "--workers", "1") == 0
    assert " 0 divergent" in capsys.readouterr().out


def test_verify_names_a_lost_entry_and_what_the_store_holds_of_it(view, tmp_path, capsys):
    with SQLiteStore(view, cap=CAP) as store:
        user = next(u for u in range(1, 51) if len(served(store, u, CAP)) > 1)
        entry_id, created_at, actor, *_ = served(store, user, CAP)[0]
        store.apply([Delta.timeline_remove(user, entry_id, actor, created_at)])
    assert _verify(tmp_path, "--workers", "2") == 1
    out = capsys.readouterr().out
    assert " 1 divergent" in out and f"user {user}: " in out
    assert f"store: {entry_id} (tweets row: author {actor} at {created_at}; no cache row" in out


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_verify_refuses_a_count_of_workers_below_one(tmp_path, bad, capsys):
    with pytest.raises(SystemExit):
        _verify(tmp_path, "--workers", bad)
    assert "--workers takes a count of processes, at least 1" in capsys.readouterr().err
