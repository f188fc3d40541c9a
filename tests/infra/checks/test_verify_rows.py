"""Verify's kept rows (infra.checks.verify.RowCache): read once per store position, dropped after."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.checks.verify import RowCache, compare, served
from ingest.generator import generate
from ingest.social import SOCIAL
from serving.pageversions import page_versions
from views.changelog import Changelog
from views.delta import TOP, Delta, Key
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


# -- the rows kept across users answer as the store does ------------------------------------

@pytest.fixture(scope="module")
def social(tmp_path_factory):
    """A store of a social history (reposts, blocks, mutes) with trimmed timelines."""
    history = generate(60, 900, 700, seed=5, mix=SOCIAL)
    path = tmp_path_factory.mktemp("social") / "v.sqlite"
    with SQLiteStore(path, cap=CAP) as opened:
        LocalJoin(JoinConfig.with_ratio(CAP, 20), opened).run(history.events())
        yield opened


def _tweets(store: SQLiteStore) -> list[TweetRow]:
    with contextlib.closing(sqlite3.connect(store.path)) as db:
        ids = [i for (i,) in db.execute("SELECT tweet_id FROM tweets")]
    return list(store.tweets(ids).values())


def _keys(store: SQLiteStore) -> list[Key]:
    """Positions to read below: every tweet's, one past it, and the top."""
    return [TOP] + sorted({(r.created_at, r.tweet_id + d) for r in _tweets(store)
                           for d in (0, 1)})


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_kept_rows_read_as_the_store_reads(social, data):
    """Each read through RowCache equals the store's, in any order of reads and users."""
    rows = RowCache(social, page_versions(social)).current()
    keys, users = _keys(social), range(0, 62)
    originals = sorted({r.original_id for r in _tweets(social) if r.original_id}) + [1, 0]
    for _ in range(data.draw(st.integers(1, 12))):
        user = data.draw(st.sampled_from(users))
        below, limit = data.draw(st.sampled_from(keys)), data.draw(st.integers(1, 3 * CAP))
        read = data.draw(st.sampled_from(["cached", "authors", "reposts", "start", "own"]))
        if read == "cached":
            assert rows.cached(user, below, limit) == social.cached(user, below, limit)
        elif read == "authors":
            authors = data.draw(st.lists(st.sampled_from(users), max_size=6, unique=True))
            assert rows.author_tweets(authors, below, limit) \
                == social.author_tweets(authors, below, limit)
        elif read == "reposts":
            asked = data.draw(st.lists(st.sampled_from(originals), max_size=8))
            above = {o: data.draw(st.sampled_from(keys[1:])) for o in asked
                     if data.draw(st.booleans())}
            reader = data.draw(st.none() | st.sampled_from(users))
            assert rows.reposts_of(asked, above, reader) \
                == social.reposts_of(asked, above, reader)
        elif read == "start":
            assert rows.home_start(user, below, limit) == social.home_start(user, below, limit)
        else:
            assert (rows.horizon(user), rows.celebrities_followed(user), rows.relations(user),
                    rows.followees(user)) == (social.horizon(user),
                                              social.celebrities_followed(user),
                                              social.relations(user), social.followees(user))


def test_every_user_is_served_the_same_through_the_kept_rows(social):
    rows = RowCache(social, page_versions(social))
    users = social.home_users()
    assert any(social.horizon(u) is not None for u in users)  # reads below a horizon too
    assert any(social.celebrities_followed(u) for u in users)
    for n in (1, 7, CAP):
        assert [served(rows.current(), u, n) for u in users] \
            == [served(social, u, n) for u in users]


def test_the_kept_lists_are_dropped_when_the_store_commits_a_change(store):
    rows = RowCache(store, page_versions(store))
    user = _reader_with_entries(store)
    first = rows.current().cached(user, None, CAP)[0]
    author = rows.current().author_tweets([first.author_id], None, 1)[0]
    store.apply([Delta.timeline_remove(user, first.tweet_id, first.author_id, first.created_at),
                 Delta.tweet_deleted(author.tweet_id, author.author_id)])
    assert rows.cached(user, None, 1) == [first]  # kept until asked to look again
    assert rows.current().cached(user, None, CAP) == store.cached(user, None, CAP)
    assert first not in rows.cached(user, None, CAP)
    assert rows.author_tweets([first.author_id], None, CAP) \
        == store.author_tweets([first.author_id], None, CAP)
