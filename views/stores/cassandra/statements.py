"""The Cassandra store's statements, and the pure step from a WritePlan to bound values.

Every statement fanout sends to Cassandra is in :data:`STATEMENTS`, as fixed text with
bind markers: values are never formatted into CQL. The functions below turn a
:class:`~views.stores.plan.WritePlan` plus what the writer has read into *ops* —
``(statement name, bound values)`` pairs — with no driver and no I/O, so they are
unit-tested directly; :mod:`views.stores.cassandra.store` prepares the statements and runs
the ops.

**Write timestamps.** Each micro-batch gets one client-side timestamp ``T`` (µs);
its writes use ``T + phase``: table rows, wipes and removes at ``T + REMOVE``, adds (and
a returning user's regenerated cache) at ``T + ADD``, trims, the caches of users going
dormant and timeline_meta at ``T + TRIM``. Cassandra resolves a conflict by timestamp
and lets a deletion win a tie, so without the phases an add that follows a wipe of
the same row in one batch (an unfollow then a follow) would be lost.
``T`` is larger than every earlier batch's (see :func:`batch_timestamp`), so later
batches win whatever the order replicas see the writes in.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import numpy as np

from ingest.events import BLOCK, MUTE
from views.delta import Key
from views.errors import StoreError
from views.stores.adds import Adds, SortedAdds, run_starts
from views.stores.cassandra import chunks
from views.stores.plan import WritePlan, outranks
from views.stores.rows import DORMANT, DeadRow, Entry, ProfileRow, RelationRow, TweetRow

Op = tuple[str, tuple[Any, ...]]
"""A statement name of :data:`STATEMENTS` and the values to bind to it."""
Removed = tuple[int, int, int]
"""A removed timeline entry's key: (user, created_at, tweet_id)."""

REMOVE: Final = 0
ADD: Final = 1
TRIM: Final = 2
#: Timestamps reserved per batch (phases 0..2, one spare).
STRIDE: Final = 4
#: Batch ids per ``batches`` partition: the newest ``limit`` batches are in at most
#: two partitions, read newest first, and a partition stays small (~1 MB).
BATCH_BUCKET: Final = 10_000
_INT_MAX: Final = 2**31 - 1
#: The horizon of a user whose cached timeline is complete (stored as -1, -1).
NO_HORIZON: Final[Key] = (-1, -1)
_NO_ADDS: Final = np.zeros((0, 4), np.int64)
#: ``home_chunks`` rows a timeline may hold before the writer merges them: a read
#: folds at most about this many rows (``views/stores/cassandra/chunks.py``).
CHUNKS_MAX: Final = 32

