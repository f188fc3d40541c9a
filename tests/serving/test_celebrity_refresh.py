"""The celebrity cache's incremental refresh equals a full reload (serving.celebrities).

A celebrity's held list after ``refresh()`` (incremental: the newest ``window``
entries merged into what was held) must equal what a fresh cache loads whole, for
random histories of posts, deletes, reposts (of other authors' tweets, some twice)
and unreposts, as long as nothing older than the window changed (undos at the top
may leave fewer held, never others), and pages read through it equal the §4b query;
a refresh with the store's version unchanged reads nothing. The merged list that
pages following many celebrities walk, updated by what moved, equals one merged anew.
"""

from __future__ import annotations

import functools
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.events import Delete, Event, Follow, Post, Repost, Unrepost
from serving import celebrities
from serving.celebrities import CelebrityCache, _Merged, _Recent
from serving.timeline import home_page, home_top
from tests.support.join import Harness
from views.join import JoinConfig
from views.reference import Reference
from views.stores.rows import Entry

CELEB = 1
OTHER = 9  # whose tweets the celebrity reposts
FOLLOWERS = range(2, 6)
CONFIG = JoinConfig(cap=50, promote_at=3, demote_below=2)

# Every test here runs as on a machine booted a moment ago (time.monotonic near 0).
pytestmark = pytest.mark.usefixtures("booted_just_now")


def _celebrity() -> tuple[Harness, list[Event]]:
    history: list[Event] = [Follow(f, CELEB, 0) for f in FOLLOWERS]
    history += [Post(100 + i, CELEB, 10 + i, f"old {i}") for i in range(6)]
    history += [Post(50 + i, OTHER, 5, f"other's {i}") for i in range(3)]
    harness = Harness(CONFIG)
    harness.run(history)
    assert harness.store.celebrities() == [CELEB]
    return harness, history


class _Version:
    """A version the test moves by hand, as the sink's commits would."""

    def __init__(self) -> None:
        self.value = 0

    def __call__(self) -> int:
        return self.value


def _held(cache: CelebrityCache) -> list[int]:
    return [e.tweet_id for e in cache._lists[CELEB].entries]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["post", "repost", "undo"]), st.integers(0, 11)),
                min_size=1, max_size=12),
       st.integers(1, 8), st.integers(2, 12))
def test_incremental_refresh_equals_a_full_reload(ops: list[tuple[str, int]], window: int,
                                                  depth: int):
    harness, history = _celebrity()
    version = _Version()
    cache = CelebrityCache(harness.store, depth=depth, version=version, window=window)
    cache.refresh()
    for step, (kind, n) in enumerate(ops, start=1):
        # New entries are newer than all before them; undos hit the newest `window`
        # held (older ones wait for the periodic full reload, by design).
        event = _event(kind, n, step, Reference().add(history).author_tweets(CELEB)[:window])
        if event is None:
            continue
        history.append(event)
        harness.run([event])
        version.value += 1
        cache.refresh()
        fresh = CelebrityCache(harness.store, depth=depth)
        fresh.refresh()
        held, whole = _shown(harness, _held(cache)), _held(fresh)
        # Undos at the top can leave fewer than `depth` held: still the newest ones,
        # and an incomplete list's floor sends deeper pages to the store. An unrepost
        # can also leave an entry held just below the window (the user's next repost
        # of the tweet takes over above it): the page drops it, its row says hidden.
        assert whole[len(whole) - len(held):] == held, f"after {event}"
        if cache._lists[CELEB].complete:
            assert held == whole
        _pages_are_the_query(harness, history, cache)


def _shown(harness: Harness, held: list[int]) -> list[int]:
    rows = harness.store.tweets(held)
    return [t for t in held if not rows[t].deleted]


def _event(kind: str, n: int, step: int, live: list[tuple[int, int]]) -> Event | None:
    """A post, a repost of one of OTHER's three tweets (again: a no-op), or the undo of
    one of the celebrity's ``live`` entries (a delete of a post, an unrepost)."""
    if kind == "post":
        return Post(200 + step, CELEB, 100 + step, f"new {step}")
    if kind == "repost":
        return Repost(300 + step, CELEB, 50 + n % 3, OTHER, 100 + step)
    if not live:
        return None
    entry = live[n % len(live)][1]
    return (Unrepost if entry >= 300 else Delete)(entry, CELEB, 1000 + step)


