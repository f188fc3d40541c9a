"""Signed changes to the materialized tables, and the sortable timeline key.

The join emits :class:`Delta` rows; the sink applies them to a store. One flat row
type serves every table so that Spark carries a single output schema
(:data:`DELTA_DDL`); ``kind`` says which fields matter:

========== ============================================================
kind       fields used
========== ============================================================
TL_ADD     user_id, tweet_id, author_id, created_at
TL_DEL     user_id, tweet_id, created_at (0 if not known)
TL_WIPE    user_id, author_id (drop all of the author's tweets there)
HORIZON    user_id, created_at, tweet_id (raise the user's horizon)
TWEET      tweet_id, author_id, created_at (0 if not known), text, flag (1 = deleted)
FOLLOW     user_id (follower), author_id (followee), created_at, flag
CELEB_EDGE user_id (follower), author_id (celebrity), flag (1 = on)
CELEB      author_id, flag (1 = is a celebrity)
USER       user_id, created_at, text (handle), name
OFFSET     topic, partition, offset (highest offset seen in the batch)
DEAD       topic, partition, offset, text (reason), raw (value bytes)
========== ============================================================

**The timeline key.** Home timelines are ordered by ``(created_at, tweet_id)``
descending (DESIGN §4). :func:`sort_key` is that pair; a *horizon* is such a key
below which a cached timeline may be incomplete (it was trimmed to the cap, or a
backfill brought only an author's most recent tweets). Above its horizon a cached
timeline is exact; reads that go below it evaluate the query at read time.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

Key = tuple[int, int]
"""A timeline position: (created_at, tweet_id); larger is newer."""


#: Above every real position (created_at is at most year 9999 in ms, far below 2^63).
TOP: Key = (2**63 - 1, 2**63 - 1)


class DeltaKind(IntEnum):
    """What a delta changes; see the module docstring for the fields of each."""

    TL_ADD = 1
    TL_DEL = 2
    TL_WIPE = 3
    HORIZON = 4
    TWEET = 5
    FOLLOW = 6
    CELEB_EDGE = 7
    CELEB = 8
    USER = 9
    OFFSET = 10
    DEAD = 11


class Delta(NamedTuple):
    """One change to one table row; unused fields are 0 / None."""

    kind: int
    user_id: int = 0
    tweet_id: int = 0
    author_id: int = 0
    created_at: int = 0
    flag: int = 0
    text: str | None = None
    name: str | None = None
    topic: str | None = None
    partition: int = 0
    offset: int = 0
    raw: bytes | None = None


DELTA_FIELDS = Delta._fields
DELTA_DDL = (
    "kind int not null, user_id long not null, tweet_id long not null, "
    "author_id long not null, created_at long not null, flag int not null, "
    "text string, name string, topic string, partition int not null, "
    "offset long not null, raw binary"
)


def sort_key(created_at: int, tweet_id: int) -> Key:
    """The position of a tweet in a timeline (newest = largest)."""
    return (created_at, tweet_id)
