"""DESIGN §4b end to end without Spark: the join into a SQLite store, read as served.

Random histories over a small id space — posts and replies, deletes (of posts and of
reposts), reposts (of one tweet by several users, twice by one user, of deleted
tweets, of reposts, naming the wrong author), unreposts, follows, blocks, mutes,
account deletes and profiles — are duplicated, applied twice, shuffled and cut into
micro-batches, run through
:class:`views.local.LocalJoin` with small caps and celebrity thresholds (so trims,
horizons and both author paths are exercised) and read page by page, small pages so
cursors are crossed, by every read path: the cache (``home_page``), the cache with
the celebrity cache, and fan-out on read (``read_time_page``). Every served entry
must equal :class:`views.reference.Reference` — the literal §4b SQL — field by
field. The focused examples below are the cases DESIGN §4b lists, each checked against
both a hand-written expectation and the reference, on the fan-out and celebrity
paths. Two kinds of input the join path once got wrong — a repost id duplicated
with other fields, a delete under another author's id in its post's batch — are
generated behind :data:`VARIED_DUPLICATES` and :data:`FORGED_DELETES` (both on, in
``tests/support/histories.py``) and pinned by the examples at the end.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from infra.checks.verify import _describe as describe
from infra.checks.verify import compare
from ingest.events import (
    BLOCK,
    MUTE,
    AccountDelete,
    Delete,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
    UserUpsert,
)
from serving.celebrities import CelebrityCache
from serving.errors import NotFound
from serving.timeline import PageFn, home_page, home_top, read_time_page
from tests.support.histories import ALL, USERS, histories, scenarios, split
from views.changelog import Changelog
from views.delta import Delta
from views.join import JoinConfig
from views.local import LocalJoin
from views.reference import HomeRow, Reference
from views.stores.contract import BatchStats, Store
from views.stores.sqlite import SQLiteStore

Row = tuple[int, int, int, int, int]


# -- running and reading -----------------------------------------------------------------------

class Twice:
    """Applies every micro-batch twice, as after a crash between the sink and the checkpoint."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def apply(self, deltas: Iterable, batch_id: int = -1) -> BatchStats:
        deltas = list(deltas)
        self.store.apply(deltas, batch_id)
        return self.store.apply(deltas, batch_id)


def run(config: JoinConfig, batches: Iterable[Sequence[Event]], slack: int = 0,
        replay: bool = False) -> Store:
    """The store the join leaves after ``batches``."""
    store = SQLiteStore(":memory:", cap=config.cap, trim_slack=slack).open()
    join = LocalJoin(config, Twice(store) if replay else store)  # type: ignore[arg-type]
    for batch in batches:
        join.run(batch)
    return store


def served(store: Store, user: int, page_fn: PageFn, page_size: int, n: int = ALL) -> list[Row]:
    """Every entry ``user`` is served, read page by page, as the reference's tuples."""
    return [(e.tweet_id, e.created_at, e.author_id, e.original_id, e.original_author)
            for e in home_top(store, user, n, page_size=page_size, page_fn=page_fn)]


def paths(store: Store, depth: int = 2) -> dict[str, PageFn]:
    """The read paths that must agree: cache, cache with celebrity cache, on read."""
    cache = CelebrityCache(store, depth=depth)
    cache.refresh()
    return {"cache": home_page, "celebrity cache": functools.partial(home_page, celebrities=cache),
            "on read": read_time_page}


def check(store: Store, history: Sequence[Event], page_size: int, depth: int = 2) -> None:
    """Every live user, every read path: served entries equal the reference's."""
    ref = Reference().add(history)
    for user in USERS:
        if ref.is_deleted(user):
            continue  # not served (DESIGN §4b); test_a_deleted_account_is_not_served
        want = [tuple(row) for row in ref.home(user, ALL)]
        event(f"user {user % 100}: {min(len(want), 5)}+ entries")
        event(f"entries of kind {sorted({_kind(r, ref) for r in want})}")
        for name, page_fn in paths(store, depth).items():
            got = served(store, user, page_fn, page_size)
            assert got == want, f"user {user}, {name}, pages of {page_size}"
        replies = {e.original_id: e.reply_to for e in home_top(store, user, ALL)}
        assert replies == {o: _reply_to(ref, o) for o in replies}, f"user {user}: reply_to"


