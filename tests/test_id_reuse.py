"""Known divergence: one tweet id posted or reposted by two authors (found in session 28).

The contract has a duplicate be an exact copy, so one id has one author. Nothing
checks that: the join is partitioned by author, so each author's state keeps its own
post or repost of the id and fans it out. The store keeps one row per id, and
:class:`views.reference.Reference` keeps one post per id (the smallest by
``(created_at, text, in_reply_to)``) but one repost per (reposter, id). Served
timelines then differ from the SQL, in whatever order the two arrive.

These tests are strict expected failures: they pin the divergence until it is fixed
(by refusing the second author's record as a dead letter, or by a rule both sides
share), and fail as soon as it no longer happens, so that the marker is removed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.verify import compare
from ingest.events import Event, Follow, Post, Repost
from views.changelog import Changelog
from views.join import JoinConfig
from views.local import LocalJoin
from views.stores.sqlite import SQLiteStore

CAP = 50


def divergent(tmp_path: Path, batches: list[list[Event]]) -> int:
    """Users whose served timeline differs from the SQL after ``batches``."""
    store = SQLiteStore(tmp_path / "v.sqlite", cap=CAP).open()
    try:
        join = LocalJoin(JoinConfig.with_ratio(CAP, 100), store)
        for batch in batches:
            join.run(batch)
        history = [event for batch in batches for event in batch]
        return compare(Changelog(events=history), store, CAP).divergent
    finally:
        store.close()


GRAPH: list[Event] = [Follow(5, 1, 0), Follow(5, 2, 0), Follow(6, 1, 0), Follow(7, 2, 0),
                      Follow(5, 3, 0), Follow(6, 3, 0), Follow(7, 4, 0), Follow(5, 4, 0),
                      Post(100, 3, 1, "a"), Post(101, 4, 1, "b")]
ORDERS = pytest.mark.parametrize("together", [True, False], ids=["one batch", "two batches"])


@pytest.mark.xfail(strict=True, reason="a repost id of two reposters: the store keeps one")
@ORDERS
def test_a_repost_id_of_two_reposters_is_served_as_the_sql_says(tmp_path, together):
    first, second = Repost(30, 1, 100, 3, 2), Repost(30, 2, 101, 4, 3)
    batches = [GRAPH, [first, second]] if together else [GRAPH, [first], [second]]
    assert divergent(tmp_path, batches) == 0


@pytest.mark.xfail(strict=True, reason="a post id of two authors: store and SQL keep different ones")
@ORDERS
def test_a_post_id_of_two_authors_is_served_as_the_sql_says(tmp_path, together):
    first, second = Post(200, 3, 1, "a"), Post(200, 4, 2, "b")
    batches = [GRAPH, [first, second]] if together else [GRAPH, [first], [second]]
    assert divergent(tmp_path, batches) == 0


def test_one_author_per_id_is_served_as_the_sql_says(tmp_path):
    # The same shapes with one author per id: the path the contract promises.
    batches = [GRAPH, [Repost(30, 1, 100, 3, 2), Repost(31, 2, 101, 4, 3)],
               [Post(200, 3, 1, "a"), Post(201, 4, 2, "b")]]
    assert divergent(tmp_path, batches) == 0
