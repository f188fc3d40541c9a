"""What a store tells its readers about its commits: a version, or a change feed.

Serving keeps rendered pages, and rows read for them, across reads
(:mod:`serving.pageversions`); what it needs of the store to know when they went stale
is all that lives here, and each backend gives what it can
(:meth:`~views.stores.contract.TimelineReader.version`):

- a :class:`StoreVersion`: a position that moves when a commit may change a page —
  by default the applied changelog offsets, which every micro-batch moves (SQLite:
  a counter that only page-visible writes move);
- a :class:`ChangeFeed`: also, for each committed batch, the :class:`Changes` it made —
  the users whose home pages and the authors whose own pages may read differently,
  the tweet and user rows that changed, the originals whose shown reposts changed —
  so tokens can be kept per page (Cassandra: ``page_changes`` rows per writer of a
  batch, :mod:`views.stores.cassandra.changes`; SQLite: one ``page_changes`` row per
  batch in its own transaction, :class:`views.stores.sqlite.SQLiteFeed`).

What a batch touched is decided once, here (:meth:`Changes.of`, from the batch's write
plan), for every backend; each backend only stores the sets (:func:`pack_ids`).
"""

from __future__ import annotations

import abc
from array import array
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Self

from views.stores.plan import WritePlan

if TYPE_CHECKING:
    from views.stores.contract import TimelineReader

#: Ids per writer beyond which a batch's changes say ``everything`` instead of listing them.
EVERYTHING: Final = 250_000


class StoreVersion:
    """Where the store's committed state stands, as far as any page can tell.

    This default is the applied changelog offsets, which every micro-batch moves.
    """

    def __init__(self, store: TimelineReader) -> None:
        self.store = store

    def position(self) -> Hashable:
        """What the store has committed now (one cheap question)."""
        return tuple(sorted(self.store.applied_offsets().items()))

    def close(self) -> None:
        """Release what the version holds (a connection of its own)."""


class ChangeFeed(StoreVersion, abc.ABC):
    """A version that also says what each committed batch changed (module docstring)."""

    #: How old an answer to :meth:`position` a reader may take as current (seconds).
    fresh_s: float = 0.0

    @abc.abstractmethod
    def position(self) -> int:
        """Where the newest committed batch stands (0: none), growing with each batch.

        Cassandra: the batch's timestamp; SQLite: the number of its change row.
        """

    @abc.abstractmethod
    def since(self, seen: int | None, committed: int) -> list[tuple[int, Changes]] | None:
        """The changes of the batches committed in (``seen``, ``committed``], by timestamp.

        None when the feed cannot cover them (``seen`` None, a store that went back in
        time, or a gap longer than the feed keeps): everything may have changed.
        """


@dataclass(frozen=True)
class Changes:
    """What one writer of one batch changed, for the page caches (module docstring)."""

    homes: frozenset[int] = frozenset()
    authors: frozenset[int] = frozenset()
    tweets: frozenset[int] = frozenset()
    users: frozenset[int] = frozenset()
    everything: bool = False
    #: originals whose shown reposts changed: no page depends on them, only the rows
    #: kept across pages (serving.pageversions)
    originals: frozenset[int] = frozenset()

    @classmethod
    def of(cls, plan: WritePlan, moved: Iterable[int] = ()) -> Self:
        """The pages and rows ``plan`` may change; timeline trims and reads change none.

        ``moved``: originals a repost of the plan was stored under before.
        """
        if len(plan.adds) + len(plan.removes) > EVERYTHING:  # a bulk batch: no set built
            return cls(everything=True)
        homes = {*plan.adds.users, *(r[0] for r in plan.removes), *(w[0] for w in plan.wipes),
                 *plan.horizons, *(f for f, _ in plan.follows), *(u for u, _ in plan.celeb_edges),
                 *plan.deleted_users}
        homes.update(who for user, other, _ in plan.relations for who in (user, other))
        rows = (*plan.tweets.values(), *plan.reposts.values(), *plan.foreign_deletes)
        originals = {r.original_id for r in plan.reposts.values() if r.original_id}
        changes = cls(frozenset(homes), frozenset({r.author_id for r in rows}
                                                  | set(plan.deleted_users)),
                      frozenset({r.tweet_id for r in rows}),
                      frozenset(plan.users.keys() | plan.deleted_users.keys()),
                      originals=frozenset(originals.union(moved)))
        if changes.size() > EVERYTHING:
            return cls(everything=True)
        return changes

    def size(self) -> int:
        return len(self.homes) + len(self.authors) + len(self.tweets) + len(self.users) \
            + len(self.originals)

    def __bool__(self) -> bool:
        return self.everything or self.size() > 0


def pack_ids(ids: Iterable[int]) -> bytes:
    """A set of ids as a store keeps it in a change row: sorted signed 64-bit, native order."""
    return array("q", sorted(ids)).tobytes()


def unpack_ids(blob: bytes | None) -> frozenset[int]:
    """The ids :func:`pack_ids` packed (None or empty: none)."""
    out = array("q")
    out.frombytes(blob or b"")
    return frozenset(out)