def _kind(row: Row, ref: Reference) -> str:
    if row[0] != row[3]:
        return "repost"
    return "reply" if _reply_to(ref, row[3]) else "post"


def _reply_to(ref: Reference, original: int) -> int:
    found = ref.post(original)
    return found.in_reply_to_user_id if found else -1


# -- the property ------------------------------------------------------------------------------

@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), seed=st.integers(0, 2**32),
       cuts=st.lists(st.integers(0, 200), max_size=6), cap=st.integers(1, 6), promote_at=st.integers(1, 4), demote_gap=st.integers(0, 2),
       slack=st.integers(0, 3), page_size=st.integers(1, 4), depth=st.integers(1, 4),
       replay=st.booleans())
def test_served_pages_equal_the_4b_sql(history, seed, cuts, cap, promote_at, demote_gap,
                                       slack, page_size, depth, replay):
    rng = random.Random(seed)
    arrivals = history + rng.sample(history, k=len(history) // 3)  # duplicates
    rng.shuffle(arrivals)  # out of order
    config = JoinConfig(cap, promote_at, max(1, promote_at - demote_gap))
    batches = split(arrivals, cuts)
    note(f"{config}, slack {slack}, replay {replay}\nbatches: {batches}")
    store = run(config, batches, slack, replay)
    event(f"celebrities: {len(store.celebrities())}")
    event(f"trimmed timelines: {sum(store.horizon(u) is not None for u in USERS)}")
    event(f"{len(batches)} micro-batches")
    check(store, history, page_size, depth)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), cap=st.integers(1, 4), promote_at=st.integers(1, 4),
       limit=st.integers(1, 3), user=st.sampled_from(USERS))
def test_each_page_is_the_query_below_its_cursor_under_concurrent_writes(
        scenario, cap, promote_at, limit, user):
    """Stable cursors: between pages, reposts, blocks, mutes and deletes land."""
    before, during = scenario
    store = SQLiteStore(":memory:", cap=cap, trim_slack=0).open()
    join = LocalJoin(JoinConfig(cap, promote_at, max(1, promote_at - 1)), store)
    history = list(before)
    join.run(before)
    below, seen, writes = None, [], iter(during)
    while True:
        ref = Reference().add(history)
        if ref.is_deleted(user):
            return
        page = home_page(store, user, below, limit)
        everything = [tuple(r) for r in ref.home(user, ALL)]
        want = [r for r in everything if below is None or (r[1], r[0]) < below][:limit]
        assert [(e.tweet_id, e.created_at, e.author_id, e.original_id, e.original_author)
                for e in page.entries] == want
        seen += [e.key for e in page.entries]
        if page.next_key is None:
            break
        below = page.next_key
        batch = next(writes, [])
        history += batch
        join.run(batch)
    assert seen == sorted(set(seen), reverse=True), "pages repeat or go out of order"


# -- the reference alone, by hand ----------------------------------------------------------------

def block(user: int, other: int, at: int = 0, on: bool = True) -> Relation:
    return Relation(user, other, at, BLOCK, active=on)


def mute(user: int, other: int, at: int = 0, on: bool = True) -> Relation:
    return Relation(user, other, at, MUTE, active=on)


def rows(ref: Reference, user: int) -> list[Row]:
    return [tuple(r) for r in ref.home(user, ALL)]


@settings(max_examples=500, deadline=None)
@given(history=histories(), n=st.sampled_from([1, 2, 3, 5, ALL]))
def test_reference_fast_evaluation_equals_the_literal_sql(history, n):
    """What verify runs at scale (newest first, stopping at n) is the literal query's rows."""
    ref = Reference().add(history)
    for user in USERS:
        assert ref.home_fast(user, n) == ref.home(user, n), f"user {user}"


