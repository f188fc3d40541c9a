"""Page-cache tokens per page, from the batches' change feed, on SQLite and Cassandra.

A cached page must be served again only while its inputs are unchanged, and must be
served again when they are: a batch that touches another user, or only the activity
log, leaves a page's token where it was; a batch that touches the page's user, or a
tweet or profile the page was decided on, moves it. The strongest check reads every
user's page through the API's own :class:`serving.reads.Pages` (page cache and tokens)
after every micro-batch of random §4b histories, and compares it with the page
rendered anew from the store, on both backends. Rows kept across pages
(:class:`serving.pageversions.CachedRows`) are a network store's (Cassandra) only.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from typing import ContextManager

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from ingest.events import Activity, Delete, Follow, Post, Repost, UserUpsert
from serving.celebrities import CelebrityCache
from serving.cursor import encode_cursor
from serving.pagecache import PageCache
from serving.pageversions import HOME, OWN, FeedVersions, page_versions
from serving.reads import Pages, Read
from serving.settings import parse_shards
from serving.timeline import AccountGone
from tests.support.cassandra import fresh_keyspace, writer_from_url
from tests.support.histories import USERS, histories, split
from views.join import JoinConfig
from views.local import LocalJoin
from views.stores.cassandra.changes import CassandraFeed, Changes
from views.stores.plan import WritePlan
from views.stores.rows import TweetRow
from views.stores.sqlite import SQLiteFeed
from views.stores.versions import ROWS_SHARD, ChangeFeed, shard

pytestmark = pytest.mark.long

T0 = 1_700_000_000_000


#: Every read asks the store what is committed: pages read right after a batch see it.
EXACT = "page_fresh_ms=0"


@pytest.fixture(params=["sqlite", "cassandra"])
def fresh_url(request: pytest.FixtureRequest) -> Callable[[], ContextManager[str]]:
    """Makes the URL of an empty store of one backend, each time it is called."""
    if request.param == "sqlite":
        @contextlib.contextmanager
        def sqlite_url() -> Iterator[str]:
            with tempfile.TemporaryDirectory() as where:
                yield f"sqlite:///{where}/pages.sqlite"
        return sqlite_url
    hosts = request.getfixturevalue("cassandra_hosts")
    return lambda: fresh_keyspace(hosts, EXACT)


def _opened(url: str, cap: int) -> Iterator:
    opened = writer_from_url(url, cap=cap).open()
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def store(fresh_url) -> Iterator:
    with fresh_url() as url:
        yield from _opened(url, 50)


@pytest.fixture
def cassandra_store(cassandra_hosts: str) -> Iterator:
    """Rows kept across pages are a network store's (``FeedVersions.reader``)."""
    with fresh_keyspace(cassandra_hosts, EXACT) as url:
        yield from _opened(url, 50)


def _pages(store, celebrities: bool = False, shards: str = "all"
           ) -> tuple[Pages, types.SimpleNamespace]:
    """The API's page answers over ``store``; with or without a celebrity cache; of the
    feed shards ``shards`` spells (``FANOUT_FEED_SHARDS``)."""
    versions = page_versions(store, parse_shards(shards))
    cache = CelebrityCache(store, depth=store.cap, version=versions.position) \
        if celebrities else None
    state = types.SimpleNamespace(store=store, versions=versions, celebrities=cache)
    return Pages(PageCache(1 << 24), freshness=None, fan_out=True), state


def _read(pages: Pages, state: types.SimpleNamespace, user: int, kind: str = HOME,
          limit: int = 20, since: str | None = None, count: bool = False) -> bytes | str:
    read = Read(state.store, user, None, limit, None, since=since, count=count)
    try:
        return pages.answer_now(state, read, kind, None)[2]
    except AccountGone:
        return "gone"


