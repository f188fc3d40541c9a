"""Small integer codes shared by the Kafka source and the pure join.

The source decodes each changelog record into one typed row; ``kind`` says which
event it is (0 for a record that failed validation and must be dead-lettered).
Kept free of pyspark so the join and its tests import it without Spark.
"""

from enum import IntEnum

from ingest.events import Delete, Event, Follow, Post, UserUpsert


class Kind(IntEnum):
    """The event a source row carries."""

    INVALID = 0
    POST = 1
    DELETE = 2
    FOLLOW = 3
    UNFOLLOW = 4
    USER = 5


def to_event(kind: int, key: int, created_at: int, tweet_id: int, other_id: int,
             text: str | None, name: str | None) -> Event:
    """Rebuild the (already validated) event a source row carries."""
    if kind == Kind.POST:
        return Post(tweet_id, key, created_at, text or "")
    if kind == Kind.DELETE:
        return Delete(tweet_id, key, created_at)
    if kind in (Kind.FOLLOW, Kind.UNFOLLOW):
        return Follow(other_id, key, created_at, active=kind == Kind.FOLLOW)
    if kind == Kind.USER:
        return UserUpsert(key, text or "", name or "", created_at)
    msg = f"row kind {kind} carries no event"
    raise ValueError(msg)
