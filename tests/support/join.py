"""The pure join's test bench: :class:`Harness` and random events over a small id space.

Random posts, deletes, follows, unfollows and profiles over five users (one at
2^63-1) and a few tweet ids, so collisions are frequent; :class:`Harness` runs them
through :class:`views.local.LocalJoin` into an in-memory SQLite store by default.
Used by the join's own tests (``tests/views/test_join.py``), the store contract and
the API tests that fill a store without Spark.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ingest.events import Delete, Event, Follow, Post, UserUpsert
from views.join import JoinConfig
from views.local import LocalJoin
from views.stores.sqlite import SQLiteStore

BIG = 2**63 - 1
ALL_USERS = [1, 2, 3, 4, BIG]
USERS = st.sampled_from(ALL_USERS)
TIMES = st.integers(0, 8)
TWEETS = st.sampled_from([*range(10, 26), BIG - 1])


@st.composite
def events(draw: st.DrawFn) -> Event:
    kind = draw(st.sampled_from(["post", "post", "delete", "follow", "follow", "unfollow",
                                 "user"]))
    author, when = draw(USERS), draw(TIMES)
    if kind == "post":
        tweet = draw(TWEETS)
        # The contract: a tweet id names one post; duplicates are exact copies.
        return Post(tweet, _author_of(tweet), (tweet * 7) % 9, f"t{tweet}")
    if kind == "delete":
        tweet = draw(TWEETS)
        return Delete(tweet, _author_of(tweet), when)
    if kind == "user":
        return UserUpsert(author, f"h{author}_{when}", "n", when)
    follower = draw(USERS.filter(lambda u: u != author))
    return Follow(follower, author, when, active=kind == "follow")


def _author_of(tweet: int) -> int:
    return ALL_USERS[tweet % 3 + (tweet % 7 == 0)]


class Harness(LocalJoin):
    """LocalJoin on an in-memory store by default (the tests' small timelines)."""

    def __init__(self, config: JoinConfig, store: SQLiteStore | None = None,
                 trim_slack: int = 0) -> None:
        super().__init__(config, store or SQLiteStore(":memory:", cap=config.cap,
                                                      trim_slack=trim_slack).open())
