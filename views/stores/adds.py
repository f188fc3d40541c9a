"""A micro-batch's timeline adds as four int64 columns, not millions of tuples.

A tweet burst's micro-batch carries ~2M timeline adds. As ``(user, created_at,
tweet, author)`` tuples they took ~200 bytes each in the sink's process (a tuple
and three large ints), ~400 MB at the batch's peak, and the store spent more time
building, filtering, sorting and counting them than SQLite spent inserting them
(``benchmarks/RESULTS.md``). :class:`Adds` keeps them as four
``array('q')`` columns (32 bytes an add), filled straight from the packed deltas,
and :class:`SortedAdds` filters and orders them with numpy.

Iterating an :class:`Adds` still yields the tuples, one at a time, for the code
that wants them (the Cassandra statements, tests).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

import numpy as np

from views.delta import Delta, Key, timeline_add_columns

Add = tuple[int, int, int, int]  # user, created_at, tweet, author

#: Rows handed to one ``executemany`` call: bounds the tuples alive at once.
CHUNK: Final = 65_536


class Adds:
    """Timeline adds ``(user, created_at, tweet, author)``, column-wise, in arrival order."""

    __slots__ = ("authors", "created", "tweets", "users")

    def __init__(self, adds: Iterable[Add] = ()) -> None:
        self.users = array("q")
        self.created = array("q")
        self.tweets = array("q")
        self.authors = array("q")
        self.extend(adds)

    def append(self, add: Add) -> None:
        user, created_at, tweet, author = add
        self.users.append(user)
        self.created.append(created_at)
        self.tweets.append(tweet)
        self.authors.append(author)

    def extend(self, adds: Iterable[Add]) -> None:
        for add in adds:
            self.append(add)

    def extend_columns(self, users: np.ndarray, created: np.ndarray, tweets: np.ndarray,
                       authors: np.ndarray) -> None:
        """Append adds given as four int64 columns (a shuffle's rows, column-wise)."""
        for column, values in zip(self._columns(), (users, created, tweets, authors),
                                  strict=True):
            column.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())

    def __iadd__(self, adds: Iterable[Add]) -> Adds:
        self.extend(adds)
        return self

    def take(self, d: Delta) -> None:
        """The adds of a TL_ADD, FANOUT or BACKFILL delta, one ``extend`` per column."""
        for column, values in zip(self._columns(), timeline_add_columns(d), strict=True):
            column.extend(values)

    def _columns(self) -> tuple[array, array, array, array]:
        return self.users, self.created, self.tweets, self.authors

    def __len__(self) -> int:
        return len(self.users)

    def __iter__(self) -> Iterator[Add]:
        return zip(*self._columns(), strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Adds):
            return self._columns() == other._columns()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Adds({list(self)!r})"

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The four columns as numpy views (no copy): user, created_at, tweet, author."""
        return tuple(np.frombuffer(c, dtype=np.int64) if len(c) else np.empty(0, np.int64)
                     for c in self._columns())  # type: ignore[return-value]


class Kept:
    """The adds above their user's horizon, in ``(user, created_at, tweet, author)`` order.

    Holds the columns and the positions of the kept adds in order; rows are gathered
    :data:`CHUNK` at a time, so no sorted copy of the batch is ever whole.
    """

    __slots__ = ("columns", "order")

    def __init__(self, columns: tuple[np.ndarray, ...], order: np.ndarray) -> None:
        self.columns, self.order = columns, order

    def __len__(self) -> int:
        return len(self.order)

    def flat(self) -> Iterator[list[int]]:
        """The rows flattened, :data:`CHUNK` at a time (for a many-row ``INSERT``).

        Each list is ``[user, created_at, tweet, author, user, …]``, in order.
        """
        for i in range(0, len(self.order), CHUNK):
            at = self.order[i:i + CHUNK]
            yield np.column_stack([c[at] for c in self.columns]).ravel().tolist()

    def per_user(self) -> Iterator[tuple[int, int]]:
        """``(user, adds)`` for each user with kept adds, in user order."""
        users = self.columns[0][self.order]  # sorted: runs, not a sort
        starts = run_starts(users)
        counts = np.diff(np.append(starts, len(users)))
        return zip(users[starts].tolist(), counts.tolist(), strict=True)


class SortedAdds:
    """A batch's adds sorted once; the store asks it which users they reach, then what to keep.

    A 2.1M-add burst batch was sorted three times (the users alone for their meta
    rows, then users again and the whole rows for the kept adds): one ``lexsort``
    answers all three, the users being its leading key.
    """

    __slots__ = ("columns", "distinct", "order", "starts")

    def __init__(self, adds: Adds) -> None:
        self.columns = adds.columns()
        users, created, tweets, authors = self.columns
        self.order = np.lexsort((authors, tweets, created, users))
        by_user = users[self.order]
        self.starts = run_starts(by_user)
        self.distinct = by_user[self.starts]

    def users(self) -> list[int]:
        """The users the adds reach, ascending."""
        return self.distinct.tolist()

    def kept(self, horizon: Mapping[int, Key]) -> Kept:
        """The adds whose ``(created_at, tweet)`` is above ``horizon[user]``, in order."""
        order = self.order
        if not len(order):
            return Kept(self.columns, order)
        keys = np.array([horizon[u] for u in self.distinct.tolist()],
                        dtype=np.int64).reshape(-1, 2)
        counts = np.diff(np.append(self.starts, len(order)))
        created, at = self.columns[1][order], np.repeat(keys[:, 0], counts)
        keep = created > at
        tie = created == at
        del created, at  # a burst's batch has millions of adds: free as we go
        tie &= self.columns[2][order] > np.repeat(keys[:, 1], counts)
        keep |= tie
        return Kept(self.columns, order[keep])


def run_starts(values: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts in sorted ``values``."""
    if not len(values):
        return np.empty(0, np.int64)
    return np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
