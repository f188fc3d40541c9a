"""The change feed of the Cassandra store: what each batch changed, for the page caches.

A page cache that asks "did anything change?" of a store-wide version drops every
page at every batch, and a batch lands every second or so under writes, so nearly
every read is rendered anew. The writer knows better: a batch's write plan names the
users whose home pages may read differently (timeline adds and removes, follows,
blocks and mutes, celebrity edges), the authors whose own pages may, and the tweet
and user rows that changed (deletes, shown or hidden reposts, profiles, deleted
accounts). Each writer of a batch (the driver's :meth:`CassandraStore._write`, or
every executor task of :mod:`views.stores.cassandra.tasks`) writes that as
``page_changes_by_shard`` rows at the batch's timestamp ``T`` before the batch is
marked committed (``writer_clock.committed_ts``): one per feed shard whose users' homes
it touched, and one in the rows shard with the rest
(:meth:`views.stores.versions.Changes.sharded`; schema step 7). A retried writer
writes the same rows (a row's ``part`` is a hash of its contents).

:class:`CassandraFeed` reads it for the page caches of an API process
(:mod:`serving.pageversions`): :meth:`~CassandraFeed.position` is the committed
timestamp (one row), :meth:`~CassandraFeed.since` the rows of the batches in between
— one request per hour of ``T``, over the partitions of the feed's shards and the
rows shard only, so that a process serving 1/k of the users reads about 1/k of the
homes — merged into one :class:`Changes` per batch. Reads take an answer up to the
store URL's ``page_fresh_ms`` old (20 ms by default; 0: only an answer asked for
after the read arrived).

What a batch touched is :meth:`views.stores.versions.Changes.of`, shared with the
SQLite store's feed; this module only stores and reads it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Final

from views.stores import versions
from views.stores.cassandra import statements as cql
from views.stores.contract import TimelineReader
from views.stores.versions import pack_ids as _pack
from views.stores.versions import unpack_ids as _unpack

#: One partition per shard and hour of batch timestamps (µs).
BUCKET_US: Final = 3_600_000_000
#: Hours an API process may fall behind and still catch up from the feed (its TTL is a day).
MAX_BUCKETS: Final = 20


class Changes(versions.Changes):
    """What one writer of one batch changed, as its ``page_changes_by_shard`` rows hold it."""

    def ops(self, ts: int) -> list[cql.Op]:
        """The rows at batch timestamp ``ts``, a shard each (none if nothing changed)."""
        return [row_op(ts, s, part) for s, part in sorted(self.sharded().items())]

    @classmethod
    def decode(cls, row: tuple[Any, ...]) -> Changes:
        """A row of ``changes_get`` (``homes, authors, tweets, users, everything, originals``)."""
        homes, authors, tweets, users, everything, originals = row
        return cls(_unpack(homes), _unpack(authors), _unpack(tweets), _unpack(users),
                   bool(everything), _unpack(originals))


def row_op(ts: int, shard: int, changes: versions.Changes) -> cql.Op:
    """One shard's row of a writer at batch timestamp ``ts``, keyed by its contents."""
    blobs = [_pack(ids) for ids in (changes.homes, changes.authors, changes.tweets,
                                    changes.users)]
    originals = _pack(changes.originals)
    hashed = [*blobs, originals] if changes.originals else blobs
    digest = hashlib.blake2b(b"|".join(hashed) + bytes([changes.everything]), digest_size=8)
    part = int.from_bytes(digest.digest(), "little") & (2 ** 63 - 1)
    return ("changes_add", (ts // BUCKET_US, shard, ts, part, *blobs, changes.everything,
                            originals, ts))


def committed_op(ts: int) -> cql.Op:
    """Mark the batch at ``ts`` committed: its writes and its change rows are all in."""
    return ("committed_set", (ts, ts))


#: Runs one named statement and returns its rows (the store's ``_rows``).
Run = Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]


class CassandraFeed(versions.ChangeFeed):
    """The store's change feed, read through ``run`` (module docstring).

    ``shards``: the feed shards whose homes it reads (None: all); the rows shard always.
    """

    def __init__(self, store: TimelineReader, run: Run, fresh_s: float = 0.0,
                 shards: versions.Shards = None) -> None:
        super().__init__(store)
        self._run, self.fresh_s, self.shards = run, fresh_s, shards
        every = range(versions.FEED_SHARDS) if shards is None else sorted(shards)
        self._partitions = [versions.ROWS_SHARD, *every]
        #: Rows and ids this feed decoded (what :meth:`since` cost), for tests and benchmarks.
        self.rows_read = self.ids_read = 0

    def for_shards(self, shards: versions.Shards) -> CassandraFeed:
        return CassandraFeed(self.store, self._run, self.fresh_s, shards)

    def position(self) -> int:
        rows = self._run("committed_get", ())
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def since(self, seen: int | None, committed: int) -> list[tuple[int, versions.Changes]] | None:
        if seen is None or committed < seen or \
                committed // BUCKET_US - seen // BUCKET_US > MAX_BUCKETS:
            return None  # a first look, a rebuilt keyspace, or too far behind
        batches: dict[int, versions.Changes] = {}
        for bucket in range(seen // BUCKET_US, committed // BUCKET_US + 1):
            for row in self._run("changes_get", (bucket, self._partitions, seen, committed)):
                ts, changes = int(row[0]), Changes.decode(row[1:])
                self.rows_read += 1
                self.ids_read += changes.size()
                batches[ts] = batches[ts].merged(changes) if ts in batches else changes
        return sorted(batches.items(), key=lambda item: item[0])
