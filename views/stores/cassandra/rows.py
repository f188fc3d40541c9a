"""Reads of the Cassandra store: queries and row decoding.

Each read is a statement name with bound values (:mod:`views.stores.cassandra.statements`)
and a decoder from rows to the contract's types, used by the store's read methods.
Rows come from the ``tuple_factory`` row factory: plain tuples in the selected column
order.

**Many partitions per request.** A read of many keys — a page's tweets, profiles and
reposts, the followees' ``author_tweets`` — is one ``IN ?`` request per
:data:`IN_MAX` distinct keys, each row led by its partition key and grouped here.
Each binds a ``LIMIT`` that bounds its rows and fits in one of the driver's pages
(:data:`ROWS_MAX`): Cassandra pages a query whose limit may exceed a page, reading
its partitions one after another, and reads those of one that cannot all at once —
on the local node, 100 tweets by ``IN`` took 4.9 ms unbounded and 1.8 ms with
``LIMIT 100``. So tweets and profiles (one row a key) bind the chunk's length,
``author_tweets`` ``PER PARTITION LIMIT n`` with chunks of at most ``ROWS_MAX // n``
authors, and reposts (any number a key) ``ROWS_MAX``, re-reading partition by
partition, paged, the chunk that fills it (:func:`cut_short`). The writer's
regeneration reads single-partition pages (:func:`author_queries`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from ingest.events import BLOCK, MUTE
from views.delta import TOP, Key
from views.stores.cassandra import statements as cql
from views.stores.cassandra.chunks import as_chunks, fold, page
from views.stores.rows import FLOOR, Entry, Relations, TweetRow, UserRow, as_entry

Rows = list[tuple[Any, ...]]

#: Keys per ``IN`` request. A request is one coordinator's work, held whole until it
#: answers; more keys go in several requests run concurrently, which the driver
#: spreads over coordinators (it cannot route an ``IN`` by token) and which keep
#: every response to a page. On one node, 300 tweets: 3.3 ms in one request,
#: 4.3 ms in three of 100.
IN_MAX: Final = cql.IN_MAX
#: Rows one ``IN`` request asks for at most: the driver's page (its default
#: ``fetch_size``), so that the node reads the request's partitions at once.
ROWS_MAX: Final = 5000


# -- queries -------------------------------------------------------------------------------------

def cached_query(user: int) -> cql.Op:
    """The user's cached timeline: its ``home_chunks`` rows, folded by :func:`cached_page`."""
    return ("home_get", (user,))


def chunks(keys: Iterable[int], size: int = IN_MAX) -> list[list[int]]:
    """The distinct keys, in their first order, in lists of at most ``size``."""
    distinct = list(dict.fromkeys(keys))
    return [distinct[i:i + size] for i in range(0, len(distinct), size)]


def keyed_queries(name: str, ids: Iterable[int]) -> list[cql.Op]:
    """``IN`` reads of a table with one row per key: the chunk's length is its LIMIT."""
    return [(name, (chunk, len(chunk))) for chunk in chunks(ids)]


def repost_queries(originals: Iterable[int], above: Mapping[int, Key]) -> list[cql.Op]:
    """``IN`` reads of ``reposts_by_original``, at most :data:`ROWS_MAX` rows each.

    Each reads above the lowest of its originals' bounds (``above``; none: every
    repost); :func:`above_bounds` then keeps each original's own.
    """
    return [("reposts_of_in", (chunk, *min(above.get(o, FLOOR) for o in chunk), ROWS_MAX))
            for chunk in chunks(originals)]


def repost_query(original: int, above: Mapping[int, Key]) -> cql.Op:
    """One original's reposts above its bound, paged (a chunk that was cut short)."""
    return ("reposts_of", (original, *above.get(original, FLOOR)))


def above_bounds(found: dict[int, list[Entry]], above: Mapping[int, Key]
                 ) -> dict[int, list[Entry]]:
    """Each original's reposts strictly above its own bound; originals left with none out."""
    out = {}
    for original, entries in found.items():
        bound = above.get(original, FLOOR)
        kept = [e for e in entries if e.key > bound]
        if kept:
            out[original] = kept
    return out