def test_reference_one_entry_per_original_the_newest_appearance():
    ref = Reference().add([Follow(9, 1, 0), Follow(9, 2, 0), Follow(9, 3, 0),
                           Post(10, 1, 5, "a"), Repost(30, 2, 10, 1, 7), Repost(31, 3, 10, 1, 6),
                           Repost(32, 4, 10, 1, 9)])  # 4 is not followed
    assert rows(ref, 9) == [(30, 7, 2, 10, 1)]


def test_reference_earliest_live_repost_and_undo_by_unrepost_or_delete():
    base = [Follow(9, 2, 0), Post(10, 1, 1, "a"), Repost(30, 2, 10, 1, 5),
            Repost(31, 2, 10, 1, 3), Repost(32, 2, 10, 1, 4)]
    assert rows(Reference().add(base), 9) == [(31, 3, 2, 10, 1)]
    undone = Reference().add([*base, Unrepost(31, 2, 9), Delete(32, 2, 0)])
    assert rows(undone, 9) == [(30, 5, 2, 10, 1)]
    # An undo under another user's id undoes nothing.
    assert rows(Reference().add([*base, Unrepost(31, 3, 9)]), 9) == [(31, 3, 2, 10, 1)]


def test_reference_duplicated_repost_ids_count_the_smallest():
    ref = Reference().add([Follow(9, 2, 0), Post(10, 1, 1, "a"), Post(11, 1, 1, "b"),
                           Repost(30, 2, 11, 1, 4), Repost(30, 2, 10, 1, 4),
                           Repost(30, 2, 10, 1, 6)])
    assert rows(ref, 9) == [(30, 4, 2, 10, 1)]


def test_reference_repost_needs_a_live_post_by_the_named_author():
    base = [Follow(9, 2, 0), Post(10, 1, 1, "a"), Repost(31, 3, 10, 1, 2)]
    for bad in (Repost(30, 2, 10, 4, 5),      # the wrong author
                Repost(30, 2, 31, 3, 5),      # a repost of a repost
                Repost(30, 2, 99, 1, 5)):     # a tweet never posted
        assert rows(Reference().add([*base, bad]), 9) == [], bad
    gone = Reference().add([*base, Repost(30, 2, 10, 1, 5), Delete(10, 1, 9)])
    assert rows(gone, 9) == []
    mine = Reference().add([Follow(1, 2, 0), Post(10, 1, 1, "a"), Repost(30, 2, 10, 1, 5)])
    assert rows(mine, 1) == []


def test_reference_replies_to_u_the_author_or_a_followee():
    ref = Reference().add([Follow(9, 1, 0), Follow(9, 2, 0), block(9, 2),
                           Post(10, 1, 1, "to u", 9), Post(11, 1, 2, "to 2, blocked", 2),
                           Post(12, 1, 3, "to 3, not followed", 3), Post(13, 1, 4, "plain"),
                           Follow(9, 4, 0), Post(14, 1, 5, "to 4", 4)])
    assert [r[0] for r in rows(ref, 9)] == [14, 13, 10]


def test_reference_relations_newest_wins_and_the_un_op_wins_a_tie():
    base = [Follow(9, 1, 0), Post(10, 1, 1, "a")]
    assert rows(Reference().add([*base, block(9, 1, 3), block(9, 1, 3, on=False)]), 9) != []
    assert rows(Reference().add([*base, block(9, 1, 4), block(9, 1, 3, on=False)]), 9) == []
    assert rows(Reference().add([*base, block(1, 9, 4)]), 9) == []  # blocks act both ways
    assert rows(Reference().add([*base, mute(9, 1, 2), mute(9, 1, 2, on=False)]), 9) != []
    assert rows(Reference().add([*base, mute(1, 9, 2)]), 9) != []  # mutes are one way
    # Unblocking restores an edge that was never unfollowed.
    assert rows(Reference().add([*base, block(9, 1, 2), block(9, 1, 5, on=False)]), 9) != []


