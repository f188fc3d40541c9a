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

**Shards.** An API process need not read every user's changes (docs/design.md §7,
*Scaling out*): a user's home page belongs to feed shard :func:`shard` of the user, one
of :data:`FEED_SHARDS`, and a feed may store a batch's ``homes`` per shard
(:meth:`Changes.sharded`: Cassandra) so that a reader of some shards reads only theirs.
Everything else a batch names — authors, tweet and user rows, originals, ``everything``
— is a row that pages of any shard may have been decided on (a celebrity's list of
tweets is read by the pages of all its followers), so it goes to every reader, in the
*rows shard* :data:`ROWS_SHARD`; it is small beside the homes (at most a few ids per
tweet, where the homes are one per follower).
"""

from __future__ import annotations

import abc
from array import array
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Self

import numpy as np

from views.stores.plan import WritePlan

if TYPE_CHECKING:
    from views.stores.contract import TimelineReader

#: Ids per writer beyond which a batch's changes say ``everything`` instead of listing them.
EVERYTHING: Final = 250_000

#: Feed shards of the users' home pages: fixed for every writer and reader of a store.
#: A process reading 1/16 of them reads 1/16 of the homes a batch names plus the rows
#: shard (about 2 ids per tweet written): at Twitter's 2012 rates (345k timeline writes/s
#: from ~4.6k tweets/s) 22k + ~9k ids/s instead of 355k; 64 shards would only take that
#: to 5k + 9k, for four times the rows a batch writes. A change of this constant changes
#: which rows a reader reads: every writer and API process must restart on the new value
#: together (the feed itself is transient, kept a day, so nothing is rebuilt).
FEED_SHARDS: Final = 16
#: The shard of the rows every reader reads (not a user's shard).
ROWS_SHARD: Final = -1
#: A set of feed shards (None: all of them).
Shards = frozenset[int] | None

_MASK: Final = (1 << 64) - 1


def shard(user: int) -> int:
    """The feed shard of ``user``'s pages: splitmix64's finalizer of the id, modulo shards.

    The same in every process and Python (no ``hash()``), and well mixed for sequential
    ids and snowflakes alike (their low bits are a worker and a sequence).
    """
    z = (user + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) % FEED_SHARDS


def shard_array(ids: np.ndarray) -> np.ndarray:
    """:func:`shard` of each id of an int64 array (uint64 arithmetic wraps as ``& _MASK``)."""
    z = ids.astype(np.int64).view(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((z ^ (z >> np.uint64(31))) % np.uint64(FEED_SHARDS)).astype(np.int64)


def in_shards(user: int, shards: Shards) -> bool:
    """Whether ``user``'s pages are in ``shards`` (None: all)."""
    return shards is None or shard(user) in shards


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
    #: The shards whose ``homes`` :meth:`since` reads (None: all): a feed that stores
    #: them per shard reads only those (:meth:`for_shards`); the rest of a batch's
    #: changes it always reads.
    shards: Shards = None

    def for_shards(self, shards: Shards) -> ChangeFeed:
        """A feed that may read only ``shards``' homes; this one keeps no shards (SQLite).

        The reader filters what it is given anyway (:mod:`serving.pageversions`).
        """
        return self

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

    def sharded(self) -> dict[int, Changes]:
        """These changes as a feed stores them per shard (module docstring).

        Each shard's ``homes``, and the rest (or ``everything``) under
        :data:`ROWS_SHARD`; shards with nothing are left out.
        """
        if self.everything:
            return {ROWS_SHARD: Changes(everything=True)}
        out: dict[int, Changes] = {}
        rest = Changes(authors=self.authors, tweets=self.tweets, users=self.users,
                       originals=self.originals)
        if rest:
            out[ROWS_SHARD] = rest
        if self.homes:
            homes = np.fromiter(self.homes, dtype=np.int64, count=len(self.homes))
            of = shard_array(homes)
            for s in np.unique(of).tolist():
                out[s] = Changes(homes=frozenset(homes[of == s].tolist()))
        return out

    def merged(self, other: Changes) -> Changes:
        """What ``self`` and ``other`` (two rows of one batch) changed together."""
        if self.everything or other.everything:
            return Changes(everything=True)
        return Changes(self.homes | other.homes, self.authors | other.authors,
                       self.tweets | other.tweets, self.users | other.users,
                       originals=self.originals | other.originals)

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
