"""Reads of the Cassandra store: queries and row decoding.

Each read is a statement name with bound values (:mod:`views.stores.cassandra.statements`)
and a decoder from rows to the contract's types, used by the store's read methods.
Rows come from the ``tuple_factory`` row factory: plain tuples in the selected column
order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ingest.events import BLOCK, MUTE
from views.delta import TOP, Key
from views.stores.base import Entry, Relations, TweetRow, UserRow
from views.stores.cassandra import statements as cql

Rows = list[tuple[Any, ...]]


# -- queries and decoders ------------------------------------------------------------------------

def cached_query(user: int, below: Key | None, limit: int) -> cql.Op:
    """A page of the cached timeline: keys strictly below ``below`` (or all)."""
    below = below if below is not None else TOP
    return ("home_page", (user, below[0], below[1], cql.bounded_limit(limit)))


def author_queries(authors: Sequence[int], below: Key | None, limit: int) -> list[cql.Op]:
    """One single-partition page per distinct author (merged by :func:`merge_authors`)."""
    if limit <= 0:
        return []
    below = below if below is not None else TOP
    return [("author_page", (a, below[0], below[1], cql.bounded_limit(limit)))
            for a in dict.fromkeys(authors)]


def keyed_queries(name: str, ids: Sequence[int]) -> list[cql.Op]:
    """One single-partition read per distinct id (no multi-partition IN)."""
    return [(name, (i,)) for i in dict.fromkeys(ids)]


def entries(rows: Rows) -> list[Entry]:
    """Timeline rows (created_at, tweet_id, author_id) as entries."""
    return [Entry(c, t, a) for c, t, a in rows]


def horizon_key(rows: Rows) -> Key | None:
    """A stored horizon; None when there is none (no row, or (-1, -1))."""
    if not rows or rows[0][0] is None or rows[0][0] < 0:
        return None
    return (rows[0][0], rows[0][1])


def column(rows: Rows) -> list[int]:
    """The first column of every row."""
    return [row[0] for row in rows]


def merge_authors(authors: list[int], pages: list[Rows], limit: int) -> list[Entry]:
    """Per-author pages, each newest first, merged into the newest ``limit``."""
    out = [Entry(c, t, a) for a, rows in zip(authors, pages, strict=True) for c, t in rows]
    out.sort(reverse=True)
    return out[:limit]


def tweet_rows(pages: list[Rows]) -> dict[int, TweetRow]:
    """Tweets and reposts by id; cells never written (a delete never posted) read as zeros."""
    out = {}
    for rows in pages:
        for tweet, author, created_at, body, deleted, reply_to, original, original_author in rows:
            out[tweet] = TweetRow(tweet, author or 0, created_at or 0, body or "", bool(deleted),
                                  reply_to or 0, original or 0, original_author or 0)
    return out


def user_rows(pages: list[Rows]) -> dict[int, UserRow]:
    """Profiles by id; an account deleted before any profile reads with empty names."""
    return {u: UserRow(u, h or "", n or "", bool(d)) for rows in pages for u, h, n, d in rows}


def relation_set(rows: Rows) -> Relations:
    """One user's ``relations`` partition: blocks either way, and mutes."""
    blocks, muted = set(cql.RELATION_ROWS[BLOCK]), {cql.RELATION_ROWS[MUTE][0]}
    return Relations(frozenset(other for relation, other in rows if relation in blocks),
                     frozenset(other for relation, other in rows if relation in muted))


def reposts_by_original(originals: list[int], pages: list[Rows]) -> dict[int, list[Entry]]:
    """Each original's shown reposts (newest first, as clustered); originals with none left out."""
    return {o: entries(rows) for o, rows in zip(originals, pages, strict=True) if rows}
