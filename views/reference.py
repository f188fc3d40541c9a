"""What the view must equal: the SQL of DESIGN §4 recomputed from the changelogs.

:class:`Reference` folds events (any order, any duplication) into the two tables the
query reads, with the same table semantics as the join (``views.join``): a follow
edge is its newest event by ``(created_at, op)`` with unfollow winning ties; a tweet is
deleted if a delete for it by its author exists. Then it runs the literal query in an
in-memory SQLite database. ``fanout verify`` and the property tests both compare the
served timelines with it; it shares no code with the incremental path on purpose.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from ingest.events import Delete, Event, Follow, Post, UserUpsert

HOME_SQL = """
SELECT t.tweet_id, t.author_id, t.created_at, t.text
FROM tweets t JOIN follows f ON f.followee_id = t.author_id
WHERE f.follower_id = :u AND NOT t.deleted
ORDER BY t.created_at DESC, t.tweet_id DESC LIMIT :n
"""


class Reference:
    """Tables folded from events, queried with the DESIGN's SQL."""

    def __init__(self) -> None:
        self._edges: dict[tuple[int, int], tuple[int, int]] = {}
        self._posts: dict[int, Post] = {}
        self._deletes: set[tuple[int, int]] = set()
        self.profiles: dict[int, UserUpsert] = {}
        self._db: sqlite3.Connection | None = None

    def add(self, events: Iterable[Event]) -> Reference:
        for event in events:
            self._db = None
            if isinstance(event, Post):
                old = self._posts.get(event.tweet_id)
                if old is None or (event.created_at, event.text) < (old.created_at, old.text):
                    self._posts[event.tweet_id] = event
            elif isinstance(event, Delete):
                self._deletes.add((event.tweet_id, event.author_id))
            elif isinstance(event, Follow):
                pair = (event.follower_id, event.followee_id)
                rank = (event.created_at, 0 if event.active else 1)
                self._edges[pair] = max(self._edges.get(pair, rank), rank)
            else:
                self._profile(event)
        return self

    def _profile(self, user: UserUpsert) -> None:
        old = self.profiles.get(user.user_id)
        if old is None or user.created_at >= old.created_at:
            self.profiles[user.user_id] = user

    def users(self) -> list[int]:
        """Every user who follows someone (the users whose timelines can be non-empty)."""
        return sorted({f for (f, _), (_, unfollow) in self._edges.items() if not unfollow})

    def home(self, user: int, n: int) -> list[tuple[int, int, int, str]]:
        """The top ``n`` of ``user``'s home timeline: (tweet_id, author_id, created_at, text)."""
        rows = self._conn().execute(HOME_SQL, {"u": user, "n": n}).fetchall()
        return [tuple(row) for row in rows]

    def author_tweets(self, author: int) -> list[tuple[int, int]]:
        """An author's live tweets, newest first: (created_at, tweet_id)."""
        return sorted(((p.created_at, t) for t, p in self._posts.items()
                       if p.author_id == author and (t, author) not in self._deletes),
                      reverse=True)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = self._load()
        return self._db

    def _load(self) -> sqlite3.Connection:
        db = sqlite3.connect(":memory:")
        db.execute("CREATE TABLE follows (follower_id INTEGER, followee_id INTEGER)")
        db.execute("CREATE TABLE tweets (tweet_id INTEGER PRIMARY KEY, author_id INTEGER,"
                   " created_at INTEGER, text TEXT, deleted INTEGER)")
        db.executemany("INSERT INTO follows VALUES (?, ?)",
                       [pair for pair, (_, unfollow) in self._edges.items() if not unfollow])
        db.executemany("INSERT INTO tweets VALUES (?, ?, ?, ?, ?)", [
            (t, p.author_id, p.created_at, p.text, int((t, p.author_id) in self._deletes))
            for t, p in self._posts.items()])
        db.execute("CREATE INDEX follows_by_follower ON follows (follower_id)")
        db.execute("CREATE INDEX tweets_by_author ON tweets (author_id, created_at)")
        return db