def author_pages(authors: Iterable[int], below: Key | None, per_author: int) -> list[cql.Op]:
    """``IN`` reads of each author's newest ``per_author`` entries below ``below``.

    Chunks hold as many authors as fit ``per_author`` rows each in :data:`ROWS_MAX`
    (one at least), so the LIMIT — the most the chunk can hold — never cuts a row.
    """
    if per_author <= 0:
        return []
    below = below if below is not None else TOP
    per = cql.bounded_limit(per_author)
    size = max(1, min(IN_MAX, ROWS_MAX // per))
    return [("author_page_in", (chunk, below[0], below[1], per,
                                cql.bounded_limit(per * len(chunk))))
            for chunk in chunks(authors, size)]


def author_queries(authors: Sequence[int], below: Key | None, limit: int) -> list[cql.Op]:
    """One single-partition page per distinct author (merged by :func:`merge_authors`)."""
    if limit <= 0:
        return []
    below = below if below is not None else TOP
    return [("author_page", (a, below[0], below[1], cql.bounded_limit(limit)))
            for a in dict.fromkeys(authors)]


def cut_short(ops: Sequence[cql.Op], pages: Sequence[Rows]) -> list[int]:
    """Indices of the ``IN`` reads whose rows reached their LIMIT (the last bound value)."""
    return [i for i, ((_, params), rows) in enumerate(zip(ops, pages, strict=True))
            if len(rows) >= params[-1]]


# -- decoders ------------------------------------------------------------------------------------

def cached_page(rows: Rows, below: Key | None, limit: int,
                horizon: Key | None = None) -> list[Entry]:
    """The cached entries strictly below ``below`` (or all), the first ``limit``.

    ``rows``: the user's ``home_chunks`` rows (:func:`cached_query`), folded. Entries at
    or below ``horizon`` are not the cache's (a blind batch may have stored some:
    :func:`~views.stores.cassandra.statements.blind_users`).
    """
    found = page(fold(as_chunks(rows)), below, limit, above=horizon)
    return list(map(as_entry, found.tolist()))


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


def author_entries(pages: Iterable[Rows]) -> list[Entry]:
    """Rows of :func:`author_pages` (created_at, tweet_id, author) as entries, in order."""
    return list(map(as_entry, itertools.chain.from_iterable(pages)))


def newest(found: list[Entry], limit: int) -> list[Entry]:
    """The newest ``limit`` entries, newest first."""
    found.sort(reverse=True)
    return found[:limit]


def by_author(authors: Iterable[int], found: Iterable[Entry]) -> dict[int, list[Entry]]:
    """Entries per author, every author a key; in the order found (a partition's: newest first)."""
    out: dict[int, list[Entry]] = {a: [] for a in authors}
    for entry in found:
        out[entry.author_id].append(entry)
    return out


def tweet_rows(pages: list[Rows]) -> dict[int, TweetRow]:
    """Tweets and reposts by id; cells never written (a delete never posted) read as zeros."""
    out = {}
    for rows in pages:
        for (tweet, author, created_at, body, deleted, reply_to, original, original_author,
             record, ref_id) in rows:
            out[tweet] = TweetRow(tweet, author or 0, created_at or 0, body or "", bool(deleted),
                                  reply_to or 0, original or 0, original_author or 0,
                                  record or 0, ref_id or 0)
    return out


def user_rows(pages: list[Rows]) -> dict[int, UserRow]:
    """Profiles by id; an account deleted before any profile reads with empty names."""
    return {u: UserRow(u, h or "", n or "", bool(d)) for rows in pages for u, h, n, d in rows}


def celebrity_rows(rows: Rows) -> list[int]:
    """The celebrities a user follows, from the user's ``relations`` partition."""
    return [other for relation, other in rows if relation == cql.CELEBRITY_ROW]


def relation_set(rows: Rows) -> Relations:
    """One user's ``relations`` partition: blocks either way, and mutes."""
    blocks, muted = set(cql.RELATION_ROWS[BLOCK]), {cql.RELATION_ROWS[MUTE][0]}
    return Relations(frozenset(other for relation, other in rows if relation in blocks),
                     frozenset(other for relation, other in rows if relation in muted))


def reposts_by_original(pages: Iterable[Rows]) -> dict[int, list[Entry]]:
    """Each original's shown reposts (newest first, as clustered); originals with none left out.

    Rows are (original_id, created_at, tweet_id, author_id); a partition's rows come
    together, in clustering order, whichever request read it.
    """
    out: dict[int, list[Entry]] = {}
    for rows in pages:
        for original, created_at, tweet, author in rows:
            out.setdefault(original, []).append(as_entry((created_at, tweet, author)))
    return out
