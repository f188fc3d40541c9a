"""The fast evaluation ``fanout verify`` runs, and the ways verify reads what is served.

:meth:`views.reference.Reference.home_fast` walks the followees' entry lists newest
first and stops at ``n``; it must equal the literal §4b SQL (:meth:`Reference.home`)
on the small random histories of ``tests/support/histories.py`` with reused tweet ids
too, and on generated histories the size of a small deployment, reposts of one tweet
by many followees included. ``infra.checks.verify.compare`` reads served timelines inline,
in reader processes or in threads, depending on the store; every way must find the
same users divergent with the same descriptions, and ``entries`` must check only
each timeline's first entries.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.checks.verify import compare
from ingest.events import MUTE, Event, Follow, Post, Relation
from ingest.generator import generate
from ingest.social import SOCIAL
from tests.support.histories import ALL, USERS, histories
from views.changelog import Changelog
from views.join import JoinConfig
from views.local import LocalJoin
from views.reference import HomeRow, Reference
from views.stores import store_from_url
from views.stores.sqlite import SQLiteStore

CAP = 50


# -- the fast evaluation against the literal SQL ------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(history=histories(reuse=True), n=st.sampled_from([1, 2, 3, 5, ALL]))
def test_fast_evaluation_equals_the_literal_sql_with_reused_ids(history, n):
    """An id two authors claim belongs to the earliest claim in both evaluations."""
    ref = Reference().add(history)
    for user in USERS:
        assert ref.home_fast(user, n) == ref.home(user, n), f"user {user}"


#: Reposts per post: the social mix's, and a viral one (many followees reposting one
#: tweet, most appearances hidden behind a newer one). Blocks, mutes and account
#: deletions ten times the social mix's, so that most readers meet one.
MIXES = {"social": 0.85, "repost-heavy": 6.0}


@pytest.mark.parametrize("reposts", MIXES.values(), ids=MIXES.keys())
def test_fast_evaluation_equals_the_literal_sql_on_a_generated_history(reposts):
    mix = dataclasses.replace(SOCIAL, reposts=reposts, blocks=0.02, mutes=0.02,
                              account_deletes=0.02)
    ref = Reference().add(generate(400, 6000, 3000, seed=7, mix=mix).events())
    users = ref.users()
    assert len(users) > 350
    longer = 0
    for user in users:
        want = ref.home(user, 800)  # ordered by a unique key: its prefixes are LIMIT n
        for n in (1, 20, 800):
            assert ref.home_fast(user, n) == want[:n], f"user {user}, n {n}"
        longer += len(want) > 20
    assert longer > len(users) // 2, "the walks at n = 1 and 20 should mostly stop early"


def test_a_muted_followee_is_not_shown_but_replies_to_them_are():
    """Muting leaves the followee in F(u): a followee's reply to them stays visible."""
    ref = Reference().add([Follow(9, 1, 0), Follow(9, 2, 0), Relation(9, 1, 1, MUTE),
                           *(Post(10 + i, 1, 2 + i, "muted") for i in range(50)),
                           Post(100, 2, 60, "a reply to the muted followee", 1),
                           Post(101, 2, 61, "a reply to a stranger", 3)])
    assert ref.home_fast(9, ALL) == ref.home(9, ALL) == [HomeRow(100, 60, 2, 100, 2)]


# -- verify's reads ----------------------------------------------------------------------------

#: User 1 follows 2, who posts ten tweets; the log also has an older eleventh that the
#: store never received: only a check that goes past the first ten entries sees it.
STORED: list[Event] = [Follow(1, 2, 0), *(Post(10 + i, 2, 100 + i, "x") for i in range(10))]
UNSEEN = Post(5, 2, 50, "older than the rest")


def stored(tmp_path: Path, history: list[Event]) -> tuple[SQLiteStore, str]:
    """A SQLite file holding ``history`` as the join leaves it, and its URL."""
    path = tmp_path / "v.sqlite"
    store = SQLiteStore(path, cap=CAP).open()
    LocalJoin(JoinConfig.with_ratio(CAP, 100), store).run(history)
    return store, f"sqlite:///{path}"


def test_entries_checks_only_the_first_entries(tmp_path):
    store, _ = stored(tmp_path, STORED)
    log_ = Changelog(events=[*STORED, UNSEEN])
    assert compare(log_, store, CAP, entries=10).divergent == 0
    full = compare(log_, store, CAP)
    assert full.divergent == 1
    assert full.samples == ["user 1: expected 11 entries, served 10; missing [5], unexpected []"
                            "\n    store: 5 (no tweets row; no cache row; no horizon)"]


def test_every_way_of_reading_finds_the_same(tmp_path):
    """Inline, in two reader processes; and as a store that reads over a network: in
    threads here, or in threads in each of two reader processes."""
    history = list(generate(60, 500, 400, seed=3, mix=SOCIAL).events())
    store, url = stored(tmp_path, history[: len(history) * 9 // 10])
    log_ = Changelog(events=history)
    inline = compare(log_, store, CAP, max_samples=100)
    assert inline.users_checked > 40 and inline.divergent > 5  # the last tenth is missing
    opener = functools.partial(store_from_url, url, cap=CAP)
    in_processes = compare(log_, store, CAP, max_samples=100, opener=opener, workers=2)
    store.reads_in_process = False
    in_threads = compare(log_, store, CAP, max_samples=100)
    in_process_threads = compare(log_, store, CAP, max_samples=100, opener=opener, workers=2)
    assert in_processes == inline
    assert in_threads == inline
    assert in_process_threads == inline


def test_entries_must_be_positive(tmp_path):
    store, _ = stored(tmp_path, STORED)
    with pytest.raises(ValueError, match="entries must be at least 1"):
        compare(Changelog(events=STORED), store, CAP, entries=0)