def test_a_batch_moves_only_the_tokens_of_what_it_touched(store) -> None:
    join = LocalJoin(JoinConfig(cap=50, promote_at=1000, demote_below=999), store)
    join.run([Follow(1, 10, T0), Follow(2, 20, T0), Follow(3, 20, T0),
              UserUpsert(10, "ten", "Ten", T0), UserUpsert(20, "twenty", "Twenty", T0),
              Post(100, 10, T0 + 1, "a"), Post(200, 20, T0 + 2, "b")])
    versions = page_versions(store)
    pages, state = _pages(store)
    first = {u: _read(pages, state, u) for u in (1, 2, 3)}
    tokens = {u: versions.check(HOME, u)[1] for u in (1, 2, 3)}

    join.run([Post(201, 20, T0 + 3, "only 20's followers see this")])
    assert versions.check(HOME, 1)[1] == tokens[1]
    assert versions.check(HOME, 2)[1] != tokens[2] and versions.check(HOME, 3)[1] != tokens[3]
    hits = pages.cache.hits
    assert _read(pages, state, 1) == first[1] and pages.cache.hits == hits + 1

    join.run([Activity(1, T0 + 4), Activity(2, T0 + 4)])  # reads never invalidate pages
    tokens = {u: versions.check(HOME, u)[1] for u in (1, 2, 3)}
    assert all(versions.check(HOME, u)[1] == tokens[u] for u in (1, 2, 3))

    join.run([UserUpsert(10, "ten", "Ten renamed", T0 + 5)])  # on user 1's page only
    assert versions.check(HOME, 2)[1] == tokens[2]
    assert b"Ten renamed" in _read(pages, state, 1)
    versions.close()


def test_a_deleted_original_leaves_every_page_that_showed_it(store) -> None:
    """User 1 sees 30's post only through 20's repost: 1 is in no fan-out of 30's delete."""
    join = LocalJoin(JoinConfig(cap=50, promote_at=1000, demote_below=999), store)
    join.run([Follow(1, 20, T0), Post(300, 30, T0 + 1, "original"),
              Repost(301, 20, 300, 30, T0 + 2)])
    pages, state = _pages(store)
    assert b'"repost"' in _read(pages, state, 1)
    join.run([Delete(300, 30, T0 + 3)])
    assert b'"repost"' not in _read(pages, state, 1)
    assert b'"original"' not in _read(pages, state, 30, kind=OWN)


def test_rows_kept_across_pages_go_when_a_batch_names_them(cassandra_store) -> None:
    store = cassandra_store
    # Users 1 and 2 follow 10: user 2's first page reads the rows user 1's page read
    # from the kept ones, unless a batch renamed 10 or deleted 100 in between.
    join = LocalJoin(JoinConfig(cap=50, promote_at=1000, demote_below=999), store)
    join.run([*(Follow(u, 10, T0) for u in (1, 2, 3)),
              *(UserUpsert(u, f"u{u}", f"U{u}", T0) for u in (1, 2, 3)),
              UserUpsert(10, "ten", "Ten", T0), Post(100, 10, T0 + 1, "kept"),
              Post(101, 10, T0 + 2, "other")])
    pages, state = _pages(store)
    assert b"kept" in _read(pages, state, 1)
    misses, hits = state.versions.row_misses, state.versions.row_hits
    assert b"kept" in _read(pages, state, 2)
    # Only its reader's own profile was not kept; tweets 100, 101, profile 10, and that
    # neither tweet has a repost, were.
    assert state.versions.row_misses == misses + 1
    assert state.versions.row_hits == hits + 5
    join.run([UserUpsert(10, "ten", "Ten renamed", T0 + 5), Delete(101, 10, T0 + 6)])
    page = _read(pages, state, 3)
    assert b"Ten renamed" in page and b"kept" in page and b"other" not in page
    assert state.versions.row_misses == misses + 3  # its reader's profile, and 10's again
    state.versions.close()