def test_reference_account_delete_is_sticky():
    history = [Follow(9, 1, 0), Follow(8, 9, 0), Post(10, 1, 1, "a"), AccountDelete(1, 0),
               UserUpsert(1, "back", "Back", 5)]
    ref = Reference().add(history)
    assert rows(ref, 9) == [] and ref.is_deleted(1)
    gone = Reference().add([*history, AccountDelete(9, 3)])
    assert gone.users() == [8] and 9 in Reference().add(history).users()


# -- focused examples: DESIGN §4b --------------------------------------------------------

NORMAL = JoinConfig(cap=3, promote_at=100, demote_below=80)
CELEBRITY = JoinConfig(cap=3, promote_at=1, demote_below=1)  # every author on the read path
CONFIGS = pytest.mark.parametrize("config", [NORMAL, CELEBRITY], ids=["fan-out", "celebrity"])
U, A, B, C, V = 1, 2, 3, 4, 5


class Timeline:
    """A history applied batch by batch; :meth:`expect` checks one user after each step."""

    def __init__(self, config: JoinConfig, path: str | Path = ":memory:") -> None:
        self.config = config
        self.history: list[Event] = []
        self.store = SQLiteStore(path, cap=config.cap, trim_slack=0).open()
        self.join = LocalJoin(config, self.store)

    def run(self, *batch: Event) -> Timeline:
        self.history += batch
        self.join.run(batch)
        return self

    def expect(self, user: int, want: list[Row]) -> None:
        """``want`` is the reference's answer and what every path serves, in any page size."""
        assert rows(Reference().add(self.history), user) == want, "the reference"
        for size in (1, 2, 5):
            for name, page_fn in paths(self.store).items():
                assert served(self.store, user, page_fn, size) == want, f"{name}, pages of {size}"


def followed(*authors: int, by: int = U) -> list[Event]:
    return [Follow(by, a, 0) for a in authors]


@CONFIGS
def test_a_repost_of_a_tweet_already_visible_moves_it_up_once(config):
    t = Timeline(config).run(*followed(A, B), Post(10, A, 1, "a"), Post(11, A, 2, "b"))
    t.expect(U, [(11, 2, A, 11, A), (10, 1, A, 10, A)])
    t.run(Repost(30, B, 10, A, 5))
    t.expect(U, [(30, 5, B, 10, A), (11, 2, A, 11, A)])
    t.run(Unrepost(30, B, 6))
    t.expect(U, [(11, 2, A, 11, A), (10, 1, A, 10, A)])


@CONFIGS
def test_two_followees_reposting_one_tweet_show_it_once(config):
    t = Timeline(config).run(*followed(B, C), Post(10, A, 1, "a"), Repost(30, B, 10, A, 5),
                             Repost(31, C, 10, A, 7), Repost(32, V, 10, A, 9))
    t.expect(U, [(31, 7, C, 10, A)])
    t.run(Delete(31, C, 8))  # undone by a delete of the repost
    t.expect(U, [(30, 5, B, 10, A)])
    t.run(Repost(33, B, 10, A, 4))  # B's earlier repost takes over
    t.expect(U, [(33, 4, B, 10, A)])
    t.run(Delete(10, A, 9))  # the original goes: every repost of it goes
    t.expect(U, [])


@CONFIGS
def test_a_double_repost_by_one_user_is_a_no_op_until_the_first_is_undone(config):
    t = Timeline(config).run(*followed(B), Post(10, A, 1, "a"), Repost(30, B, 10, A, 3))
    t.run(Repost(31, B, 10, A, 6))
    t.expect(U, [(30, 3, B, 10, A)])
    t.run(Unrepost(30, B, 7))
    t.expect(U, [(31, 6, B, 10, A)])


