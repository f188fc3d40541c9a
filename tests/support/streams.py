"""The live stream's test world: readers, authors and celebrities on a SQLite store, and
random writes of every kind (``tests/serving/test_stream.py``, ``tests/infra/checks/test_checker_streams.py``).

Three readers follow four authors each; two authors are followed by all three and so are
celebrities (merged at read time). :class:`Writes` draws posts, replies, reposts and
undone reposts, deletes, follows and unfollows, blocks, mutes and unmutes, and an
account delete, with fresh ids and ever later times.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from ingest.events import (
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
from serving.settings import ServingSettings
from tests.support.api import SECRET
from tests.support.join import Harness
from views.join import JoinConfig
from views.stores.sqlite import SQLiteStore

T0 = 1_700_000_000_000
READERS = (2, 3, 4)
AUTHORS = (10, 11, 12, 13, 14)
#: 12 and 13 are followed by all three readers: celebrities (merged at read time).
FOLLOWS = {2: (10, 11, 12, 13), 3: (11, 12, 13, 14), 4: (10, 12, 13, 14)}
CONFIG = JoinConfig(cap=4, promote_at=3, demote_below=2)


def stream_settings(path: Path, **overrides: Any) -> ServingSettings:
    """An API over ``path`` with auth, a fast celebrity cache, watcher and heartbeat."""
    return ServingSettings(**{"store_url": f"sqlite:///{path}", "timeline_cap": CONFIG.cap,
                              "auth": True, "auth_secret": SECRET, "celebrity_refresh_s": 0.05,
                              "stream_poll_s": 0.02, "stream_heartbeat_s": 0.2} | overrides)


class World:
    """The store at ``path``, filled by the join, and every event it was given."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.harness = Harness(CONFIG, SQLiteStore(path, cap=CONFIG.cap).open())
        self.history: list[Event] = []
        self.run(*[UserUpsert(u, f"u{u}", f"User {u}", T0) for u in READERS + AUTHORS],
                 *[Follow(r, a, T0) for r, authors in FOLLOWS.items() for a in authors],
                 *[Post(100 + i, AUTHORS[i % 5], T0 + 10 * i, f"p{i}") for i in range(10)])

    def run(self, *events: Event) -> None:
        self.harness.run(list(events))
        self.history += events


class Writes:
    """Random writes of every kind, with fresh ids and ever later times."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.next_id, self.now = rng, 1000, T0 + 1000
        self.posts: list[tuple[int, int]] = [(100 + i, AUTHORS[i % 5]) for i in range(10)]
        self.reposts: list[tuple[int, int]] = []
        self.gone: set[int] = set()

    def batch(self) -> list[Event]:
        return [self.one() for _ in range(self.rng.randint(1, 4))]

    def one(self) -> Event:
        rng = self.rng
        self.next_id += 1
        self.now += rng.randint(1, 40)
        tweet, when = self.next_id, self.now
        author = rng.choice([a for a in AUTHORS if a not in self.gone])
        kind = rng.choice(["post"] * 5 + ["reply", "repost", "repost", "unrepost", "delete",
                                          "unfollow", "follow", "block", "mute", "unmute"])
        reader = rng.choice(READERS)
        if kind == "post":
            self.posts.append((tweet, author))
            return Post(tweet, author, when, f"t{tweet}")
        if kind == "reply":
            self.posts.append((tweet, author))
            return Post(tweet, author, when, f"r{tweet}", rng.choice(READERS + AUTHORS))
        if kind == "repost":
            original, by = rng.choice(self.posts)
            self.reposts.append((tweet, author))
            return Repost(tweet, author, original, by, when)
        if kind == "unrepost" and self.reposts:
            repost, by = self.reposts.pop(rng.randrange(len(self.reposts)))
            return Unrepost(repost, by, when)
        if kind == "delete":
            post, by = self.posts.pop(rng.randrange(len(self.posts)))
            return Delete(post, by, when)
        if kind in ("block", "mute", "unmute"):
            relation = "block" if kind == "block" else MUTE
            return Relation(reader, author, when, relation, active=kind != "unmute")
        return Follow(reader, author, when, active=kind == "follow")

    def account_delete(self) -> Event:
        self.gone.add(11)
        return AccountDelete(11, self.now + 1)