def test_a_new_repost_drops_its_originals_kept_reposts_and_only_its_readers_pages(
        store) -> None:
    # Users 1 and 2 follow 10 and 20, user 3 only 10. User 1's page asks for 100's
    # reposts (none: kept); then 20 reposts it: user 2's first page shows the repost, not
    # the post, while user 3's page, which cannot see 20's repost, stays valid.
    join = LocalJoin(JoinConfig(cap=50, promote_at=1000, demote_below=999), store)
    join.run([*(Follow(u, a, T0) for u in (1, 2) for a in (10, 20)), Follow(3, 10, T0),
              *(UserUpsert(u, f"u{u}", f"U{u}", T0) for u in (1, 2, 3, 10, 20)),
              Post(100, 10, T0 + 1, "original")])
    pages, state = _pages(store)
    assert b'"post"' in _read(pages, state, 1)
    assert b'"post"' in _read(pages, state, 3)
    token = state.versions.check(HOME, 3)[1]
    join.run([Repost(101, 20, 100, 10, T0 + 2)])
    page = _read(pages, state, 2)
    assert b'"repost"' in page and b'"post"' not in page
    assert state.versions.check(HOME, 3)[1] == token
    hits = pages.cache.hits
    assert b'"post"' in _read(pages, state, 3) and pages.cache.hits == hits + 1
    state.versions.close()


def test_kept_reposts_answer_any_bound_at_or_above_their_own(cassandra_store) -> None:
    store = cassandra_store
    join = LocalJoin(JoinConfig(cap=50, promote_at=1000, demote_below=999), store)
    join.run([Post(100, 10, T0 + 1, "original"),
              *(Repost(100 + i, 10 + i, 100, 10, T0 + 10 * i) for i in range(1, 4))])
    versions = page_versions(store)
    reader = versions.reader(store)
    versions.position()
    keys = [(T0 + 10 * i, 100 + i) for i in range(1, 4)]
    assert [e.tweet_id for e in reader.reposts_of([100], {100: keys[0]})[100]] == [103, 102]
    misses, hits = versions.row_misses, versions.row_hits
    assert [e.tweet_id for e in reader.reposts_of([100], {100: keys[1]})[100]] == [103]
    assert reader.reposts_of([100], {100: keys[2]}) == {}
    assert (versions.row_misses, versions.row_hits) == (misses, hits + 2)
    # A lower bound than the kept one is read again, and kept instead.
    assert [e.tweet_id for e in reader.reposts_of([100], {100: (T0, 0)})[100]] == [103, 102,
                                                                                   101]
    assert versions.row_misses == misses + 1
    assert [e.tweet_id for e in reader.reposts_of([100], {100: keys[0]})[100]] == [103, 102]
    assert versions.row_misses == misses + 1
    join.run([Repost(105, 15, 100, 10, T0 + 50)])
    versions.position()
    assert [e.tweet_id for e in reader.reposts_of([100], {100: keys[2]})[100]] == [105]
    versions.close()


def test_kept_followees_go_when_their_reader_follows_or_unfollows(cassandra_store) -> None:
    store = cassandra_store
    join = LocalJoin(JoinConfig(cap=50, promote_at=1000, demote_below=999), store)
    join.run([Follow(1, 10, T0), Follow(2, 10, T0)])
    versions = page_versions(store)
    reader = versions.reader(store)
    versions.position()
    assert reader.followees(1) == [10] and reader.followees(2) == [10]
    misses = versions.row_misses
    assert reader.followees(1) == [10] and versions.row_misses == misses
    join.run([Follow(1, 20, T0 + 1)])
    versions.position()
    assert sorted(reader.followees(1)) == [10, 20] and versions.row_misses == misses + 1
    assert reader.followees(2) == [10] and versions.row_misses == misses + 1
    join.run([Follow(1, 10, T0 + 2, active=False)])
    versions.position()
    assert reader.followees(1) == [20]
    versions.close()


def test_a_store_read_in_process_keeps_no_rows_across_pages(store) -> None:
    """SQLite: rows are read in a snapshot in microseconds, and its reposts_of filters by
    the reader, so pages read the store itself; Cassandra: the kept rows."""
    versions = page_versions(store)
    assert isinstance(versions, FeedVersions)
    assert (versions.reader(store) is store) == store.reads_in_process
    versions.close()