def _pages_are_the_query(harness: Harness, history: list[Event], cache: CelebrityCache) -> None:
    ref = Reference().add(history)
    with_cache = functools.partial(home_page, celebrities=cache)
    for user in FOLLOWERS:
        want = [r.entry_id for r in ref.home(user, CONFIG.cap)]
        got = [e.tweet_id for e in home_top(harness.store, user, CONFIG.cap, page_size=2,
                                            page_fn=with_cache)]
        assert got == want


def test_unchanged_version_skips_the_refresh():
    harness, _ = _celebrity()
    version = _Version()
    cache = CelebrityCache(harness.store, version=version)
    cache.refresh()
    generation = cache.generation
    harness.run([Post(300, CELEB, 500, "unseen until the version moves")])
    cache.refresh()
    assert cache.generation == generation and 300 not in _held(cache)
    assert cache.stats == {"full": 1, "incremental": 0, "skipped": 1}
    version.value += 1
    cache.refresh()
    assert cache.generation == generation + 1 and _held(cache)[-1] == 300
    assert cache.stats["incremental"] == 1


def test_the_first_refresh_is_a_full_load_whatever_the_uptime():
    """A cache that never loaded loads whole, even when the monotonic clock is younger
    than ``full_every_s`` (a host booted minutes ago); the next one is incremental."""
    import time

    assert time.monotonic() < 60  # the fixture's clock: a host just booted
    harness, _ = _celebrity()
    version = _Version()
    cache = CelebrityCache(harness.store, version=version, full_every_s=3600)
    cache.refresh()
    assert cache.stats == {"full": 1, "incremental": 0, "skipped": 0}
    assert _held(cache)[-1] == 105
    version.value += 1
    cache.refresh()
    assert cache.stats == {"full": 1, "incremental": 1, "skipped": 0}


def test_a_full_reload_comes_every_full_every_s():
    harness, _ = _celebrity()
    cache = CelebrityCache(harness.store, version=_Version(), full_every_s=0)
    cache.refresh()
    cache.refresh()
    assert cache.stats == {"full": 2, "incremental": 0, "skipped": 0}


def test_refreshes_that_change_no_list_keep_the_generation():
    """Cached home pages stay valid across a write that touched no celebrity and across
    a full reload that found every list as it was; a celebrity's new post moves it."""
    harness, _ = _celebrity()
    version = _Version()
    cache = CelebrityCache(harness.store, version=version, full_every_s=3600)
    cache.refresh()
    generation = cache.generation
    harness.run([Post(400, OTHER, 600, "not a celebrity's")])
    version.value += 1
    cache.refresh()
    cache.refresh(full=True)
    assert cache.generation == generation
    assert cache.stats == {"full": 2, "incremental": 1, "skipped": 0}
    harness.run([Post(401, CELEB, 601, "a celebrity's")])
    version.value += 1
    cache.refresh()
    assert cache.generation == generation + 1 and _held(cache)[-1] == 401


def _lists(draw: st.DrawFn) -> dict[int, _Recent]:
    """Per-author lists of unique entries, oldest first; a tweet id is one author's."""
    out = {}
    for author in draw(st.sets(st.integers(1, 6), max_size=5)):
        times = draw(st.sets(st.integers(0, 40), max_size=30))
        entries = sorted(Entry(t, t * 10 + author, author) for t in times)
        out[author] = _Recent(entries, [e.key for e in entries], draw(st.booleans()))
    return out


@st.composite
def _two_lists(draw: st.DrawFn) -> tuple[dict[int, _Recent], dict[int, _Recent]]:
    old = _lists(draw)
    new = _lists(draw)
    # Some authors' lists stay the same object, as refreshes that change nothing leave them.
    new.update({a: r for a, r in old.items() if draw(st.booleans())})
    return old, new


@settings(max_examples=200, deadline=None)
@given(_two_lists(), st.sampled_from([0, 3, 256]))
def test_the_merged_list_updated_equals_one_merged_anew(lists, moves):
    old, new = lists
    with patch.object(celebrities, "_MOVES", moves):  # one by one, or sorted again
        updated = _Merged.of(old).updated(new)
    assert updated == _Merged.of(new)
    assert updated.entries == sorted(updated.entries)
    for below in [(0, 0), (20, 0), (20, 205), (41, 0)]:
        want = [e for e in reversed(_Merged.of(new).entries) if e.key < below and e.author_id % 2]
        assert updated.walk({1, 3, 5}, below, 7) == want[:7]
