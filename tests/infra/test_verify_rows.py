"""Verify's kept rows (infra.verify.RowCache): read once per store position, dropped after."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from infra.verify import RowCache, compare, served
from ingest.generator import generate
from serving.pageversions import page_versions
from views.changelog import Changelog
from views.delta import Delta
from views.join import JoinConfig
from views.local import LocalJoin
from views.stores.base import ReaderProxy, TweetRow, UserRow
from views.stores.sqlite import SQLiteStore

CAP = 40


class _Counted(ReaderProxy):
    """The store, counting the ids its tweets and users reads are asked for."""

    def __init__(self, inner: SQLiteStore) -> None:
        super().__init__(inner)
        self.asked: list[int] = []

    def tweets(self, ids: Sequence[int]) -> dict[int, TweetRow]:
        self.asked += ids
        return self.inner.tweets(ids)

    def users(self, ids: Sequence[int]) -> dict[int, UserRow]:
        self.asked += ids
        return self.inner.users(ids)


@pytest.fixture
def store(tmp_path: Path):
    history = generate(40, 400, 300, seed=3)
    with SQLiteStore(tmp_path / "v.sqlite", cap=CAP) as opened:
        LocalJoin(JoinConfig.with_ratio(CAP, 100), opened).run(history.events())
        opened.history = history  # type: ignore[attr-defined]
        yield opened


def _reader_with_entries(store: SQLiteStore) -> int:
    return next(u for u in store.home_users() if len(served(store, u, CAP)) > 2)


def test_a_row_is_read_from_the_store_once_per_position(store):
    counted = _Counted(store)
    rows = RowCache(counted, page_versions(store))
    user = _reader_with_entries(store)
    first = served(rows.current(), user, CAP)
    asked = len(counted.asked)
    assert asked > 0
    assert served(rows.current(), user, CAP) == first == served(store, user, CAP)
    assert len(counted.asked) == asked  # every row kept: nothing read again
    assert rows.current().tweets([2**62]) == {}  # no such tweet: asked once, kept as missing
    assert rows.current().tweets([2**62]) == {}
    assert counted.asked.count(2**62) == 1


def test_the_rows_are_dropped_when_the_store_commits_a_change(store):
    rows = RowCache(store, page_versions(store))
    user = _reader_with_entries(store)
    entry_id, _, actor, *_ = served(rows.current(), user, CAP)[0]
    assert not rows.tweets([entry_id])[entry_id].deleted
    store.apply([Delta.tweet_deleted(entry_id, actor)])
    assert not rows.tweets([entry_id])[entry_id].deleted  # kept until asked to look again
    assert rows.current().tweets([entry_id])[entry_id].deleted
    assert entry_id not in [r[0] for r in served(rows.current(), user, CAP)]


def test_verify_through_the_kept_rows_still_finds_a_changed_tweet(store):
    log_ = Changelog(events=list(store.history.events()))
    assert compare(log_, store, CAP).divergent == 0
    user = _reader_with_entries(store)
    entry_id, _, actor, *_ = served(store, user, CAP)[0]
    store.apply([Delta.tweet_deleted(entry_id, actor)])
    result = compare(log_, store, CAP)
    assert user in result.divergent_users