def test_a_reader_behind_the_sqlite_feeds_trim_forgets_everything(tmp_path, monkeypatch
                                                                  ) -> None:
    """The feed keeps the last FEED_BATCHES rows: a reader further behind gets None (a
    new epoch), one within it the rows it missed."""
    from views.stores import sqlite

    monkeypatch.setattr(sqlite, "FEED_BATCHES", 3)
    store = writer_from_url(f"sqlite:///{tmp_path}/trim.sqlite", cap=50).open()
    join = LocalJoin(JoinConfig(cap=50, promote_at=1000, demote_below=999), store)
    feed = store.version()
    assert isinstance(feed, SQLiteFeed)
    try:
        for i in range(5):
            join.run([Post(100 + i, 10 + i, T0 + i, "x")])
        assert feed.position() == 5
        assert store._conn().execute("SELECT count(*) FROM page_changes").fetchone()[0] == 3
        assert feed.since(1, 5) is None and feed.since(None, 5) is None
        got = feed.since(3, 5)
        assert got is not None and [(seq, c.authors) for seq, c in got] == [
            (4, {13}), (5, {14})]
        join.run([Activity(10, T0 + 9)])  # reads change no page: no row
        assert feed.position() == 5
    finally:
        feed.close()
        store.close()


def test_changes_of_a_plan_name_users_authors_and_rows() -> None:
    plan = WritePlan()
    plan.follows[(1, 2)] = None  # type: ignore[assignment]
    plan.relations[(3, 4, "block")] = None  # type: ignore[assignment]
    plan.users[5] = None  # type: ignore[assignment]
    changes = Changes.of(plan)
    assert changes.homes == {1, 3, 4} and changes.users == {5} and not changes.tweets
    assert _decoded(changes.ops(7)) == changes
    assert not Changes.of(WritePlan())
    plan = WritePlan()
    plan.reposts[11] = TweetRow(11, 2, 5, "", False, original_id=10, original_author=1)
    changes = Changes.of(plan, moved={9})
    assert changes.tweets == {11} and changes.originals == {9, 10} and changes.homes == set()
    assert _decoded(changes.ops(7)) == changes


def _decoded(ops: list) -> Changes:
    """The changes a writer's ``changes_add`` rows hold, merged as the feed reads them;
    each row in its shard (a shard's row: only its users' homes)."""
    merged = Changes()
    for name, values in ops:
        row = Changes.decode(values[4:10])
        assert name == "changes_add" and values[2] == 7
        if values[1] == ROWS_SHARD:
            assert not row.homes
        else:
            assert row.homes and {shard(u) for u in row.homes} == {values[1]}
            assert row == Changes(homes=row.homes)
        merged = merged.merged(row)
    return Changes(merged.homes, merged.authors, merged.tweets, merged.users,
                   merged.everything, merged.originals)


#: Positions to read what is new above: below everything, and mid-history (times 0-8).
SINCE = (encode_cursor((0, 0)), encode_cursor((5, 0)))


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(history=histories(max_size=40), seed=st.integers(0, 2**32),
       cuts=st.lists(st.integers(0, 200), min_size=2, max_size=6), cap=st.integers(1, 6),
       celebrities=st.booleans())