@CONFIGS
def test_a_block_while_a_repost_is_in_the_cache(config):
    t = Timeline(config).run(*followed(B), Post(10, A, 1, "a"), Post(11, B, 2, "b"),
                             Repost(30, B, 10, A, 5))
    t.expect(U, [(30, 5, B, 10, A), (11, 2, B, 11, B)])
    t.run(block(U, A, 6))  # the original's author
    t.expect(U, [(11, 2, B, 11, B)])
    t.run(block(U, A, 7, on=False), block(A, U, 7))  # blocks act both ways
    t.expect(U, [(11, 2, B, 11, B)])
    t.run(block(A, U, 8, on=False))
    t.expect(U, [(30, 5, B, 10, A), (11, 2, B, 11, B)])
    t.run(block(B, U, 9))  # the reposter: out of F(u) while it stands
    t.expect(U, [])
    t.run(block(B, U, 10, on=False))  # the follow was never undone
    t.expect(U, [(30, 5, B, 10, A), (11, 2, B, 11, B)])


@CONFIGS
def test_mute_then_unmute(config):
    t = Timeline(config).run(*followed(A, B), *followed(U, by=A), Post(10, A, 1, "a"),
                             Post(11, C, 2, "c"), Repost(30, B, 11, C, 3), Post(12, U, 4, "u"))
    t.expect(U, [(30, 3, B, 11, C), (10, 1, A, 10, A)])
    t.run(mute(U, A, 5), mute(U, C, 5))
    t.expect(U, [])
    t.expect(A, [(12, 4, U, 12, U)])  # one way: A still sees U
    t.run(mute(U, A, 6, on=False))
    t.expect(U, [(10, 1, A, 10, A)])
    t.run(mute(U, C, 6, on=False))
    t.expect(U, [(30, 3, B, 11, C), (10, 1, A, 10, A)])


@CONFIGS
def test_deleting_an_account_with_followers_reposts_and_replies(config):
    t = Timeline(config).run(
        *followed(A, B), *followed(A, B, by=V), *followed(U, by=A), UserUpsert(A, "a", "A", 0),
        Post(10, A, 1, "a"), Post(11, A, 2, "to u", U), Post(12, C, 3, "c"),
        Repost(30, A, 12, C, 4), Repost(31, B, 10, A, 5), Post(13, B, 6, "to a", A),
        Post(14, U, 7, "u"))
    t.expect(U, [(13, 6, B, 13, B), (31, 5, B, 10, A), (30, 4, A, 12, C), (11, 2, A, 11, A)])
    t.expect(V, [(13, 6, B, 13, B), (31, 5, B, 10, A), (30, 4, A, 12, C)])
    t.run(AccountDelete(A, 8))
    # A's posts, replies and reposts go, and B's repost of A's tweet; B's reply to A
    # too (A is no longer in F(u)).
    for user in (U, V):
        t.expect(user, [])
    t.run(UserUpsert(A, "back", "Back", 9), Post(15, A, 9, "late"), Repost(32, C, 12, C, 9))
    t.expect(U, [])
    assert t.store.users([A])[A].deleted


@CONFIGS
def test_a_deleted_account_is_not_served(config):
    t = Timeline(config).run(*followed(A), Post(10, A, 1, "a"), AccountDelete(U, 2))
    ref = Reference().add(t.history)
    assert U not in ref.users() and ref.is_deleted(U)
    with pytest.raises(NotFound, match="deleted"):
        home_page(t.store, U, None, 10)