STATEMENTS: Final[dict[str, str]] = {
    # -- home timelines: a row per user per batch (views/stores/cassandra/chunks.py) ----
    "home_removes": "INSERT INTO home_chunks (user_id, batch_ts, removes) VALUES (?, ?, ?) "
                    "USING TIMESTAMP ?",
    "home_adds": "INSERT INTO home_chunks (user_id, batch_ts, adds) VALUES (?, ?, ?) "
                 "USING TIMESTAMP ?",
    # The rows up to a batch folded into its own row: one partition, one mutation.
    "home_merge": "BEGIN UNLOGGED BATCH USING TIMESTAMP ? "
                  "DELETE FROM home_chunks WHERE user_id = ? AND batch_ts < ?; "
                  "INSERT INTO home_chunks (user_id, batch_ts, removes, adds) "
                  "VALUES (?, ?, null, ?); APPLY BATCH",
    "home_get": "SELECT batch_ts, removes, adds FROM home_chunks WHERE user_id = ?",
    "horizon_get": "SELECT horizon_created_at, horizon_tweet_id FROM timeline_meta "
                   "WHERE user_id = ?",
    "meta_get": "SELECT horizon_created_at, horizon_tweet_id, size, read_at, chunks "
                "FROM timeline_meta WHERE user_id = ?",
    "meta_set": "INSERT INTO timeline_meta (user_id, horizon_created_at, horizon_tweet_id, "
                "size, read_at, chunks) VALUES (?, ?, ?, ?, ?, ?) USING TIMESTAMP ?",
    # A dormant user's cache (inactive users): the whole partition, one tombstone.
    "home_drop": "DELETE FROM home_chunks USING TIMESTAMP ? WHERE user_id = ?",
    # -- tweets ------------------------------------------------------------------------
    "author_add": "INSERT INTO author_tweets (author_id, created_at, tweet_id) "
                  "VALUES (?, ?, ?) USING TIMESTAMP ?",
    "author_del": "DELETE FROM author_tweets USING TIMESTAMP ? "
                  "WHERE author_id = ? AND created_at = ? AND tweet_id = ?",
    "author_page": "SELECT created_at, tweet_id FROM author_tweets "
                   "WHERE author_id = ? AND (created_at, tweet_id) < (?, ?) LIMIT ?",
    "tweet_live": "INSERT INTO tweets (tweet_id, author_id, created_at, body, deleted, "
                  "reply_to, record, ref_id) VALUES (?, ?, ?, ?, false, ?, ?, ?) "
                  "USING TIMESTAMP ?",
    "tweet_gone": "UPDATE tweets USING TIMESTAMP ? SET author_id = ?, deleted = true, "
                  "body = '' WHERE tweet_id = ?",
    "tweet_gone_at": "UPDATE tweets USING TIMESTAMP ? SET author_id = ?, created_at = ?, "
                     "deleted = true, body = '' WHERE tweet_id = ?",
    # A post whose claim outranks another author's stored row: every cell of it.
    "tweet_take": "INSERT INTO tweets (tweet_id, author_id, created_at, body, deleted, "
                  "reply_to, original_id, original_author, record, ref_id) "
                  "VALUES (?, ?, ?, ?, ?, ?, 0, 0, ?, ?) USING TIMESTAMP ?",
    "tweet_state": "SELECT created_at, deleted, author_id, original_id FROM tweets "
                   "WHERE tweet_id = ?",
    # -- reposts ---------------------------------------------------------------------------
    "repost_set": "INSERT INTO tweets (tweet_id, author_id, created_at, body, deleted, "
                  "original_id, original_author) VALUES (?, ?, ?, '', ?, ?, ?) "
                  "USING TIMESTAMP ?",
    "repost_add": "INSERT INTO reposts_by_original (original_id, created_at, tweet_id, "
                  "author_id) VALUES (?, ?, ?, ?) USING TIMESTAMP ?",
    "repost_del": "DELETE FROM reposts_by_original USING TIMESTAMP ? "
                  "WHERE original_id = ? AND created_at = ? AND tweet_id = ?",
    # One partition, paged: an original whose reposts fill a reposts_of_in read's LIMIT.
    "reposts_of": "SELECT original_id, created_at, tweet_id, author_id "
                  "FROM reposts_by_original WHERE original_id = ? "
                  "AND (created_at, tweet_id) > (?, ?)",
    # -- graph and profiles --------------------------------------------------------------
    "follow_on": "INSERT INTO follows (follower_id, followee_id, created_at) "
                 "VALUES (?, ?, ?) USING TIMESTAMP ?",
    "follow_off": "DELETE FROM follows USING TIMESTAMP ? "
                  "WHERE follower_id = ? AND followee_id = ?",
    "followees": "SELECT followee_id FROM follows WHERE follower_id = ?",
    "celeb_edge_on": "INSERT INTO celebrity_follows (user_id, celebrity_id) "
                     "VALUES (?, ?) USING TIMESTAMP ?",
    "celeb_edge_off": "DELETE FROM celebrity_follows USING TIMESTAMP ? "
                      "WHERE user_id = ? AND celebrity_id = ?",
    "celeb_on": "INSERT INTO celebrities (bucket, author_id) VALUES (0, ?) USING TIMESTAMP ?",
    "celeb_off": "DELETE FROM celebrities USING TIMESTAMP ? WHERE bucket = 0 AND author_id = ?",
    "celebs": "SELECT author_id FROM celebrities WHERE bucket = 0",
    "user_set": "INSERT INTO users (user_id, handle, name, created_at) "
                "VALUES (?, ?, ?, ?) USING TIMESTAMP ?",
    # Never cleared: an account deletion is final, and profiles never write the flag.
    # The profile is forgotten; the writer writes no profile over a deleted account.
    "user_gone": "UPDATE users USING TIMESTAMP ? SET deleted = true, handle = '', name = '' "
                 "WHERE user_id = ?",
    "user_time": "SELECT created_at, deleted FROM users WHERE user_id = ?",
    "relation_on": "INSERT INTO relations (user_id, relation, other_id, created_at) "
                   "VALUES (?, ?, ?, ?) USING TIMESTAMP ?",
    "relation_off": "DELETE FROM relations USING TIMESTAMP ? "
                    "WHERE user_id = ? AND relation = ? AND other_id = ?",
    "relations_get": "SELECT relation, other_id FROM relations WHERE user_id = ?",
    # -- bookkeeping -----------------------------------------------------------------------
    "offset_set": "INSERT INTO applied_offsets (topic, kafka_partition, kafka_offset) "
                  "VALUES (?, ?, ?) USING TIMESTAMP ?",
    "offsets": "SELECT topic, kafka_partition, kafka_offset FROM applied_offsets",
    # The first sighting of a record wins, like SQLite's INSERT OR IGNORE: a sighting's
    # write timestamp falls as its time grows (:func:`first_seen_ts`).
    "dead_add": "INSERT INTO dead_letters (topic, kafka_partition, kafka_offset, reason, raw, "
                "seen_at) VALUES (?, ?, ?, ?, ?, ?) USING TIMESTAMP ?",
    "dead_all": "SELECT topic, kafka_partition, kafka_offset, reason, raw, seen_at "
                "FROM dead_letters",
    # Where letters are, and a count within one of those partitions (schema step 6).
    "dead_part_add": "INSERT INTO dead_letter_partitions (bucket, topic, kafka_partition) "
                     "VALUES (0, ?, ?)",
    "dead_parts": "SELECT topic, kafka_partition FROM dead_letter_partitions WHERE bucket = 0",
    "dead_count": "SELECT count(*) FROM dead_letters WHERE topic = ? AND kafka_partition = ?",
    "batch_get": "SELECT write_ts, offsets_digest FROM batches "
                 "WHERE bucket = ? AND batch_id = ?",
    "batch_set": "INSERT INTO batches (bucket, batch_id, write_ts, offsets_digest, "
                 "finished_at, row_count, seconds, max_event_time) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?",
    "batch_page": "SELECT batch_id, finished_at, row_count, seconds, max_event_time "
                  "FROM batches WHERE bucket = ? LIMIT ?",
    "clock_get": "SELECT write_ts, last_batch FROM writer_clock WHERE id = 0",
    # -- the change feed (views.stores.cassandra.changes) ------------------------------
    # One row per writer and feed shard (schema step 7); read for a set of shards.
    "changes_add": "INSERT INTO page_changes_by_shard (bucket, shard, ts, part, homes, authors, "
                   "tweets, users, everything, originals) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                   "USING TIMESTAMP ?",
    "changes_get": "SELECT ts, homes, authors, tweets, users, everything, originals "
                   "FROM page_changes_by_shard "
                   "WHERE bucket = ? AND shard IN ? AND ts > ? AND ts <= ?",
    "committed_set": "UPDATE writer_clock USING TIMESTAMP ? SET committed_ts = ? WHERE id = 0",
    "committed_get": "SELECT committed_ts FROM writer_clock WHERE id = 0",
    "clock_set": "INSERT INTO writer_clock (id, write_ts) VALUES (0, ?) USING TIMESTAMP ?",
    "last_batch_set": "UPDATE writer_clock USING TIMESTAMP ? SET last_batch = ? WHERE id = 0",
    # -- the writer's lookups, many partitions per request (see LOOKUP_IN) -------------
    "meta_get_in": "SELECT user_id, horizon_created_at, horizon_tweet_id, size, read_at, "
                   "chunks FROM timeline_meta WHERE user_id IN ?",
    "user_time_in": "SELECT user_id, created_at, deleted FROM users WHERE user_id IN ?",
    "home_get_in": "SELECT user_id, batch_ts, removes, adds FROM home_chunks WHERE user_id IN ?",
    "tweet_state_in": "SELECT tweet_id, created_at, deleted, author_id, original_id "
                      "FROM tweets WHERE tweet_id IN ?",
    # -- the read path's hydration and merges, many partitions per request ------------
    # (views.stores.cassandra.rows): the partition key comes first in each row, and the
    # LIMIT bounds the rows of the request, so that the node reads its partitions at once.
    "tweet_get_in": "SELECT tweet_id, author_id, created_at, body, deleted, reply_to, "
                    "original_id, original_author, record, ref_id FROM tweets "
                    "WHERE tweet_id IN ? LIMIT ?",
    "user_get_in": "SELECT user_id, handle, name, deleted FROM users WHERE user_id IN ? LIMIT ?",
    "reposts_of_in": "SELECT original_id, created_at, tweet_id, author_id "
                     "FROM reposts_by_original WHERE original_id IN ? "
                     "AND (created_at, tweet_id) > (?, ?) LIMIT ?",
    "author_page_in": "SELECT created_at, tweet_id, author_id FROM author_tweets "
                      "WHERE author_id IN ? AND (created_at, tweet_id) < (?, ?) "
                      "PER PARTITION LIMIT ? LIMIT ?",
    # -- full scans (operators and verify only) ----------------------------------------
    "followers_all": "SELECT DISTINCT follower_id FROM follows",
    "home_users_all": "SELECT DISTINCT user_id FROM home_chunks",
    "home_chunks_all": "SELECT user_id, batch_ts, removes, adds FROM home_chunks",
    "celeb_users_all": "SELECT DISTINCT user_id FROM celebrity_follows",
}