def test_cached_pages_equal_pages_rendered_anew_after_every_batch(
        fresh_url, history, seed, cuts, cap, celebrities) -> None:
    """With a celebrity cache (refreshed after each batch, as its thread would) or
    without one (celebrities' tweets read from the store)."""
    rng = random.Random(seed)
    arrivals = history + rng.sample(history, k=len(history) // 3)
    rng.shuffle(arrivals)
    batches = split(arrivals, cuts)
    note(f"batches: {batches}")
    with fresh_url() as url:
        store = writer_from_url(url, cap=cap).open()
        try:
            join = LocalJoin(JoinConfig(cap, 3, 2), store)
            pages, state = _pages(store, celebrities)
            for batch in batches:
                join.run(batch)
                if state.celebrities is not None:
                    state.celebrities.refresh()
                for user in USERS:
                    for kind, limit in ((HOME, 2), (HOME, 20), (OWN, 20)):
                        cached = _read(pages, state, user, kind, limit)
                        read = Read(store, user, None, limit, None)
                        try:
                            anew = read.body(pages._page_fn(state, read, kind), None)
                        except AccountGone:
                            anew = "gone"
                        assert cached == anew, f"user {user}, {kind}, limit {limit}"
                    # What is new above a position, and how many: cached under the
                    # home's token, so the same batches must invalidate them.
                    for since, limit, count in itertools.product(SINCE, (2, 20), (False, True)):
                        cached = _read(pages, state, user, HOME, limit, since, count)
                        read = Read(store, user, None, limit, None, since=since, count=count)
                        try:
                            anew = read.body(pages._page_fn(state, read, HOME), None)
                        except AccountGone:
                            anew = "gone"
                        assert cached == anew, f"user {user}, since {since}, limit {limit}"
        finally:
            state.versions.close()
            store.close()


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(history=histories(max_size=40), seed=st.integers(0, 2**32),
       cuts=st.lists(st.integers(0, 200), min_size=2, max_size=6), cap=st.integers(1, 6),
       shards=st.sampled_from(["1/2", "0/2", "14"]))
def test_a_process_of_some_shards_serves_every_page_exactly_caching_only_its_own(
        fresh_url, history, seed, cuts, cap, shards) -> None:
    """A process reading some feed shards (Cassandra: only their rows) serves every
    user's page as rendered anew after every batch; a page outside its shards is never
    served from the cache, a page inside is when no batch touched it. (USERS' shards:
    1, 14, 13, 10, 7: each spelling holds some and not others.)"""
    rng = random.Random(seed)
    arrivals = history + rng.sample(history, k=len(history) // 3)
    rng.shuffle(arrivals)
    batches = split(arrivals, cuts)
    note(f"batches: {batches}")
    mine = parse_shards(shards)
    assert mine is not None and 0 < sum(shard(u) in mine for u in USERS) < len(USERS)
    with fresh_url() as url:
        store = writer_from_url(url, cap=cap).open()
        try:
            join = LocalJoin(JoinConfig(cap, 3, 2), store)
            pages, state = _pages(store, shards=shards)
            for batch in batches:
                join.run(batch)
                for user in USERS:
                    for kind, limit in ((HOME, 2), (HOME, 20), (OWN, 20)):
                        read = Read(store, user, None, limit, None)
                        try:
                            anew = read.body(pages._page_fn(state, read, kind), None)
                        except AccountGone:
                            anew = "gone"
                        hits = pages.cache.hits
                        assert _read(pages, state, user, kind, limit) == anew, \
                            f"user {user}, {kind}, limit {limit}"
                        assert _read(pages, state, user, kind, limit) == anew
                        held = anew != "gone" and shard(user) in mine
                        assert (pages.cache.hits > hits) == held, (user, kind)
        finally:
            state.versions.close()
            store.close()


def test_reads_within_the_window_share_one_question(cassandra_hosts: str) -> None:
    """With page_fresh_ms, reads in one window ask the store once; a read that arrives
    a window after a commit sees it."""
    with _windowed(cassandra_hosts, WINDOW_MS, Post(100, 10, T0 + 1, "a")) as (join, pages,
                                                                              state):
        state.later()
        first = _read(pages, state, 1)
        asked = state.versions.questions
        assert all(_read(pages, state, 1) == first for _ in range(20))
        assert state.versions.questions == asked  # one window: no new question
        join.run([Post(101, 10, T0 + 2, "b")])
        assert b'"101"' not in _read(pages, state, 1)  # still the window's answer
        state.later()
        assert b'"101"' in _read(pages, state, 1)
        assert state.versions.questions == asked + 1


#: The answer window of the tests that hold reads to it. Their versions read a clock the
#: test moves by hand (``state.later()``: past one window), so what must happen within
#: one window does however slowly the worker runs.
WINDOW_MS = 2000


@contextlib.contextmanager
def _windowed(cassandra_hosts: str, window_ms: int, post: Post
              ) -> Iterator[tuple[LocalJoin, Pages, types.SimpleNamespace]]:
    """A store whose answer window is ``window_ms``, user 1 following 10, who posted ``post``;
    its page versions on a clock that ``state.later()`` moves one window and a little on."""
    with fresh_keyspace(cassandra_hosts, f"page_fresh_ms={window_ms}") as url:
        store = writer_from_url(url, cap=50).open()
        try:
            join = LocalJoin(JoinConfig(cap=50, promote_at=1000, demote_below=999), store)
            join.run([Follow(1, 10, T0), post])
            now = [1000.0]
            feed = store.version()
            assert isinstance(feed, ChangeFeed)
            versions = FeedVersions(store, feed.for_shards(None), clock=lambda: now[0])

            def later() -> None:
                now[0] += window_ms / 1000 * 1.05

            state = types.SimpleNamespace(store=store, versions=versions, celebrities=None,
                                          later=later)
            try:
                yield join, Pages(PageCache(1 << 24), freshness=None, fan_out=True), state
            finally:
                versions.close()
        finally:
            store.close()


def test_a_cached_page_is_answered_without_waiting_only_within_the_window(
        cassandra_hosts: str) -> None:
    """On the event loop (no worker thread): a cached page whose token is known without
    asking the store, that is within the answer window; never a page a batch moved."""
    with _windowed(cassandra_hosts, WINDOW_MS, Post(100, 10, T0 + 1, "first")) as (join, pages,
                                                                                    state):
        read = Read(state.store, 1, None, 20, None)
        assert pages.answer_cached(state, read, HOME, None) is None  # not cached yet
        assert (pages.cache.hits, pages.cache.misses) == (0, 0)  # the worker's look counts
        body = pages.answer_now(state, read, HOME, None)[2]
        cached = pages.answer_cached(state, read, HOME, None)
        assert cached is not None and cached[2] == body
        assert (pages.cache.hits, pages.cache.misses) == (1, 1)
        state.later()  # the window passed: only the store can say what is committed
        assert pages.answer_cached(state, read, HOME, None) is None
        join.run([Post(101, 10, T0 + 2, "second")])
        assert b"second" in pages.answer_now(state, read, HOME, None)[2]
        cached = pages.answer_cached(state, read, HOME, None)
        assert cached is not None and b"second" in cached[2]


def test_refreshed_tokens_are_known_without_waiting_while_pages_are_read(
        cassandra_hosts: str) -> None:
    """``refresh`` (what ``keep_fresh``'s thread runs every half window) asks again once
    the answer is half a window old and a page was read within the last two windows."""
    with fresh_keyspace(cassandra_hosts, "page_fresh_ms=400") as url:
        store = writer_from_url(url, cap=50).open()
        now = [1000.0]
        versions = FeedVersions(store, CassandraFeed(store, store._rows, 0.4),
                                clock=lambda: now[0])
        try:
            versions.check(HOME, 1)  # a read: the first question
            asked = versions.questions
            now[0] += 0.3
            assert versions.check_now(HOME, 1) is not None  # within the window
            versions.refresh()  # the answer is 0.3 s old: asked again
            assert versions.questions == asked + 1
            now[0] += 0.3
            assert versions.check_now(HOME, 1) is not None  # 0.6 s after the first question
            now[0] += 0.5
            assert versions.check_now(HOME, 1) is None  # no refresh: stale, the store must say
            now[0] += 0.9
            versions.refresh()  # no read for over two windows: nothing asked
            assert versions.questions == asked + 1
            versions.check_now(HOME, 1)
            now[0] += 0.7
            versions.refresh()  # a read 0.7 s ago, within two windows: asked
            assert versions.questions == asked + 2
        finally:
            versions.close()
            store.close()


def test_keep_fresh_runs_until_closed(cassandra_hosts: str) -> None:
    with fresh_keyspace(cassandra_hosts, "page_fresh_ms=100") as url:
        store = writer_from_url(url, cap=50).open()
        versions = page_versions(store)
        try:
            versions.keep_fresh()
            versions.check(HOME, 1)
            deadline = time.monotonic() + 30
            while versions.questions < 3 and time.monotonic() < deadline:
                versions.check_now(HOME, 1)  # reads keep it refreshing
                time.sleep(0.02)
            assert versions.questions >= 3
        finally:
            versions.close()
            store.close()
        assert versions._refresher is not None
        versions._refresher.join(60)  # close() waits 5 s; a starved node's query may take longer
        assert not versions._refresher.is_alive()
