"""The Cassandra store's home timelines: a row per user per batch, folded at read.

A timeline kept as a row per entry costs the node about 20 µs of CPU an entry
written (a cell each to parse, apply, flush and compact); the writer's batches
carry hundreds of entries per user while a timeline catches up. So
``home_chunks`` keeps, per user, one row per batch that touched the timeline,
clustered by the batch's timestamp ``T``:

- ``removes``: the keys the batch removed, ``(created_at, tweet_id)`` as big-endian
  int64 pairs, written at ``T + REMOVE``;
- ``adds``: the entries the batch added, ``(created_at, tweet_id, author_id)`` as
  big-endian int64 triples, written at ``T + ADD``.

The node then writes one blob a user a batch (``benchmarks/results/layouts.json``:
1.4M entries a node CPU-second at 1,000 entries a user, against 45-49k as rows).

**The fold** (:func:`fold`) reads the rows in ``T`` order, each row's removes before
its adds, and keeps the last word on each key: exactly what a row per entry with
``T + phase`` write timestamps keeps (the last write wins), whatever order the rows
were written in. Two claims of one key list the author of the later add, as one row
would. A batch run again writes the same row (same ``T``, same cells); a batch cut
short and run again under a newer ``T`` outranks what the cut-short attempt left.

**Merging** (:func:`merged`) bounds how many rows a reader folds: once a timeline
is past its size bound or holds too many rows, the writer folds the rows up to its
batch's ``T`` into the row ``T`` itself, cut to the cap, and deletes the older rows
in the same single-partition batch at ``T + TRIM`` (one range tombstone). A reader
sees the merge whole or not at all. The horizon rises to the first key cut, as a
row-per-entry trim's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from views.delta import Key

_BIG: Final = np.dtype(">i8")
#: A timeline's entries: ``(n, 3)`` int64 rows of (created_at, tweet_id, author_id).
NO_ENTRIES: Final = np.zeros((0, 3), np.int64)

#: One stored row: (T, removes or None, adds or None).
Chunk = tuple[int, bytes | None, bytes | None]


def encode(rows: np.ndarray) -> bytes:
    """Int64 rows (entries or keys) as the blob a chunk stores."""
    return np.ascontiguousarray(rows, dtype=_BIG).tobytes()


def decode(blob: bytes | None, width: int) -> np.ndarray:
    """A chunk's blob as ``(n, width)`` int64 rows (none for a missing cell)."""
    if not blob:
        return np.zeros((0, width), np.int64)
    return np.frombuffer(blob, _BIG).reshape(-1, width).astype(np.int64)


def fold(chunks: Sequence[Chunk]) -> np.ndarray:
    """The entries the rows leave, newest first (``(n, 3)``: created_at, tweet, author).

    Each key's last operation in ``(T, removes before adds)`` order decides it;
    the rows may come in any order.
    """
    keys, authors, order, kind = [], [], [], []
    for ts, removes, adds in chunks:
        gone = decode(removes, 2)
        added = decode(adds, 3)
        keys += [gone, added[:, :2]]
        authors += [np.zeros(len(gone), np.int64), added[:, 2]]
        order += [np.full(len(gone), 2 * ts, np.int64), np.full(len(added), 2 * ts + 1, np.int64)]
        kind += [np.zeros(len(gone), bool), np.ones(len(added), bool)]
    if not keys:
        return NO_ENTRIES
    key = np.concatenate(keys)
    if not len(key):
        return NO_ENTRIES
    author, rank, added = np.concatenate(authors), np.concatenate(order), np.concatenate(kind)
    # By key, then operation order; two adds of one key in one row: the greater
    # author last, as Cassandra keeps the greater value of two cells written at once.
    by = np.lexsort((author, rank, key[:, 1], key[:, 0]))
    key, author, added = key[by], author[by], added[by]
    last = np.ones(len(key), bool)
    last[:-1] = (key[1:] != key[:-1]).any(axis=1)
    keep = last & added
    out = np.column_stack((key[keep], author[keep]))
    return out[::-1].copy()


def page(entries: np.ndarray, below: Key | None, limit: int,
         above: Key | None = None) -> np.ndarray:
    """Folded entries between ``above`` and ``below``, both excluded, the first ``limit``.

    None: no bound on that side.
    """
    if len(entries):
        c, t = entries[:, 0], entries[:, 1]
        keep = np.ones(len(entries), bool)
        if below is not None:
            keep &= (c < below[0]) | ((c == below[0]) & (t < below[1]))
        if above is not None:
            keep &= (c > above[0]) | ((c == above[0]) & (t > above[1]))
        entries = entries[keep]
    return entries[:max(limit, 0)]


def merged(chunks: Sequence[Chunk], ts: int, cap: int) -> tuple[np.ndarray, list[Key]]:
    """The rows up to ``ts`` folded into one: the newest ``cap`` entries.

    Returns them and the keys of the newest ``cap + 1`` entries (for the trim's cut,
    :func:`views.stores.cassandra.statements.trim`). Rows above ``ts`` (none, unless
    a batch is run again after later ones) stay as they are, folded after the merge.
    """
    entries = fold([c for c in chunks if c[0] <= ts])
    head = [(int(c), int(t)) for c, t in entries[:cap + 1, :2].tolist()]
    return entries[:cap], head


def as_chunks(rows: Sequence[tuple[Any, ...]]) -> list[Chunk]:
    """Rows read from ``home_chunks`` (ts, removes, adds) as chunks."""
    return [(int(ts), removes, adds) for ts, removes, adds in rows]