#: Tables that :meth:`CassandraStore.counts` reports by their rows, as the SQLite store
#: does (``home_timeline``, its entries, it counts by folding ``home_chunks``).
COUNTED: Final = ("author_tweets", "tweets", "follows", "celebrity_follows",
                  "celebrities", "users", "dead_letters", "timeline_meta",
                  "reposts_by_original", "relations")
# Identifiers from the fixed tuple above, never values: CQL cannot bind a table name.
STATEMENTS.update({f"count_{t}": f"SELECT count(*) FROM {t}" for t in COUNTED})

#: Writes that go to Cassandra one unlogged batch per partition: the statement's table,
#: and which bound value is its partition key (None: a constant key). A batch of one
#: partition is a single mutation — one request for the driver, one write for each
#: replica — where statement by statement it is one of each per row: measured here,
#: 5-25x less CPU on both sides for timeline adds (``benchmarks/bench_cql_batches.py``).
PARTITION_KEY: Final[dict[str, tuple[str, int | None]]] = {
    "home_adds": ("home_chunks", 0), "home_removes": ("home_chunks", 0),
    "home_drop": ("home_chunks", 1),
    "meta_set": ("timeline_meta", 0),
    "author_add": ("author_tweets", 0), "author_del": ("author_tweets", 1),
    "follow_on": ("follows", 0), "follow_off": ("follows", 1),
    "celeb_edge_on": ("celebrity_follows", 0), "celeb_edge_off": ("celebrity_follows", 1),
    "celeb_on": ("celebrities", None), "celeb_off": ("celebrities", None),
    "dead_part_add": ("dead_letter_partitions", None),
    "tweet_live": ("tweets", 0), "tweet_gone": ("tweets", 2), "tweet_gone_at": ("tweets", 3),
    "tweet_take": ("tweets", 0), "repost_set": ("tweets", 0),
    "repost_add": ("reposts_by_original", 0), "repost_del": ("reposts_by_original", 1),
    "relation_on": ("relations", 0), "relation_off": ("relations", 1),
    "user_set": ("users", 0), "user_gone": ("users", 1),
}
#: Statements in one batch at most. Cassandra's batch-size warning and limit count only
#: batches over several partitions; this cap bounds the size of one request.
BATCH_MAX: Final = 256
#: Statements in one batch over several partitions (of one replica set) at most.
#: Measured with one row per partition: 4-13x less client and 4-7x less node CPU per
#: row than a statement each (``benchmarks/bench_cql_batches.py``). The node logs, at
#: most once a minute, that an unlogged batch covers several partitions.
PACK_MAX: Final = 24
#: The size of a batch over several partitions at most, as :func:`data_size` counts
#: it: under Cassandra's batch size warning (``batch_size_warn_threshold``, 5 KiB),
#: which the node logs for every such batch past it (not once a minute) and sends
#: back to the client, and far under the 50 KiB past which it refuses one. A single
#: partition's batch or statement is not held to either.
PACK_BYTES: Final = 4096
#: What :func:`data_size` counts for a statement besides its values, and for each
#: value besides its bytes: over what Cassandra counts (a row's clustering, liveness
#: and deletion time and its partition's, ~50 bytes; a cell's timestamp, TTL and
#: deletion time, 16), so that a pack that fits stays under the warning.
STATEMENT_BYTES: Final = 48
VALUE_BYTES: Final = 16


def data_size(params: Sequence[Any]) -> int:
    """A statement's size as Cassandra's batch size counts it, or a little over.

    :data:`STATEMENT_BYTES`, and per bound value :data:`VALUE_BYTES` and its bytes (a
    blob's or text's length, 8 for a number). Cassandra counts the mutations' data.
    """
    size = STATEMENT_BYTES
    for value in params:
        if isinstance(value, bytes):
            size += VALUE_BYTES + len(value)
        elif isinstance(value, str):
            size += VALUE_BYTES + len(value.encode())
        else:
            size += VALUE_BYTES + 8
    return size


#: A table a statement names (after FROM, INTO or UPDATE).
_TABLE: Final = re.compile(r"\b(FROM|INTO|UPDATE)\s+([a-z_][a-z0-9_]*)\b")


def in_keyspace(text: str, keyspace: str) -> str:
    """``text`` with every table it names qualified by ``keyspace``.

    The store prepares its statements so: Cassandra 5.0 warns of a statement prepared
    unqualified in a session's keyspace (``USE``), and with the keyspace in the prepare
    instead (protocol v5) it warned of every statement.
    """
    return _TABLE.sub(lambda m: f"{m.group(1)} {keyspace}.{m.group(2)}", text)


#: Single-row lookups the writer makes for many keys at once, and the statement that
#: reads up to :data:`IN_MAX` of them per request (the key first in each row). One
#: request for a hundred partitions costs the node and the driver a fraction of a
#: hundred requests; on a cluster the coordinator gathers the replicas' answers.
LOOKUP_IN: Final = {"meta_get": "meta_get_in", "user_time": "user_time_in",
                    "tweet_state": "tweet_state_in", "home_get": "home_get_in"}
IN_MAX: Final = 100


def lookup_ops(queries: Mapping[str, Sequence[int]]) -> list[Op]:
    """The requests for single-key lookups: chunks of ``IN`` reads where there is one."""
    ops: list[Op] = []
    for name, keys in queries.items():
        many = LOOKUP_IN.get(name)
        if many is None:
            ops.extend((name, (k,)) for k in keys)
        else:
            ops.extend((many, (list(keys[i:i + IN_MAX]),))
                       for i in range(0, len(keys), IN_MAX))
    return ops


def lookup_rows(queries: Mapping[str, Sequence[int]],
                results: Iterable[list[tuple[Any, ...]]]) -> dict[str, dict[int, list[Any]]]:
    """Each query's rows by key, from the results of :func:`lookup_ops`, in order."""
    found: dict[str, dict[int, list[Any]]] = {}
    it = iter(results)
    for name, keys in queries.items():
        by_key: dict[int, list[Any]] = {k: [] for k in keys}
        if name not in LOOKUP_IN:
            for k in keys:
                by_key[k] = list(next(it))
        else:
            for _ in range(0, len(keys), IN_MAX):
                for row in next(it):
                    by_key[row[0]].append(tuple(row[1:]))
        found[name] = by_key
    return found


