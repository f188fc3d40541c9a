"""The production store: Cassandra through cassandra-driver (DESIGN §6).

Tables (``views/stores/cassandra/cql/``): ``home_chunks`` has one partition per user,
a row per batch that touched the timeline (the keys it removed and the entries it
added, as blobs), folded at read (:mod:`views.stores.cassandra.chunks`); ``author_tweets`` one per author
and ``reposts_by_original`` one per reposted tweet, the same way; ``relations`` one
per user, holding the blocks and mutes that filter that user's timeline (a block is
written into both users' partitions); the rest are keyed lookups. Statements are prepared once at
:meth:`open` and routed token-aware to a replica in the local datacenter; the job's
writes go through ``cassandra.concurrent.execute_concurrent`` with at most
``concurrency`` requests in flight (see :mod:`views.stores.cassandra.config`), each
request one statement or an unlogged batch of them (:func:`statements.units`: a
partition's writes together, small partitions of one replica set packed).

**One batch, in phases.** Cassandra has no multi-partition transaction, so
:meth:`_write` applies a plan in phases, each a bounded concurrent run that finishes
before the next starts: (1) reads the batch needs — its timestamp ``T``, the stored
state of its tweets, the partitions of wiped users, stored profiles, the touched
users' ``timeline_meta``; (2) at ``T``: the rows a repost leaves when its key
moves (a run of their own, before the repost's row is rewritten, so that a batch
applied again still finds the old key), then tweets and reposts, graph, blocks and
mutes, profiles and account deletions, wipes, removes;
(3) at ``T+1``: adds, and the regenerated caches of returning users; (4) at ``T+2``:
merges and trims, the caches of users going dormant, and ``timeline_meta``; (5) offsets,
dead letters, the batch record. Every write is an upsert or delete keyed by its
primary key with an explicit timestamp, so re-running a batch — after a crash at
any point — converges to the same rows; offsets are written last, so a reader that
sees an offset also sees everything the batch wrote. Why timestamps and phases, and
how ``T`` is chosen: :mod:`views.stores.cassandra.statements`.

**Deletes whose time is unknown.** The join sends ``created_at = 0`` when it no longer
knows a deleted tweet's time, but a timeline entry is keyed by
``(created_at, tweet_id)``. The writer looks the time up in ``tweets`` (one read
per deleted tweet, not per follower) rather than keeping a ``home_by_tweet`` index
(one more write per fanned-out row). **Wipes** (an unfollow, a promotion to
celebrity) read and fold the user's partition — at most ``cap`` entries plus
untrimmed slack — and remove the author's entries. A batch's removes and wipes of a
user are one ``removes`` blob in the batch's row, its adds one ``adds`` blob.

**Trimming** is amortized as in the SQLite store: ``timeline_meta.size`` is an upper
bound of a timeline's entries (adds raise it; removes and replays leave it high), and
``timeline_meta.chunks`` of its rows. Only a timeline past ``cap + trim_slack``
entries or :data:`~.statements.CHUNKS_MAX` rows is read: its rows up to the batch
are folded into the batch's row, cut to the newest ``cap``, and the older rows
deleted with one clustering-range tombstone, in one single-partition batch,
raising the user's horizon to the first entry cut. A user's adds in one batch past
``cap + trim_slack`` are cut the same way as they come (:func:`~.statements.capped_adds`):
a row stays one small mutation. Adds at or below a user's horizon are not written
(a blind batch's are, and are not read: below): reads go through the query there.
Timelines run over the cap by the slack plus a batch, or the few entries a user's blind
batches add between two merges: space, not correctness — entries above the horizon are
exact however many there are. ``timeline_meta`` and profiles (newest ``created_at``
wins) are read-then-written: safe because one job writes a keyspace.

**Blind batches.** A batch that only adds to a user's timeline writes the user's
``home_chunks`` row and nothing else, unless it is the user's turn to be kept up (about
one such batch in ``upkeep``): :func:`~.statements.blind_users` says which users, and
what waits meanwhile.

**Inactive users** (DESIGN §4b, as the SQLite store does them):
``timeline_meta.read_at`` keeps each user's newest read. A user whom an entry reaches
more than ``inactive_ms`` after that read goes dormant: the horizon becomes
:data:`~views.stores.rows.DORMANT` and the ``home_chunks`` partition is dropped (one partition
tombstone at ``T+2``, above anything the batch added), so fan-out skips the user and
reads evaluate at read time. A dormant user's next read drops the partition (at
``T+0``: what blind batches stored meanwhile) and regenerates the cache after phase (2):
the newest ``cap`` entries of the followees off the celebrity path, read
from ``author_tweets`` (this batch's tweets included), written at ``T+1``. A batch
applied again finds the user no longer dormant (nothing is regenerated twice), or
dormant with the partition dropped already.

**Bookkeeping.** An applied offset is written with the offset itself as its write
timestamp, so the cell keeps the maximum in whatever order writes land, with no read
first; a dead letter is written at a timestamp that falls as the time it was seen
grows, so the first sighting is kept (:func:`cql.first_seen_ts`); the batch log lies
in partitions of 10,000 batch ids, newest first, so :meth:`batches` reads one or two
partitions.

**Reads** are not snapshot-isolated (:meth:`snapshot` is a no-op): a page assembled
while a batch lands may mix rows from before and after it — say a timeline entry
whose tweet was deleted in that batch. The read path tolerates it: hydration drops
deleted tweets, and the next read sees the batch whole. A user's cached page is the
whole ``home_chunks`` partition, folded and cut in the reader (about ``cap + trim_slack``
entries in about :data:`~.statements.CHUNKS_MAX` rows, the entries at or below the horizon
left out). A page's requests do not grow
with its length: the reader's own partitions in one concurrent run
(:meth:`home_start`), then every table's keys by ``IN``, a request per 100 keys
(:mod:`~views.stores.cassandra.rows`). :meth:`counts` and
:meth:`home_users` scan whole tables: exact, but for operators and ``verify``, not
for request paths. The read methods are safe from a threadpool (the driver's session
is thread-safe).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from cassandra import DriverException
from cassandra.cluster import EXEC_PROFILE_DEFAULT, NoHostAvailable

from views.delta import Key
from views.errors import StoreError
from views.stores.cassandra import chunks, schema
from views.stores.cassandra import rows as reads
from views.stores.cassandra import statements as cql
from views.stores.cassandra.changes import CassandraFeed, Changes, committed_op
from views.stores.cassandra.config import WRITE_PROFILE, CassandraConfig, parse_url
from views.stores.cassandra.executor import (
    all_rows,
    execute,
    replica_of,
    requests,
    retrying,
    unbatch,
)
from views.stores.contract import Store
from views.stores.plan import WritePlan, stored_conflicts
from views.stores.rows import (
    BatchInfo,
    DeadLetter,
    Entry,
    HomeStart,
    Hydrated,
    Relations,
    TweetRow,
    UserRow,
)

if TYPE_CHECKING:
    from views.sink import Sink

log = logging.getLogger(__name__)


class CassandraStore(Store):
    """Store in a Cassandra keyspace; see the module docstring."""

    #: A user's entries of a batch are one ``home_chunks`` row, so the node's cost a
    #: timeline row falls as a batch gives each user more of them: replaying ego-twitter
    #: with 130k tweets, 1,000,000 records a batch against 200,000 took the node 8.4–9.0
    #: against 19–23 µs a row and caught up in 183–203 against 353–390 s, for 0.4 GB
    #: more peak memory (benchmarks/RESULTS.md, "The Cassandra store").
    catch_up_records = 1_000_000

    def __init__(self, config: CassandraConfig, cap: int = 800,
                 inactive_days: float = 0.0, *, retry_s: float = 0.0) -> None:
        super().__init__(cap, inactive_days)
        self.config = config
        #: How long a request that fails transiently, or an open no node answers, is tried
        #: again (:mod:`~views.stores.cassandra.executor`; 0: the first failure fails).
        self.retry_s = retry_s
        self._cluster: Any = None
        self._session: Any = None
        self._statements: dict[str, Any] = {}
        self._replica: Callable[[Any], Hashable] | None = None
        #: Rows a timeline may hold past the cap before it is trimmed (amortizes trims).
        self.trim_slack = max(16, cap // 4) if config.trim_slack is None else config.trim_slack
        #: Batches a timeline's upkeep is spread over (:func:`.statements.blind_users`).
        self.upkeep = config.upkeep
        self._floor = 0
        self._write_lock = threading.Lock()
        #: Timeline rows inserted since built (fan-out writes, regenerations included).
        self.rows_written = 0

    @classmethod
    def from_url(cls, url: str, cap: int = 800, inactive_days: float = 0.0) -> CassandraStore:
        """Build (not connect) from ``cassandra://hosts/keyspace?options``."""
        return cls(parse_url(url), cap=cap, inactive_days=inactive_days)

    @classmethod
    def for_tasks(cls, config: CassandraConfig, cap: int = 800) -> CassandraStore:
        """The store an executor sink's task writes through (:mod:`.tasks`).

        It waits out the URL's ``retry`` for a node, and never runs DDL: many clients
        changing a schema at once is how it diverges.
        """
        return cls(dataclasses.replace(config, auto_schema=False), cap, retry_s=config.retry_s)

    def __repr__(self) -> str:
        return f"CassandraStore({self.config!r}, cap={self.cap})"

    # -- lifecycle ---------------------------------------------------------------------
    def open(self) -> CassandraStore:
        if self._session is not None:
            return self
        cluster, session = self._connect()
        try:
            keyspace = self.config.keyspace
            if self.config.auto_schema:
                schema.apply_schema(session, keyspace, self.config.replication.cql_map())
            else:
                schema.require_current(session, keyspace)
            session.set_keyspace(keyspace)  # for what runs unqualified CQL on it
            self._statements = self._prepare(session, keyspace)
        except BaseException:
            cluster.shutdown()
            raise
        self._cluster, self._session = cluster, session
        self._replica = replica_of(cluster, keyspace)
        return self

    def _connect(self) -> tuple[Any, Any]:
        """(Cluster, Session); the one place that opens connections."""
        return schema.connect(self.config, wait=self.retry_s)

    @staticmethod
    def _prepare(session: Any, keyspace: str) -> dict[str, Any]:
        """Every statement, its tables qualified by ``keyspace`` (:func:`cql.in_keyspace`)."""
        prepared = {}
        for name, text in cql.STATEMENTS.items():
            statement = session.prepare(cql.in_keyspace(text, keyspace))
            statement.is_idempotent = True  # every write is keyed, at an explicit timestamp
            prepared[name] = statement
        return prepared

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster = self._session = None
        self._statements = {}

    def _require(self) -> Any:
        if self._session is None:
            msg = f"{self!r} is not open: call open() first"
            raise StoreError(msg)
        return self._session

    # -- running statements ------------------------------------------------------------------
    def _run(self, ops: list[cql.Op], profile: object = WRITE_PROFILE) -> list[reads.Rows]:
        """Run ops concurrently (bounded); the rows of each op, in order.

        A partition's writes go as one request (:func:`cql.units`); a failed request is
        run again while :attr:`retry_s` allows (:func:`~.executor.execute`).
        """
        return self._run_groups(ops, cql.units(ops, self._replica), profile)

    def _run_groups(self, ops: list[cql.Op], groups: list[list[int]],
                    profile: object = WRITE_PROFILE) -> list[reads.Rows]:
        """:meth:`_run` with the requests given: groups of op indices, a request each."""
        if not ops:
            return []
        session = self._require()
        built = requests(groups, ops, self._statements, session.cluster.protocol_version)
        results = execute(session, built, [ops[group[0]][0] for group in groups],
                          profile=profile, concurrency=self.config.concurrency,
                          retry_s=self.retry_s)
        return unbatch(groups, results, len(ops))

    def _rows(self, name: str, params: tuple[Any, ...] = (), *, scan: bool = False,
              profile: object = EXEC_PROFILE_DEFAULT) -> reads.Rows:
        """One statement, synchronously (pages are fetched as they are consumed)."""
        timeout = self.config.scan_timeout if scan else self.config.timeout
        try:
            return all_rows(self._require().execute(self._statements[name], params,
                                                    timeout=timeout, execution_profile=profile))
        except (DriverException, NoHostAvailable) as exc:
            msg = f"Cassandra {name} failed: {exc}"
            raise StoreError(msg) from exc

    # -- write side ----------------------------------------------------------------------------
    def _write(self, plan: WritePlan, batch_id: int) -> None:
        start = time.perf_counter()
        with self._write_lock:
            ts = self._begin(plan, batch_id)
            meta, moved = self._write_removes(plan, ts + cql.REMOVE)
            adds, inserted = self._write_adds(plan, meta, ts, self.inactive_ms)
            self.rows_written += inserted
            self._write_trims(adds, meta, ts + cql.TRIM)
            self._finish(plan, batch_id, ts, time.perf_counter() - start, moved)

    def _begin(self, plan: WritePlan, batch_id: int) -> int:
        """Pick the batch's timestamp and make it durable before any data write."""
        return self._batch_timestamp(batch_id, cql.offsets_digest(plan.offsets))

    def _batch_timestamp(self, batch_id: int, digest: str) -> int:
        """The batch's timestamp ``T``, made durable (``writer_clock``) before any write.

        ``digest`` names this batch of this checkpoint: a batch recorded as applied
        under the same digest (its writes all finished, then the process died before
        Spark committed it) gets its recorded ``T`` back, so running it again writes
        the same cells. A batch never recorded gets a fresh ``T`` above every earlier
        one, so whatever an interrupted attempt wrote loses to it. Through :meth:`_run`,
        as the writes are (a task writer's retries included).
        """
        recorded = None
        if batch_id >= 0 and digest:
            rows = self._run([("batch_get", (cql.batch_bucket(batch_id), batch_id))])[0]
            recorded = (int(rows[0][0]), str(rows[0][1])) if rows and rows[0][0] else None
        if not self._floor:
            rows = self._run([("clock_get", ())])[0]
            self._floor = (int(rows[0][0]) if rows and rows[0][0] else 0) + cql.STRIDE
        ts = cql.batch_timestamp(time.time_ns() // 1000, self._floor, recorded, digest)
        self._floor = max(self._floor, ts + cql.STRIDE)
        self._run([cql.clock_op(ts)])
        return ts

    def _write_removes(self, plan: WritePlan, ts: int) -> tuple[dict[int, cql.Meta], set[int]]:
        """Read what the batch needs, write tables, wipes and removes.

        Returns timeline_meta (of the users kept up: :meth:`blind`), and the originals
        reposts were moved away from.
        """
        found = self._lookup({"tweet_state": cql.lookup_ids(plan),
                              "home_get": sorted(cql.wipe_users(plan.wipes)),
                              "user_time": sorted(plan.users),
                              "meta_get": cql.meta_users(plan, self.blind(plan, ts - cql.REMOVE))})
        removes, _, moved = self._write_tweets(plan, found["tweet_state"], ts)
        return self._write_user_rows(plan, found, removes, ts), moved

    def _write_tweets(self, plan: WritePlan, stored: dict[int, reads.Rows], ts: int
                      ) -> tuple[list[cql.Removed], int, set[int]]:
        """Write the plan's tweets and reposts at ``ts`` (``T + REMOVE``).

        ``stored`` are their stored rows; the id conflicts they show go to ``plan.dead``.
        Returns the plan's timeline removes resolved to keys (a remove of unknown
        time takes it from the stored tweet, only if the tweet is the removing
        author's), how many had nothing to delete, and the originals reposts were moved
        away from (:func:`cql.moved_originals`, for the change feed).
        """
        states = {t: s for t, rows in stored.items()
                  if (s := cql.TweetState.decode(rows)) is not None}
        owners = {t: s.author_id for t, s in states.items()}
        removes, skipped = cql.removed_keys(plan.removes, cql.tweet_times(plan, states), owners)
        if skipped:
            log.debug("%d timeline removes name no stored tweet of theirs: nothing to delete",
                      skipped)
        plan.dead += stored_conflicts(plan, cql.claims(states))
        moves = cql.repost_moves(plan.reposts, states, ts)
        self._run(moves)  # first: see repost_moves
        self._run(cql.tweet_ops(plan, states, ts) + cql.repost_ops(plan.reposts, states, ts))
        return removes, skipped, cql.moved_originals(moves)

    def blind(self, plan: WritePlan, ts: int) -> set[int]:
        """The users whose share of the batch is one ``home_chunks`` row.

        :func:`.statements.blind_users`; ``ts`` is the batch's ``T``. A user's adds in a
        blind batch are at most the slack over ``upkeep``, so the entries that blind
        batches store between two turns come to about the slack: a catching-up
        batch, which gives a user hundreds, keeps every user it reaches up.
        """
        return cql.blind_users(plan, ts, self.upkeep, max(1, self.trim_slack // self.upkeep))

    def _write_user_rows(self, plan: WritePlan, found: dict[str, dict[int, reads.Rows]],
                         removes: list[cql.Removed], ts: int) -> dict[int, cql.Meta]:
        """Write the plan's users' rows at ``ts`` (``T + REMOVE``).

        Follows, celebrity edges, blocks and mutes, profiles and deletions, wipes and the
        resolved ``removes`` (keys), one ``home_chunks`` row a user. ``found`` holds the
        reads this needs (``home_get`` of the wiped users, ``user_time``, ``meta_get``);
        returns each user's ``timeline_meta``.
        """
        wiped = cql.wiped_rows(cql.wipe_users(plan.wipes), found["home_get"])
        gone_keys = removes + cql.wiped_keys(wiped, self._claims({t for _, _, t, _ in wiped}))
        stored, gone = cql.stored_users(found["user_time"])
        self._run(cql.graph_ops(plan, ts) + cql.relation_ops(plan.relations.values(), ts)
                  + cql.user_ops(plan.users, stored, ts, plan.deleted_users, gone)
                  + cql.remove_ops(gone_keys, ts))
        meta = {u: cql.decode_meta(rows) for u, rows in found["meta_get"].items()}
        for user in {key[0] for key in gone_keys}:
            meta.setdefault(user, cql.Meta()).chunks += 1
        return meta

    def _claims(self, tweets: set[int]) -> dict[int, tuple[int | None, int | None]]:
        """The stored claims (created_at, author) on these tweet ids (one ``IN`` read a 100)."""
        if not tweets:
            return {}
        found = self._lookup({"tweet_state": sorted(tweets)})["tweet_state"]
        return cql.claims({t: s for t, rows in found.items()
                           if (s := cql.TweetState.decode(rows)) is not None})

    def _write_adds(self, plan: WritePlan, meta: dict[int, cql.Meta], ts: int,
                    inactive_ms: int) -> tuple[np.ndarray, int]:
        """Reads, regenerations, dormancy, then the adds; after the batch's removes.

        Returns the adds written (for trimming; ``(n, 4)``) and the timeline entries the
        batch added (regenerated ones included, and those past ``cap + trim_slack`` of a
        user's in this batch, which :func:`cql.capped_adds` trims as they come, as the
        SQLite store inserts then trims them). ``ts`` is the batch's ``T``.
        """
        returning = cql.record_reads(plan.activity, meta)
        back = np.array(self._regenerate(returning, meta), np.int64).reshape(-1, 4)
        dormant = cql.go_dormant(plan.adds, meta, inactive_ms)
        if self.upkeep > 1:
            dormant = sorted({*dormant, *cql.dormant_added(plan.adds, meta)})
        kept = cql.kept_adds(plan, meta)
        adds = cql.capped_adds(kept, meta, self.cap + self.trim_slack)
        # A returning user's partition goes first: what blind batches stored under
        # the dormant horizon (:func:`cql.blind_users`) is no part of the new cache.
        self._run(cql.drop_ops(returning, ts + cql.REMOVE) + cql.drop_ops(dormant, ts + cql.TRIM)
                  + cql.add_ops(np.concatenate((back, adds)), ts + cql.ADD, meta))
        return adds, len(back) + len(kept)

    def _regenerate(self, users: list[int], meta: dict[int, cql.Meta]
                    ) -> list[tuple[int, int, int, int]]:
        """Returning users' caches as rows to add (``meta`` set to match).

        Two concurrent runs whatever the number of users: their follows and celebrity
        edges, then the newest ``cap + 1`` of each author any of them follows.
        """
        if not users:
            return []
        graph = self._run([(name, (u,)) for u in users
                           for name in ("followees", "relations_get")])
        authors: dict[int, list[int]] = {}
        for i, user in enumerate(users):
            celebs = set(reads.celebrity_rows(graph[2 * i + 1]))
            authors[user] = [a for a in reads.column(graph[2 * i]) if a not in celebs]
        every = sorted({a for found in authors.values() for a in found})
        pages = dict(zip(every, self._run(reads.author_queries(every, None, self.cap + 1)),
                         strict=True))
        rows = []
        for user in users:
            entries = reads.merge_authors(authors[user], [pages[a] for a in authors[user]],
                                          self.cap + 1)
            rows += cql.regenerated(user, entries, meta[user], self.cap)
        return rows

    def _write_trims(self, adds: np.ndarray, meta: dict[int, cql.Meta], ts: int) -> None:
        """Merge and trim the timelines past their bounds; write timeline_meta.

        ``ts`` is ``T + TRIM``; the bounds are :func:`cql.over_cap`'s, after
        :func:`cql.count_blind_rows`.
        """
        cql.count_blind_rows(adds, meta, ts - cql.TRIM, self.upkeep)
        users = cql.over_cap(adds, meta, self.cap, self.trim_slack)
        found = self._lookup({"home_get": users})["home_get"]
        merges = [cql.merge_op(u, found[u], meta[u], self.cap, ts) for u in users]
        self._run(merges + cql.meta_ops(meta, ts))

    def _lookup(self, queries: dict[str, list[int]]) -> dict[str, dict[int, reads.Rows]]:
        """Single-key reads of the writer, in one bounded run (``IN`` reads where possible)."""
        return cql.lookup_rows(queries, self._run(cql.lookup_ops(queries)))

    def _finish(self, plan: WritePlan, batch_id: int, ts: int, seconds: float,
                moved: set[int]) -> None:
        now_ms = int(time.time() * 1000)
        changed = Changes.of(plan, moved)
        self._run(cql.offset_ops(plan.offsets) + cql.dead_ops(plan.dead, now_ms)
                  + cql.dead_partition_ops(plan.dead) + changed.ops(ts))
        if batch_id >= 0:
            record = cql.BatchRecord(batch_id, ts, cql.offsets_digest(plan.offsets), now_ms,
                                     plan.rows(), seconds, plan.max_event_time)
            self._run(record.ops())
        self._run([committed_op(ts)])  # last: the page caches may now take the batch in

    # -- read side --------------------------------------------------------------------------------
    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        """No snapshot on Cassandra: reads see rows as they land (module docstring)."""
        return contextlib.nullcontext()

    def cached(self, user: int, below: Key | None, limit: int) -> list[Entry]:
        """Above the horizon, as :meth:`home_start` reads it: both in one round trip."""
        if limit <= 0:
            return []
        meta, rows = self._run([("horizon_get", (user,)), reads.cached_query(user)],
                               EXEC_PROFILE_DEFAULT)
        return reads.cached_page(rows, below, limit, reads.horizon_key(meta))

    def home_start(self, user: int, below: Key | None, limit: int) -> HomeStart:
        """The reader's three partitions in one concurrent run: one round trip.

        The celebrities followed come from the reader's ``relations`` partition, where
        the writer keeps them beside the blocks and mutes.
        """
        ops = [("horizon_get", (user,)), ("relations_get", (user,))]
        if limit > 0:
            ops.append(reads.cached_query(user))
        meta, relations, *page = self._run(ops, EXEC_PROFILE_DEFAULT)
        horizon = reads.horizon_key(meta)
        return HomeStart(horizon, reads.celebrity_rows(relations), reads.relation_set(relations),
                         reads.cached_page(page[0], below, limit, horizon) if page else [])

    def horizon(self, user: int) -> Key | None:
        return reads.horizon_key(self._rows("horizon_get", (user,)))

    def celebrities_followed(self, user: int) -> list[int]:
        """From the user's ``relations`` partition, as :meth:`home_start` reads them."""
        return reads.celebrity_rows(self._rows("relations_get", (user,)))

    def followees(self, user: int) -> list[int]:
        return reads.column(self._rows("followees", (user,)))

    def author_tweets(self, authors: Sequence[int], below: Key | None,
                      limit: int) -> list[Entry]:
        """Each author's newest ``limit`` by ``IN`` reads (:func:`reads.author_pages`), merged."""
        pages = self._run(reads.author_pages(authors, below, limit), EXEC_PROFILE_DEFAULT)
        return reads.newest(reads.author_entries(pages), limit)

    def recent_by_author(self, authors: Sequence[int], n: int) -> dict[int, list[Entry]]:
        """Each author's newest ``n``, by ``IN`` reads (:func:`reads.author_pages`)."""
        pages = self._run(reads.author_pages(authors, None, n), EXEC_PROFILE_DEFAULT)
        return reads.by_author(authors, reads.author_entries(pages))

    def tweets(self, ids: Sequence[int]) -> dict[int, TweetRow]:
        """One ``IN`` read per :data:`reads.IN_MAX` ids, the reads run concurrently."""
        ops = reads.keyed_queries("tweet_get_in", ids)
        return reads.tweet_rows(self._run(ops, EXEC_PROFILE_DEFAULT))

    def users(self, ids: Sequence[int]) -> dict[int, UserRow]:
        """One ``IN`` read per :data:`reads.IN_MAX` ids, the reads run concurrently."""
        ops = reads.keyed_queries("user_get_in", ids)
        return reads.user_rows(self._run(ops, EXEC_PROFILE_DEFAULT))

    def relations(self, user: int) -> Relations:
        """One partition: the user's own blocks and mutes, and the blocks of the user."""
        return reads.relation_set(self._rows("relations_get", (user,)))

    def reposts_of(self, originals: Sequence[int], above: Mapping[int, Key] | None = None,
                   reader: int | None = None) -> dict[int, list[Entry]]:
        """One ``IN`` read per :data:`reads.IN_MAX` originals, run concurrently.

        ``reader`` is not used: the reader's follow edges are another partition, another
        round trip, which the caller makes only when some repost needs it.
        """
        above = above or {}
        ops = reads.repost_queries(originals, above)
        return self._reposts_read(ops, self._run(ops, EXEC_PROFILE_DEFAULT), above)

    def _reposts_read(self, ops: list[cql.Op], pages: list[reads.Rows],
                      above: Mapping[int, Key]) -> dict[int, list[Entry]]:
        """The reposts :func:`reads.repost_queries`' ``ops`` read, by original.

        A read whose rows fill its LIMIT (a tweet reposted thousands of times) may be
        cut short: its originals are read again one partition each, paged.
        """
        short = reads.cut_short(ops, pages)
        if short:
            again = [reads.repost_query(o, above) for i in short for o in ops[i][1][0]]
            pages = [p for i, p in enumerate(pages) if i not in short] + self._run(
                again, EXEC_PROFILE_DEFAULT)
        return reads.above_bounds(reads.reposts_by_original(pages), above)

    def hydrate(self, tweets: Sequence[int], users: Sequence[int], reposts: Mapping[int, Key],
                reader: int | None = None, followees: bool = False) -> Hydrated:
        """Every read in one concurrent run: one round trip (plus one for a viral tweet)."""
        groups = [reads.keyed_queries("tweet_get_in", tweets),
                  reads.keyed_queries("user_get_in", users),
                  reads.repost_queries(list(reposts), reposts),
                  [("followees", (reader,))] if followees and reader is not None else []]
        pages = self._run([op for group in groups for op in group], EXEC_PROFILE_DEFAULT)
        read: list[list[reads.Rows]] = []
        for group in groups:
            read.append(pages[:len(group)])
            pages = pages[len(group):]
        return Hydrated(reads.tweet_rows(read[0]), reads.user_rows(read[1]),
                        self._reposts_read(groups[2], read[2], reposts) if groups[2] else {},
                        reads.column(read[3][0]) if groups[3] else None)

    def celebrities(self) -> list[int]:
        return sorted(reads.column(self._rows("celebs")))

    def applied_offsets(self) -> dict[tuple[str, int], int]:
        return {(t, p): o for t, p, o in self._rows("offsets", scan=True)}

    def job_sink(self, checkpoint: Path) -> Sink:
        """Written from the executors, the batch never on the driver (:mod:`.sink`)."""
        from views.stores.cassandra.sink import ExecutorSink  # pyarrow: the job's alone

        return ExecutorSink(self, checkpoint)

    def task_stores(self) -> Callable[[], CassandraStore]:
        """What opens this store's keyspace in a process that runs the executor sink's tasks.

        Picklable: Spark ships it to the executors, where :func:`task_store` keeps one
        open store per process.
        """
        return functools.partial(task_store, self.config, self.cap)

    def version(self) -> CassandraFeed:
        """The batches' change feed (:mod:`.changes`), for per-page tokens."""
        return CassandraFeed(self, self._rows, self.config.page_fresh_s)


    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest dead letters (a full scan: dead letters are few, or alarming)."""
        rows = sorted(self._rows("dead_all", scan=True),
                      key=lambda r: (-(r[5] or 0), r[0], r[1], r[2]))
        return [DeadLetter(t, p, o, r or "", bytes(raw or b""), s or 0)
                for t, p, o, r, raw, s in rows[:max(0, limit)]]

    def counts(self) -> dict[str, int]:
        """Exact row counts by full scans: slow on big tables (use nodetool tablestats).

        ``home_timeline`` counts timeline entries, each user's ``home_chunks`` folded.
        """
        counted = {t: int(self._rows(f"count_{t}", scan=True)[0][0]) for t in cql.COUNTED}
        by_user: dict[int, list[chunks.Chunk]] = {}
        for user, ts, removes, adds in self._rows("home_chunks_all", scan=True):
            by_user.setdefault(user, []).append((ts, removes, adds))
        return {"home_timeline": sum(len(chunks.fold(c)) for c in by_user.values()), **counted}

    def batches(self, limit: int = 100) -> list[BatchInfo]:
        """The newest batches: one row read for the pointer, then one or two partitions."""
        clock = self._rows("clock_get")
        if limit <= 0 or not clock or clock[0][1] is None:
            return []
        out: list[BatchInfo] = []
        for bucket in cql.batch_buckets(int(clock[0][1]), limit):
            rows = self._rows("batch_page", (bucket, cql.bounded_limit(limit - len(out))))
            out += [BatchInfo(b, f or 0, n or 0, s or 0.0, m or 0) for b, f, n, s, m in rows]
            if len(out) >= limit:
                break
        return out

    def dead_letter_count(self) -> int:
        """Dead letters held: a count in each partition that holds any (a bounded read).

        ``dead_letter_partitions`` lists them (a few per topic), so the job's and the
        API's metrics never aggregate over the whole table.
        """
        parts = self._rows("dead_parts")
        counts = self._run([("dead_count", (t, p)) for t, p in parts], EXEC_PROFILE_DEFAULT)
        return sum(int(rows[0][0]) for rows in counts if rows)

    def home_users(self) -> list[int]:
        """Users with a follow, a cached timeline or a celebrity edge (three key scans)."""
        found: set[int] = set()
        for name in ("followers_all", "home_users_all", "celeb_users_all"):
            found.update(reads.column(self._rows(name, scan=True)))
        return sorted(found)


_TASK_STORES: dict[tuple[CassandraConfig, int], CassandraStore] = {}
_TASK_STORES_LOCK = threading.Lock()


def task_store(config: CassandraConfig, cap: int) -> CassandraStore:
    """The open :meth:`CassandraStore.for_tasks` of ``config`` in this process, kept.

    Opening reads the schema's version at the read level: with the quorum lost (two
    nodes of three down), a new executor process would fail its task at once, and
    Spark's four attempts would end the job instead of waiting out the store's
    ``retry`` for the nodes to come back; so the open is retried as requests are.
    """
    key = (config, cap)
    with _TASK_STORES_LOCK:
        found = _TASK_STORES.get(key)
        if found is None:
            found = CassandraStore.for_tasks(config, cap)
            retrying("opening the store", found.open, found.retry_s)
            _TASK_STORES[key] = found
            log.info("executor process opened a Cassandra session for %s", config.keyspace)
        return found


def close_task_stores() -> None:
    """Close every store :func:`task_store` kept (tests, and processes that outlive their jobs)."""
    with _TASK_STORES_LOCK:
        for kept in _TASK_STORES.values():
            kept.close()
        _TASK_STORES.clear()