@CONFIGS
def test_pages_and_cursors_across_every_kind(config):
    """Trimmed caches (cap 3) and pages of one and two: each page is the SQL below its cursor."""
    t = Timeline(config).run(
        *followed(A, B, C), *[Post(10 + i, A, i, f"a{i}") for i in range(6)],
        Repost(30, B, 12, A, 7), Repost(31, C, 12, A, 8), Post(16, C, 9, "to v", V),
        Post(17, C, 9, "to b", B), Repost(32, B, 40, V, 10), Post(40, V, 1, "v"))
    t.expect(U, [(32, 10, B, 40, V), (17, 9, C, 17, C), (31, 8, C, 12, A),
                 (15, 5, A, 15, A), (14, 4, A, 14, A), (13, 3, A, 13, A), (11, 1, A, 11, A),
                 (10, 0, A, 10, A)])
    t.run(mute(U, V, 11), Unrepost(31, C, 11))
    t.expect(U, [(17, 9, C, 17, C), (30, 7, B, 12, A), (15, 5, A, 15, A), (14, 4, A, 14, A),
                 (13, 3, A, 13, A), (11, 1, A, 11, A), (10, 0, A, 10, A)])


# -- once mismatches between the join path and §4b, found by the property above -----------------

@pytest.mark.parametrize(("first", "smaller"), [
    (Repost(30, B, 10, C, 0), Repost(30, B, 10, A, 0)),  # the original's author
    (Repost(30, B, 10, A, 5), Repost(30, B, 10, A, 2)),  # the time
    (Repost(30, B, 11, A, 0), Repost(30, B, 10, A, 0)),  # the original tweet
], ids=["author", "time", "original"])
def test_a_duplicated_repost_id_counts_its_smallest_fields(first, smaller):
    t = Timeline(NORMAL).run(*followed(B), Post(10, A, 7, "a"), Post(11, A, 7, "b"))
    t.run(first)
    t.run(smaller)
    t.expect(U, [(30, smaller.created_at, B, smaller.original_tweet_id, A)])


@pytest.mark.parametrize("delete_first", [False, True], ids=["post first", "delete first"])
def test_a_forged_delete_in_the_posts_batch_hides_nothing(delete_first):
    t = Timeline(NORMAL).run(*followed(A))
    batch = [Post(10, A, 7, "a"), Delete(10, B, 0)]
    t.run(*(batch[::-1] if delete_first else batch))
    t.expect(U, [(10, 7, A, 10, A)])


# -- fanout verify ---------------------------------------------------------------------------------

def test_verify_recomputes_4b_and_names_divergent_users(tmp_path: Path):
    # A file: verify reads from several threads, and each opens its own connection.
    t = Timeline(NORMAL, tmp_path / "view.sqlite").run(
        *followed(A, B), *followed(B, by=C), *followed(A, by=V), Post(10, A, 1, "a"),
        Post(11, A, 2, "to c", C), Post(12, B, 3, "b"), Repost(30, B, 10, A, 5),
        block(C, A, 6), mute(U, C, 6), AccountDelete(V, 7))
    ref = Reference().add(t.history)
    assert ref.home(U, 10) == [(30, 5, B, 10, A), (12, 3, B, 12, B)]
    assert ref.home(C, 10) == [(12, 3, B, 12, B)]
    log_ = Changelog(events=t.history)
    result = compare(log_, t.store, 10)
    assert (result.users_checked, result.divergent, result.samples) == (2, 0, [])  # not V
    assert result.ok
    # Behind the join's back: B's repost hidden in the store, so A's post shows instead.
    t.store.apply([Delta.repost(30, B, 5, (10, A), shown=False)])
    result = compare(log_, t.store, 10)
    assert result.divergent == 1
    assert result.samples == [
        "user 1: expected 2 entries, served 2; missing [30], unexpected [10]\n    store: 30 "
        f"(tweets row: author {B} at 5, deleted; cache row listing author {B}; horizon (1, 10))"]


def test_verify_describes_entries_that_differ_only_in_their_fields():
    want = [HomeRow(30, 5, B, 10, A), HomeRow(11, 2, A, 11, A)]
    got = [HomeRow(30, 5, B, 10, C), HomeRow(11, 2, A, 11, A)]
    assert describe(U, want, got) == (
        f"user 1: expected 2 entries, served 2; entry 0 should be (30, 5, {B}, 10, {A}), "
        f"served (30, 5, {B}, 10, {C})")
    assert describe(U, want, "not served: gone") == "user 1: expected 2 entries, not served: gone"