def units(ops: Sequence[Op], replica: Callable[[Any], Hashable] | None = None
          ) -> list[list[int]]:
    """The ops' indices grouped as they are sent, one request per group.

    :data:`PARTITION_KEY` writes go in unlogged batches: first a group per partition
    (at most :data:`BATCH_MAX`, in their order); then partitions of one table whose
    keys ``replica`` maps to the same replicas (all of them, without ``replica``) are
    packed together up to :data:`PACK_MAX` statements and :data:`PACK_BYTES` of
    :func:`data_size`, so that a batch goes to nodes that own every row of it.
    Everything else is one request each.
    """
    out: list[list[int]] = []
    partitions: dict[tuple[str, Any], list[int]] = {}
    for i, (name, params) in enumerate(ops):
        where = PARTITION_KEY.get(name)
        if where is None:
            out.append([i])
            continue
        key = (where[0], None if where[1] is None else params[where[1]])
        group = partitions.get(key)
        if group is None or len(group) >= BATCH_MAX:
            group = partitions[key] = []
            out.append(group)
        group.append(i)

    def partition(group: list[int]) -> tuple[str, Any] | None:
        name, params = ops[group[0]]
        found = PARTITION_KEY.get(name)
        return None if found is None else (
            found[0], None if found[1] is None else params[found[1]])

    def size(group: list[int]) -> int:
        return sum(data_size(ops[i][1]) for i in group)

    return packed(out, partition, size, replica)


def packed(groups: list[list[int]], where: Callable[[list[int]], tuple[str, Any] | None],
           size: Callable[[list[int]], int], replica: Callable[[Any], Hashable] | None
           ) -> list[list[int]]:
    """Small groups of one table and replica set merged, up to :data:`PACK_MAX` each.

    ``where`` gives a group's table and partition key (None: a request of its own);
    ``size`` its :func:`data_size`, of which a pack holds at most :data:`PACK_BYTES`.
    """
    out: list[list[int]] = []
    open_packs: dict[tuple[str, Hashable], tuple[list[int], list[int]]] = {}
    for group in groups:
        found = where(group)
        weight = size(group)
        if found is None or len(group) >= PACK_MAX or weight > PACK_BYTES:
            out.append(group)
            continue
        table, key = found
        pack_key = (table, None if replica is None else replica(key))
        pack, held = open_packs.get(pack_key, (None, [0]))
        if pack is None or len(pack) + len(group) > PACK_MAX or held[0] + weight > PACK_BYTES:
            pack, held = open_packs[pack_key] = ([], [0])
            out.append(pack)
        pack.extend(group)
        held[0] += weight
    return out


class TweetState(NamedTuple):
    """What the ``tweets`` table already holds for a tweet (created_at may be unknown).

    ``original_id``: the reposted tweet, for a repost's row (None for a post).
    """

    created_at: int | None
    deleted: bool
    author_id: int | None = None
    original_id: int | None = None

    @classmethod
    def decode(cls, rows: list[tuple[Any, ...]]) -> TweetState | None:
        """From a ``tweet_state`` read (None: no row)."""
        if not rows:
            return None
        created_at, deleted, author, original = rows[0]
        return cls(created_at, bool(deleted), author, original or None)


# -- batch timestamps ---------------------------------------------------------------------

def offsets_digest(offsets: Mapping[tuple[str, int], int]) -> str:
    """A fingerprint of a batch's input (its highest offset per partition); "" if none."""
    if not offsets:
        return ""
    text = json.dumps(sorted([t, p, o] for (t, p), o in offsets.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def batch_timestamp(now_us: int, floor: int, recorded: tuple[int, str] | None,
                    digest: str) -> int:
    """The write timestamp of a batch.

    A batch already applied with the same input (same id, same offsets) reuses its
    recorded timestamp, so a replay writes the same cells at the same timestamps, and
    a late duplicate of an old batch loses to every later batch (it cannot resurrect
    a row a later batch deleted). Otherwise the clock, but never below ``floor`` (the
    last timestamp used + STRIDE, kept in ``writer_clock``), so batches stay ordered
    across restarts on hosts whose clocks disagree. Batch ids restart at 0 with a new
    Spark checkpoint, which is why a new checkpoint needs a fresh keyspace.
    """
    if recorded is not None and digest and recorded[1] == digest:
        return recorded[0]
    return max(now_us, floor)


# -- reads the writer needs first ------------------------------------------------------------

def lookup_ids(plan: WritePlan) -> list[int]:
    """Ids whose stored state the batch needs: its tweets, reposts, removes of unknown time."""
    unknown = {t for _, t, created_at, _ in plan.removes if not created_at}
    return sorted(set(plan.tweets) | set(plan.reposts) | unknown)


def claims(states: Mapping[int, TweetState]) -> dict[int, tuple[int | None, int | None]]:
    """tweet_id → (created_at, author_id) of the stored rows (for id conflicts)."""
    return {t: (s.created_at, s.author_id) for t, s in states.items()}


def tweet_times(plan: WritePlan, states: Mapping[int, TweetState]) -> dict[int, int]:
    """tweet_id → created_at from the plan, else from the ``tweets`` table."""
    times = {t: s.created_at for t, s in states.items() if s.created_at is not None}
    times.update({t: row.created_at for t, row in plan.tweets.items() if row.created_at})
    return times


def wipe_users(wipes: Iterable[tuple[int, int]]) -> dict[int, set[int]]:
    """Map each wiped user to the authors whose tweets leave that user's timeline."""
    out: dict[int, set[int]] = {}
    for user, author in wipes:
        out.setdefault(user, set()).add(author)
    return out


# -- phase REMOVE: tables, wipes, removes ------------------------------------------------------

def tweet_ops(plan: WritePlan, states: Mapping[int, TweetState], ts: int) -> list[Op]:
    """Tweets and author_tweets, as the SQLite store writes them.

    A tweet id belongs to whoever posted it: a delete under another author's id
    neither hides the tweet nor keeps it hidden, and a tweet its author deleted
    stays deleted (no live write over it). Of two authors' claims the earlier owns
    the id (:func:`~views.stores.plan.outranks`): a later one writes nothing but the
    removal of its author's own ``author_tweets`` row. An id the batch also writes a repost of
    is left to :func:`repost_ops`: SQLite writes reposts after tweets, so the join's
    repost state is what stays, and here both would land at one timestamp, where
    Cassandra keeps the larger value of each cell (``deleted`` true over false:
    a delete under another user's id would hide a shown repost).
    """
    times = tweet_times(plan, states)
    ops: list[Op] = []
    foreign = [(row.tweet_id, row, True) for row in plan.foreign_deletes]
    for tweet, row, other in [*((t, r, False) for t, r in sorted(plan.tweets.items())), *foreign]:
        author = row.author_id
        if other and row.created_at:  # a claim the batch's own outranks (WritePlan)
            ops.append(("author_del", (ts, author, row.created_at, tweet)))
            continue
        if tweet in plan.reposts:
            continue
        stored = states.get(tweet)
        if stored is not None:
            owner = stored.author_id
        else:  # a second author's delete hides only a tweet stored as theirs (as in SQLite)
            owner = None if other else author
        if stored is not None and owner != author and row.created_at:
            ops += _rival_tweet(row, stored, ts)
        elif not row.deleted:
            if stored is None or not stored.deleted or owner != author:
                ops.append(("tweet_live", (tweet, author, row.created_at, row.text,
                                           row.reply_to, row.record, row.ref_id, ts)))
                ops.append(("author_add", (author, row.created_at, tweet, ts)))
        elif owner != author:
            continue  # someone else's tweet
        elif row.created_at or tweet in times:
            at = row.created_at or times[tweet]
            ops.append(("tweet_gone_at", (ts, author, at, tweet)))
            ops.append(("author_del", (ts, author, at, tweet)))
        else:  # never posted here: nothing to remove from author_tweets
            ops.append(("tweet_gone", (ts, author, tweet)))
    return ops


def _rival_tweet(row: TweetRow, stored: TweetState, ts: int) -> list[Op]:
    """A claim on an id whose stored row is another author's: it takes the row if earlier."""
    tweet, author, at = row.tweet_id, row.author_id, row.created_at
    if not outranks(row, stored.created_at, stored.author_id):
        # The earlier claim's id: this author's own entry row goes if deleted.
        return [("author_del", (ts, author, at, tweet))] if row.deleted else []
    take: Op = ("tweet_take", (tweet, author, at, row.text, row.deleted, row.reply_to,
                               row.record, row.ref_id, ts))
    if row.deleted:
        return [take, ("author_del", (ts, author, at, tweet))]
    return [take, ("author_add", (author, at, tweet, ts))]


def repost_moves(reposts: Mapping[int, TweetRow], states: Mapping[int, TweetState],
                 ts: int) -> list[Op]:
    """Deletes of the rows a repost leaves behind when its key moves (DESIGN §4b).

    Copies of one repost id count by their smallest (created_at, original, its
    author), so a batch may write a repost at another time or of another original
    than ``tweets`` holds: its ``author_tweets`` row and its ``reposts_by_original``
    row at the stored (created_at, original) go, shown or hidden now (as the SQLite
    store deletes the row at the stored time). A row whose key stays is left to
    :func:`repost_ops` (a delete beside an add of one row at one timestamp would
    win). The store runs these before, and apart from, the ``repost_set`` that
    overwrites the stored key: a batch cut short and applied again still reads the
    old key until its rows are gone.
    """
    ops: list[Op] = []
    for repost, row in sorted(reposts.items()):
        stored = states.get(repost)
        if stored is None or stored.created_at is None or stored.author_id != row.author_id:
            continue  # another author's rows stay theirs (read as theirs, see repost_ops)
        at = stored.created_at
        if at != row.created_at:
            ops.append(("author_del", (ts, row.author_id, at, repost)))
        if stored.original_id is not None and (stored.original_id, at) != (row.original_id,
                                                                           row.created_at):
            ops.append(("repost_del", (ts, stored.original_id, at, repost)))
    return ops


def moved_originals(moves: Sequence[Op]) -> set[int]:
    """The originals whose ``reposts_by_original`` rows :func:`repost_moves`' ops delete.

    Their lists of shown reposts change, so the change feed names them beside the
    plan's reposts' own originals.
    """
    return {params[1] for name, params in moves if name == "repost_del"}


def repost_ops(reposts: Mapping[int, TweetRow], states: Mapping[int, TweetState],
               ts: int) -> list[Op]:
    """Reposts as the join last decided them: shown, or not (undone, or superseded).

    The ``tweets`` row keeps the repost's original either way (``deleted`` = not
    shown); while shown the repost is also an entry of the reposter (``author_tweets``)
    and a repost of its original (``reposts_by_original``), and hiding it deletes
    both. Not final, unlike a tweet's delete: a later batch may show it again, and its
    timestamp wins. A repost id another author claimed earlier is theirs: nothing is
    written (:func:`~views.stores.plan.outranks`).
    """
    ops: list[Op] = []
    for repost, row in sorted(reposts.items()):
        stored = states.get(repost)
        if stored is not None and not outranks(row, stored.created_at, stored.author_id):
            continue
        author, at, original = row.author_id, row.created_at, row.original_id
        ops.append(("repost_set", (repost, author, at, row.deleted, original,
                                   row.original_author, ts)))
        if row.deleted:
            ops += [("author_del", (ts, author, at, repost)),
                    ("repost_del", (ts, original, at, repost))]
        else:
            ops += [("author_add", (author, at, repost, ts)),
                    ("repost_add", (original, at, repost, author, ts))]
    return ops


#: How a relation is stored: the acting user's row, and the other user's (None: none).
#: A block filters both users' timelines, so each of them reads it in one partition.
RELATION_ROWS: Final[dict[str, tuple[str, str | None]]] = {
    BLOCK: (BLOCK, "blocked_by"), MUTE: (MUTE, None)}
#: A celebrity the user follows, as a row of the user's ``relations`` partition too
#: (beside ``celebrity_follows``): a home page reads everything of its reader that
#: filters or merges — blocks, mutes, celebrities — in that one partition.
CELEBRITY_ROW: Final = "celebrity"


def relation_ops(relations: Iterable[RelationRow], ts: int) -> list[Op]:
    """Blocks and mutes: a row while one stands (both users' rows for a block)."""
    ops: list[Op] = []
    for row in sorted(relations):
        sides = RELATION_ROWS.get(row.relation)
        if sides is None:
            msg = f"unknown relation {row.relation!r} (expected one of {sorted(RELATION_ROWS)})"
            raise StoreError(msg)
        mine, theirs = sides
        pairs = [(row.user_id, mine, row.other_id)]
        if theirs is not None:
            pairs.append((row.other_id, theirs, row.user_id))
        for user, stored, other in pairs:
            ops.append(("relation_on", (user, stored, other, row.created_at, ts)) if row.on
                       else ("relation_off", (ts, user, stored, other)))
    return ops


def graph_ops(plan: WritePlan, ts: int) -> list[Op]:
    """Follow edges, celebrity edges and the celebrity set: last write wins."""
    ops: list[Op] = []
    for (follower, followee), edge in sorted(plan.follows.items()):
        ops.append(("follow_on", (follower, followee, edge.created_at, ts)) if edge.active
                   else ("follow_off", (ts, follower, followee)))
    for (user, celeb), on in sorted(plan.celeb_edges.items()):
        ops += ([("celeb_edge_on", (user, celeb, ts)),
                 ("relation_on", (user, CELEBRITY_ROW, celeb, 0, ts))] if on
                else [("celeb_edge_off", (ts, user, celeb)),
                      ("relation_off", (ts, user, CELEBRITY_ROW, celeb))])
    for author, on in sorted(plan.celebs.items()):
        ops.append(("celeb_on", (author, ts)) if on else ("celeb_off", (ts, author)))
    return ops


def user_ops(users: Mapping[int, ProfileRow], stored: Mapping[int, int | None],
             ts: int, deleted: Mapping[int, int] | None = None,
             gone: Collection[int] = ()) -> list[Op]:
    """Account deletions; profiles newer than (or as new as) the stored one.

    ``deleted`` are the batch's account deletions and ``gone`` the users whose stored
    row is deleted already: a deletion is final, so no profile is written for either
    (whichever order the deletion and the profile came in).
    """
    deleted = deleted or {}
    ops: list[Op] = [("user_gone", (ts, user)) for user in sorted(deleted)]
    for user, p in sorted(users.items()):
        if user in deleted or user in gone:
            continue
        old = stored.get(user)
        if old is None or p.created_at >= old:
            ops.append(("user_set", (user, p.handle, p.name, p.created_at, ts)))
    return ops


def stored_users(rows: Mapping[int, list[tuple[Any, ...]]]) -> tuple[dict[int, int], set[int]]:
    """From ``user_time`` reads: each stored profile's time, and the deleted accounts."""
    times = {u: r[0][0] for u, r in rows.items() if r and r[0][0] is not None}
    return times, {u for u, r in rows.items() if r and r[0][1]}


def wiped_rows(wipes: Mapping[int, set[int]], partitions: Mapping[int, list[tuple[Any, ...]]]
               ) -> list[tuple[int, int, int, int]]:
    """The wiped authors' entries in each user's timeline: (user, created_at, tweet, author).

    ``partitions``: each user's ``home_get`` rows, folded here
    (:func:`~views.stores.cassandra.chunks.fold`).
    """
    return [(user, created_at, tweet, author)
            for user, authors in sorted(wipes.items())
            for created_at, tweet, author in chunks.fold(
                chunks.as_chunks(partitions.get(user, ()))).tolist()
            if author in authors]


def wiped_keys(rows: Iterable[tuple[int, int, int, int]],
               stored: Mapping[int, tuple[int | None, int | None]]) -> list[Removed]:
    """The keys of wiped entries (:func:`wiped_rows`), but not an entry another author owns.

    Two claims of one id at one time share one timeline row, which lists whichever
    author was written last; ``stored`` (tweet_id → the ``tweets`` row's created_at and
    author, :func:`claims`) says whose it is. A row owned by another author at its own
    time is that owner's entry (served if the reader follows the owner,
    :mod:`serving.visibility`), so the wipe of the listed author leaves it.
    """
    return [(user, created_at, tweet) for user, created_at, tweet, author in rows
            if not owned_elsewhere(stored.get(tweet), created_at, author)]


def owned_elsewhere(stored: tuple[int | None, int | None] | None, created_at: int,
                    author: int) -> bool:
    """Whether a row listing ``author`` at ``created_at`` is another author's claim."""
    if stored is None:
        return False
    at, owner = stored
    return owner is not None and owner != author and at == created_at


def removed_keys(removes: Iterable[tuple[int, int, int, int]], times: Mapping[int, int],
                 owners: Mapping[int, int | None]) -> tuple[list[Removed], int]:
    """The timeline keys removed entries have; and how many were skipped.

    A remove of unknown time takes the time from ``tweets`` — only if the tweet stored
    there is the removing author's (else the row is someone else's tweet). A tweet
    reaches a timeline only through a batch that also writes its ``tweets`` row
    (earlier in phase order), so a tweet whose time is nowhere known never reached
    one, and there is nothing to delete.
    """
    keys: list[Removed] = []
    skipped = 0
    for user, tweet, created_at, author in sorted(set(removes)):
        owned = owners.get(tweet) in (None, author)
        when = created_at or (times.get(tweet) if owned else None)
        if when is None:
            skipped += 1
        else:
            keys.append((user, when, tweet))
    return keys, skipped


def remove_ops(keys: Iterable[Removed], ts: int) -> list[Op]:
    """The batch's removed keys, one ``home_chunks`` row's ``removes`` a user, at ``ts``.

    ``ts`` is ``T + REMOVE``: the row is the batch's (``batch_ts`` ``T``), so its adds,
    one tick later, go in the same row.
    """
    by_user: dict[int, list[tuple[int, int]]] = {}
    for user, created_at, tweet in keys:
        by_user.setdefault(user, []).append((created_at, tweet))
    return [("home_removes", (user, ts - REMOVE, chunks.encode(np.array(found, np.int64)), ts))
            for user, found in sorted(by_user.items())]


# -- phase ADD, phase TRIM --------------------------------------------------------------------

@dataclass
class Meta:
    """A user's timeline_meta: the horizon, an upper bound of its rows, the newest read.

    ``read_at`` -1: never read (as a row written before schema step 003 reads).
    """

    horizon: Key = NO_HORIZON
    size: int = 0
    read_at: int = -1
    #: An upper bound of the user's ``home_chunks`` rows (a row per batch that touched
    #: the timeline, until they are merged).
    chunks: int = 0


def meta_users(plan: WritePlan, blind: Collection[int] = ()) -> list[int]:
    """Users whose timeline_meta the batch reads and writes.

    Added to, removed from, wiped, horizon raised, read; less the ``blind`` ones
    (:func:`blind_users`).
    """
    added = set(np.unique(plan.adds.columns()[0]).tolist()).difference(blind)
    return sorted(added | _kept_up(plan))


def _kept_up(plan: WritePlan) -> set[int]:
    """Users a batch touches other than by adding: each needs its timeline_meta."""
    return ({row[0] for row in plan.removes} | set(wipe_users(plan.wipes))
            | set(plan.horizons) | set(plan.activity))


def due(users: np.ndarray, ts: int, upkeep: int) -> np.ndarray:
    """Whether each user's timeline is kept up in the batch of timestamp ``ts``.

    True for about one user in ``upkeep`` per batch, drawn afresh each batch by a mix
    of the user and ``ts``, so a user touched now and then is kept up as often as one
    touched every batch; the same ``ts`` (a batch run again) draws the same users.
    """
    x = users.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(ts & (2**64 - 1))
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(29)
    return (x % np.uint64(upkeep)) == 0


def blind_users(plan: WritePlan, ts: int, upkeep: int, limit: int) -> set[int]:
    """Users whose share of the batch is their ``home_chunks`` row alone.

    The batch only adds to their timelines, at most ``limit`` entries each (the
    writer's slack over ``upkeep``: no cut to make as they come, and a timeline grows
    by about the slack between two turns), and they are not :func:`due`. The
    writer neither reads nor writes their timeline_meta: in a steady stream a batch
    gives each of thousands of users an entry or two, and the meta's read and write
    cost the node three times the row itself (benchmarks/RESULTS.md, "The Cassandra
    store"). What the meta would have done waits for the user's next batch that
    keeps it up:

    - an add at or below the horizon is stored; readers take no cached entry there
      (:meth:`~views.stores.cassandra.store.CassandraStore.cached`, ``serving.timeline``);
    - the size and row count grow uncounted: a kept-up batch counts ``upkeep - 1``
      rows for them (:func:`count_blind_rows`), so rows are merged about as often as
      before; a timeline may hold the entries of those rows past ``cap + slack``
      until that merge cuts it to the cap;
    - a dormant user's adds are stored too, under the dormant horizon, and dropped
      with the partition at the user's next kept-up batch (:func:`dormant_added`) or
      when the user reads again (the cache is regenerated).

    ``upkeep`` 1: every user is kept up every batch (none blind).
    """
    if upkeep <= 1 or not len(plan.adds):
        return set()
    users, counts = np.unique(plan.adds.columns()[0], return_counts=True)
    free = users[(counts <= limit) & ~due(users, ts, upkeep)]
    return set(free.tolist()).difference(_kept_up(plan))


def decode_meta(rows: list[tuple[Any, ...]]) -> Meta:
    """A user's stored timeline_meta (the defaults when there is no row)."""
    if not rows or rows[0][0] is None:
        return Meta()
    read_at = rows[0][3]
    return Meta((rows[0][0], rows[0][1]), rows[0][2] or 0, -1 if read_at is None else read_at,
                rows[0][4] or 0)


# -- inactive users (DESIGN §4b) ----------------------------------------------------------------

def record_reads(activity: Mapping[int, int], meta: Mapping[int, Meta]) -> list[int]:
    """Keep each user's newest read; return the dormant users who read (to regenerate)."""
    back = []
    for user, read_at in sorted(activity.items()):
        m = meta[user]
        m.read_at = max(m.read_at, read_at)
        if m.horizon == DORMANT:
            back.append(user)
    return back


def regenerated(user: int, entries: Sequence[Entry], meta: Meta,
                cap: int) -> list[tuple[int, int, int, int]]:
    """A returning user's cache as fan-out would have left it, and ``meta`` set to match.

    ``entries``: the newest ``cap + 1`` of the followees on fan-out (celebrities are
    merged at read time), read after the batch's tweets were written. The first
    ``cap`` are the cache; the next one, if any, is the horizon (below it, the query).
    """
    kept = entries[:cap]
    meta.horizon = entries[cap].key if len(entries) > cap else NO_HORIZON
    meta.size = len(kept)
    return [(user, e.created_at, e.tweet_id, e.author_id) for e in kept]


def go_dormant(adds: Adds, meta: Mapping[int, Meta], inactive_ms: int) -> list[int]:
    """Users an entry reaches more than ``inactive_ms`` after their newest read.

    Their horizon becomes :data:`~views.stores.rows.DORMANT` (so :func:`kept_adds`
    drops this batch's adds for them, and every later batch's, until they read again)
    and their cache is dropped (:func:`drop_ops`). A user who never read (-1) never
    goes dormant; 0 turns it off. The batch's HORIZON deltas cannot change who goes
    dormant (no key reaches DORMANT), so this may run before :func:`kept_adds`. Only
    each user's newest add decides, so the adds are reduced to that, column-wise. A
    user without ``meta`` (:func:`blind_users`) is left for a batch that keeps it up.
    """
    if not inactive_ms or not len(adds):
        return []
    users, created, _, _ = adds.columns()
    order = np.argsort(users, kind="stable")
    by_user = users[order]
    starts = run_starts(by_user)
    newest = np.maximum.reduceat(created[order], starts)
    out = []
    for user, at in zip(by_user[starts].tolist(), newest.tolist(), strict=True):
        m = meta.get(user)
        if m is not None and 0 <= m.read_at < at - inactive_ms and m.horizon != DORMANT:
            m.horizon, m.size, m.chunks = DORMANT, 0, 0
            out.append(user)
    return out


def dormant_added(adds: Adds, meta: Mapping[int, Meta]) -> list[int]:
    """Dormant users the batch adds to: blind batches may have stored their adds.

    Kept up now, their partitions go again (:func:`drop_ops`), so that what blind
    batches stored under the dormant horizon is not kept until they read.
    """
    dormant = [u for u, m in meta.items() if m.horizon == DORMANT]
    if not dormant:
        return []
    return np.asarray(dormant)[np.isin(dormant, adds.columns()[0])].tolist()


def drop_ops(users: Iterable[int], ts: int) -> list[Op]:
    """The caches of users gone dormant: one partition tombstone each.

    At ``T + TRIM``, above the batch's adds and regenerated rows (``T + ADD``): a user
    who came back and went dormant again in one batch keeps no row of it, as when the
    batch is applied in order.
    """
    return [("home_drop", (ts, user)) for user in sorted(users)]


def kept_adds(plan: WritePlan, meta: Mapping[int, Meta]) -> np.ndarray:
    """Adds above their user's horizon (raised by this batch's HORIZON deltas first).

    At or below the horizon a timeline is read through the query, not the cache, so
    an add there would only be trimmed again. A user without ``meta`` keeps every add
    (:func:`blind_users`). Returns the distinct kept adds as an
    ``(n, 4)`` int64 array of ``(user, created_at, tweet, author)`` rows, sorted:
    column-wise, because a catching-up batch carries millions of them
    (:class:`~views.stores.adds.SortedAdds`).
    """
    for user, key in plan.horizons.items():
        meta[user].horizon = max(meta[user].horizon, key)
    kept = SortedAdds(plan.adds).kept(
        collections.defaultdict(lambda: NO_HORIZON, {u: m.horizon for u, m in meta.items()}))
    rows = np.column_stack([c[kept.order] for c in kept.columns]) if len(kept) else _NO_ADDS
    if len(rows) > 1:  # sorted: a copy sent twice (a rerun, a duplicate) is adjacent
        rows = rows[np.concatenate(([True], (rows[1:] != rows[:-1]).any(axis=1)))]
    return rows


def capped_adds(adds: np.ndarray, meta: Mapping[int, Meta], limit: int) -> np.ndarray:
    """The sorted ``(n, 4)`` adds with at most the newest ``limit`` of any user's kept.

    ``limit`` is the writer's ``cap + trim_slack``: a user's older adds of this batch
    lie below that many newer ones, so a trim would cut them. The horizon rises to the
    newest one dropped, as :func:`trim` raises it, and a ``home_chunks`` row holds at
    most ``limit`` entries (24 bytes each; a catching-up user's batch may carry more
    than the node takes in one mutation, 16 MiB by default).
    """
    if len(adds) <= limit:
        return adds
    starts = run_starts(adds[:, 0])
    ends = np.append(starts[1:], len(adds))
    keep = np.ones(len(adds), bool)
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if b - a <= limit:
            continue
        cut = (int(adds[b - limit - 1, 1]), int(adds[b - limit - 1, 2]))
        rows = adds[a:b]
        keep[a:b] = (rows[:, 1] > cut[0]) | ((rows[:, 1] == cut[0]) & (rows[:, 2] > cut[1]))
        m = meta[int(adds[a, 0])]
        m.horizon = max(m.horizon, cut)
    return adds[keep]


def add_ops(adds: np.ndarray, ts: int, meta: Mapping[int, Meta]) -> list[Op]:
    """The ``(n, 4)`` adds, one ``home_chunks`` row's ``adds`` a user, at ``ts``.

    ``ts`` is ``T + ADD``: after the batch's removes, in the same row (``batch_ts``
    ``T``). Each user's entries are one blob, cut from the adds column-wise: a
    catching-up batch carries millions. Counts the row into each user's ``meta``.
    """
    adds = adds.reshape(-1, 4)
    if not len(adds):
        return []
    adds = adds[np.argsort(adds[:, 0], kind="stable")]
    starts = run_starts(adds[:, 0])
    ends = np.append(starts[1:], len(adds))
    ops: list[Op] = []
    for user, a, b in zip(adds[starts, 0].tolist(), starts.tolist(), ends.tolist(), strict=True):
        ops.append(("home_adds", (user, ts - ADD, chunks.encode(adds[a:b, 1:]), ts)))
        if user in meta:
            meta[user].chunks += 1
    return ops


def count_blind_rows(adds: np.ndarray, meta: Mapping[int, Meta], ts: int, upkeep: int) -> None:
    """Count into each row estimate the blind batches (:func:`blind_users`) it missed.

    A user kept up by turn (:func:`due`) in the batch of ``T`` ``ts``, whose timeline the
    ``(n, 4)`` adds reach, was blind in about ``upkeep - 1`` batches since its last
    turn, each a ``home_chunks`` row nobody counted: that many are added, so that
    :func:`over_cap` merges the rows about every :data:`CHUNKS_MAX` of them, as with
    every batch counted. An estimate, not a bound: a reader folds about that many
    rows. The entries blind batches added go uncounted; a merge cuts them to the cap.
    """
    if upkeep <= 1 or not len(adds):
        return
    touched = np.unique(adds.reshape(-1, 4)[:, 0])
    for user in touched[due(touched, ts, upkeep)].tolist():
        if user in meta:
            meta[user].chunks += upkeep - 1


def over_cap(adds: np.ndarray, meta: Mapping[int, Meta], cap: int, slack: int) -> list[int]:
    """Count the ``(n, 4)`` adds into each size estimate; the users to merge and trim.

    Those now past ``cap + slack`` entries or :data:`CHUNKS_MAX` rows. The estimates
    only grow (removes and replays make them upper bounds), so a timeline is read and
    merged once per ``slack`` adds or ``CHUNKS_MAX`` batches, not on every batch.
    """
    users, added = np.unique(adds.reshape(-1, 4)[:, 0], return_counts=True)
    for user, n in zip(users.tolist(), added.tolist(), strict=True):
        if user in meta:  # else blind (:func:`blind_users`)
            meta[user].size += n
    return sorted(u for u, m in meta.items()
                  if m.size > cap + slack or m.chunks > CHUNKS_MAX)


def trim(meta: Meta, head: list[tuple[int, int]], cap: int) -> Key | None:
    """Update ``meta`` from the ``cap + 1`` newest keys; return the key to cut at, if any."""
    if len(head) <= cap:
        meta.size = len(head)  # the exact count: nothing to trim
        return None
    cut = (head[cap][0], head[cap][1])
    meta.horizon, meta.size = max(meta.horizon, cut), cap
    return cut


def merge_op(user: int, rows: Sequence[tuple[Any, ...]], meta: Meta, cap: int, ts: int) -> Op:
    """The user's ``home_chunks`` rows up to the batch folded into its row, cut to ``cap``.

    ``rows``: the partition as ``home_get`` read it; ``ts`` is ``T + TRIM``. Sets
    ``meta`` as :func:`trim` does (the horizon rises to the first entry cut) and its
    row count to one.
    """
    kept, head = chunks.merged(chunks.as_chunks(rows), ts - TRIM, cap)
    trim(meta, head, cap)
    meta.chunks = 1
    return ("home_merge", (ts, user, ts - TRIM, user, ts - TRIM, chunks.encode(kept)))


def meta_ops(meta: Mapping[int, Meta], ts: int) -> list[Op]:
    """timeline_meta of every user the batch touched (single writer: no read race)."""
    return [("meta_set", (u, m.horizon[0], m.horizon[1], min(m.size, _INT_MAX), m.read_at,
                          min(m.chunks, _INT_MAX), ts))
            for u, m in sorted(meta.items())]


# -- bookkeeping --------------------------------------------------------------------------------

def offset_ops(offsets: Mapping[tuple[str, int], int]) -> list[Op]:
    """Applied offsets, each written with itself as timestamp: the cell keeps the max."""
    return [("offset_set", (topic, part, off, off))
            for (topic, part), off in sorted(offsets.items()) if off >= 0]


#: Twice 2026-01-01T00:00Z in microseconds: :func:`first_seen_ts` mirrors a sighting's
#: time around that day, so that its write timestamps lie in the past of the wall clock
#: (a ``DELETE`` typed by hand still deletes) and stay positive until 2082.
FIRST_SEEN_MIRROR_US: Final = 2 * 1_767_225_600_000_000


def first_seen_ts(seen_ms: int) -> int:
    """The write timestamp of a dead letter seen at ``seen_ms``: the earlier, the higher.

    Every cell of the row then keeps the earliest sighting's values, whatever order the
    writes land in, with no read and no Paxos round: a conditional insert (``IF NOT
    EXISTS``) cost four round trips a letter, and concurrent ones to one partition
    contended until they timed out on a loaded node.
    """
    return FIRST_SEEN_MIRROR_US - seen_ms * 1000


def dead_ops(dead: Iterable[DeadRow], now_ms: int) -> list[Op]:
    """Dead letters, kept as first seen (:func:`first_seen_ts`)."""
    ts = first_seen_ts(now_ms)
    return [("dead_add", (d.topic, d.partition, d.offset, d.reason, d.raw or b"", now_ms, ts))
            for d in dead]


def dead_partition_ops(dead: Iterable[DeadRow]) -> list[Op]:
    """The partitions of ``dead_letters`` the letters go to, listed for the bounded count."""
    return [("dead_part_add", where) for where in sorted({(d.topic, d.partition) for d in dead})]


@dataclass(frozen=True)
class BatchRecord:
    """What the ``batches`` table keeps of one applied micro-batch."""

    batch_id: int
    write_ts: int
    digest: str
    finished_at: int
    rows: int
    seconds: float
    max_event_time: int

    def ops(self) -> list[Op]:
        """The batch row, and the writer's pointer to the newest batch."""
        ts = self.write_ts + TRIM
        return [("batch_set", (batch_bucket(self.batch_id), self.batch_id, self.write_ts,
                               self.digest, self.finished_at, min(self.rows, _INT_MAX),
                               self.seconds, self.max_event_time, ts)),
                ("last_batch_set", (ts, self.batch_id))]


def batch_bucket(batch_id: int) -> int:
    """The ``batches`` partition of a batch id."""
    return batch_id // BATCH_BUCKET


def batch_buckets(last_batch: int, limit: int) -> list[int]:
    """Partitions holding the newest ``limit`` batches up to ``last_batch``, newest first."""
    newest = batch_bucket(last_batch)
    return list(range(newest, max(-1, newest - 1 - limit // BATCH_BUCKET - 1), -1))


def clock_op(ts: int) -> Op:
    """Record ``ts`` as the newest batch timestamp (the cell only ever grows)."""
    return ("clock_set", (ts, ts))


def bounded_limit(limit: int) -> int:
    """A LIMIT the protocol accepts (a 32-bit int, at least 1)."""
    return max(1, min(limit, _INT_MAX))
