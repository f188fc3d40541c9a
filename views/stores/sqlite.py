"""The embedded store: one SQLite file in WAL mode (DESIGN §6).

Every micro-batch is one transaction; every statement is parameterized and keyed,
so a replayed batch is a no-op. Readers (the API) open their own connections and see
the last committed batch. The sink's callback runs on a Spark thread, hence
``check_same_thread=False``; one connection is used by one thread at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain, islice
from pathlib import Path

from ingest.events import BLOCK, MUTE
from views.delta import TOP, Key
from views.errors import StoreError
from views.stores.adds import CHUNK, Adds, SortedAdds
from views.stores.contract import Store
from views.stores.plan import WritePlan, stored_conflicts
from views.stores.rows import (
    DORMANT,
    BatchInfo,
    DeadLetter,
    Entry,
    RelationRow,
    Relations,
    TweetRow,
    UserRow,
)
from views.stores.versions import ChangeFeed, Changes, StoreVersion, pack_ids, unpack_ids

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS home_timeline (
  user_id INTEGER NOT NULL, created_at INTEGER NOT NULL, tweet_id INTEGER NOT NULL,
  author_id INTEGER NOT NULL, PRIMARY KEY (user_id, created_at, tweet_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS timeline_meta (
  user_id INTEGER PRIMARY KEY, horizon_created_at INTEGER NOT NULL,
  horizon_tweet_id INTEGER NOT NULL, size INTEGER NOT NULL,
  read_at INTEGER NOT NULL DEFAULT -1);
CREATE TABLE IF NOT EXISTS author_tweets (
  author_id INTEGER NOT NULL, created_at INTEGER NOT NULL, tweet_id INTEGER NOT NULL,
  PRIMARY KEY (author_id, created_at, tweet_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tweets (
  tweet_id INTEGER PRIMARY KEY, author_id INTEGER NOT NULL, created_at INTEGER NOT NULL,
  text TEXT NOT NULL, deleted INTEGER NOT NULL, reply_to INTEGER NOT NULL DEFAULT 0,
  original_id INTEGER NOT NULL DEFAULT 0, original_author INTEGER NOT NULL DEFAULT 0,
  record INTEGER NOT NULL DEFAULT 0, ref_id INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS tweets_by_original ON tweets (original_id, created_at, tweet_id)
  WHERE original_id != 0;
CREATE TABLE IF NOT EXISTS follows (
  follower_id INTEGER NOT NULL, followee_id INTEGER NOT NULL, created_at INTEGER NOT NULL,
  PRIMARY KEY (follower_id, followee_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS celebrity_follows (
  user_id INTEGER NOT NULL, celebrity_id INTEGER NOT NULL,
  PRIMARY KEY (user_id, celebrity_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS celebrities (author_id INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS users (
  user_id INTEGER PRIMARY KEY, handle TEXT NOT NULL, name TEXT NOT NULL,
  created_at INTEGER NOT NULL, deleted INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS relations (
  user_id INTEGER NOT NULL, other_id INTEGER NOT NULL, relation TEXT NOT NULL,
  created_at INTEGER NOT NULL, PRIMARY KEY (user_id, other_id, relation)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS applied_offsets (
  topic TEXT NOT NULL, partition INTEGER NOT NULL, "offset" INTEGER NOT NULL,
  PRIMARY KEY (topic, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dead_letters (
  topic TEXT NOT NULL, partition INTEGER NOT NULL, "offset" INTEGER NOT NULL,
  reason TEXT NOT NULL, raw BLOB, seen_at INTEGER NOT NULL,
  PRIMARY KEY (topic, partition, "offset")) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batches (
  batch_id INTEGER PRIMARY KEY, finished_at INTEGER NOT NULL, rows INTEGER NOT NULL,
  seconds REAL NOT NULL, max_event_time INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS page_version (
  id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL);
INSERT OR IGNORE INTO page_version VALUES (0, 0);
CREATE TABLE IF NOT EXISTS page_changes (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, everything INTEGER NOT NULL,
  homes BLOB NOT NULL, authors BLOB NOT NULL, tweets BLOB NOT NULL, users BLOB NOT NULL,
  originals BLOB NOT NULL);
CREATE TRIGGER IF NOT EXISTS page_version_drops_every_page AFTER UPDATE ON page_version
BEGIN
  INSERT INTO page_changes (at, everything, homes, authors, tweets, users, originals)
  VALUES (CAST(strftime('%s', 'now') AS INTEGER) * 1000, 1, X'', X'', X'', X'', X'');
END;
"""
#: Ids per ``IN (...)`` of one read (SQLite allows 32,766 bound values; any build 999).
_IN_CHUNK = 900
#: When another author's claim on a tweet id gives way to the row written
#: (views.stores.plan.outranks): it claims nothing (a delete of unknown time), or the
#: written claim is earlier by (created_at, author_id).
_RIVAL = ("tweets.author_id != excluded.author_id AND (tweets.created_at = 0 OR "
          "(excluded.created_at, excluded.author_id) < (tweets.created_at, tweets.author_id))")
_SAME = "tweets.author_id = excluded.author_id"
#: A delete: the author's own hides their tweet (keeping the first known time, which
#: makes the row a claim); one of known time is a claim that may outrank another's.
_GONE = (
    "INSERT INTO tweets VALUES (?, ?, ?, '', 1, 0, 0, 0, 0, 0) ON CONFLICT (tweet_id) DO UPDATE "
    f"SET deleted = 1, text = '', created_at = CASE WHEN {_SAME} AND tweets.created_at != 0 "
    "THEN tweets.created_at ELSE excluded.created_at END, author_id = excluded.author_id, "
    + ", ".join(f"{c} = CASE WHEN {_SAME} THEN tweets.{c} ELSE 0 END"
                for c in ("reply_to", "original_id", "original_author", "record", "ref_id"))
    + f" WHERE {_SAME} OR (excluded.created_at != 0 AND {_RIVAL})")
#: The change feed (:class:`SQLiteFeed`): ``page_changes`` holds a row for each batch
#: that may change a page (:meth:`Changes.of`, with the homes a dormant reader's
#: regenerated cache touched), written in the batch's transaction, numbered by ``seq``
#: with no gaps (AUTOINCREMENT, rolled back with its batch), and trimmed to the last
#: FEED_BATCHES rows and FEED_MS of time, whichever keeps fewer (the newest row stays).
#: ``page_version`` is what an older version counted page-visible commits in: the sink
#: no longer writes it, and an update of it (a hand-edited store) is a change of
#: everything, so no cached page survives it.
FEED_BATCHES = 256
FEED_MS = 600_000
#: Oldest rows the age trim looks at per batch (it runs every batch: a few at most).
_FEED_TRIM_SCAN = 64
_FEED_ADD = ("INSERT INTO page_changes (at, everything, homes, authors, tweets, users, "
             "originals) VALUES (?, ?, ?, ?, ?, ?, ?)")
_FEED_SINCE = ("SELECT seq, everything, homes, authors, tweets, users, originals FROM "
               "page_changes WHERE seq > ? AND seq <= ? ORDER BY seq")

NO_HORIZON = (-1, -1)
#: Page cache of the connection that writes batches (KiB; reading connections keep
#: SQLite's default).
WRITER_CACHE_KIB = 256 * 1024
_TABLES = ("home_timeline", "author_tweets", "tweets", "follows", "celebrity_follows",
           "celebrities", "users", "relations", "dead_letters", "timeline_meta")
#: The row a block is also kept under, in the blocked user's partition of ``relations``.
BLOCKED_BY = "blocked_by"
#: Columns this version added to older tables: a file without them predates DESIGN §4b.
_NEW_COLUMNS = {"tweets": ("reply_to", "original_id", "original_author"),
                "users": ("deleted",), "timeline_meta": ("read_at",)}
#: Columns added since, which :meth:`SQLiteStore.open` adds to a file without them (at
#: the table's end, where SCHEMA has them: the inserts give every column in order).
_ADDED_COLUMNS = {"tweets": (("record", "INTEGER NOT NULL DEFAULT 0"),
                             ("ref_id", "INTEGER NOT NULL DEFAULT 0"))}


def _relation_rows(r: RelationRow) -> list[tuple[int, int, str, int]]:
    """The stored rows of one block or mute: a block twice, once per side."""
    rows = [(r.user_id, r.other_id, r.relation, r.created_at)]
    if r.relation == BLOCK:
        rows.append((r.other_id, r.user_id, BLOCKED_BY, r.created_at))
    return rows


#: Rows per ``INSERT`` statement in the big writes. ``executemany`` runs SQLite's
#: statement once per row, and its fixed cost (reset, bind, halt) was most of an
#: insert's: 2.1M timeline adds go in 1.7 s as 64-row statements against 3.3 s one
#: row at a time. 64 × 4 values stays far under any build's variable limit.
ROWS_PER_INSERT = 64


def insert_flat(db: sqlite3.Connection, head: str, width: int,
                chunks: Iterable[Sequence[object]]) -> None:
    """``head VALUES (…), (…), …`` for rows given flat, ``width`` values a row.

    Rows go in the order given, as ``executemany`` would take them one by one, so
    ``OR IGNORE`` / ``OR REPLACE`` / upserts resolve duplicates the same way.
    """
    row = f"({', '.join('?' * width)})"
    many = f"{head} VALUES {', '.join([row] * ROWS_PER_INSERT)}"
    step = ROWS_PER_INSERT * width
    for values in chunks:
        whole = len(values) - len(values) % step
        db.executemany(many, (values[i:i + step] for i in range(0, whole, step)))
        if whole < len(values):
            rest = (len(values) - whole) // width
            db.execute(f"{head} VALUES {', '.join([row] * rest)}", values[whole:])


def insert_rows(db: sqlite3.Connection, head: str, width: int,
                rows: Iterable[Sequence[object]]) -> None:
    """:func:`insert_flat` for rows as tuples, flattened :data:`CHUNK` rows at a time."""
    rows = iter(rows)
    while block := list(islice(rows, CHUNK)):
        insert_flat(db, head, width, (list(chain.from_iterable(block)),))


class Checkpointer:
    """Copies a file's write-ahead log into the database in a thread of its own.

    SQLite's automatic checkpoint runs inside the ``COMMIT`` that fills the log, so a
    batch became visible only after its pages had been written twice (into the log,
    then into the database): ~1 s of a burst batch's 2.1M rows. The writer turns it
    off (``wal_autocheckpoint=0``) and asks for a checkpoint after each commit
    instead; it runs while Spark computes the next batch. The writer waits for it
    before its next transaction (:meth:`wait`), so the log still starts over every
    batch and never grows past one batch's pages.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._cond = threading.Condition()
        self._asked = self._done = 0
        self._closing = self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """False once the thread has stopped, closed or not."""
        return not self._stopped

    def request(self) -> None:
        """Checkpoint everything committed so far, soon."""
        with self._cond:
            self._asked += 1
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Until every requested checkpoint has run or the thread stopped; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= self._asked or self._stopped,
                                       timeout)

    def close(self) -> None:
        """Run what was requested, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        db: sqlite3.Connection | None = None
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._asked > self._done or self._closing)
                    asked, closing = self._asked, self._closing
                if asked > self._done:
                    try:
                        if db is None:
                            db = sqlite3.connect(self.path, timeout=30, isolation_level=None,
                                                 check_same_thread=False)
                        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    except sqlite3.Error as e:  # the next commit asks again
                        log.warning("checkpoint of %s failed: %s", self.path, e)
                with self._cond:
                    self._done = asked
                    self._cond.notify_all()
                if closing:
                    return
        finally:  # a writer never waits on a thread that is gone
            with self._cond:
                self._stopped = True
                self._cond.notify_all()
            if db is not None:
                db.close()


def _entries(rows: Iterable[tuple[int, int]], author: int) -> Iterator[Entry]:
    return (Entry(c, t, author) for c, t in rows)


#: The filter of :meth:`SQLiteStore.reposts_of` with a reader: by the reader's followees.
_BY_FOLLOWEES = " AND author_id IN (SELECT followee_id FROM follows WHERE follower_id = ?)"


class SQLiteStore(Store):
    """Store in one SQLite file; see the module docstring."""

    reads_in_process = True
    rows_shared = False
    atomic_batches = True

    def __init__(self, path: str | Path, cap: int = 800, trim_slack: int | None = None,
                 inactive_days: float = 0.0) -> None:
        super().__init__(cap, inactive_days)
        #: Timeline rows inserted since open (fan-out writes, regenerations included).
        self.rows_written = 0
        #: Rows a timeline may hold past the cap before it is trimmed (amortizes trims).
        self.trim_slack = max(16, cap // 4) if trim_slack is None else trim_slack
        self.path = str(path)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._checkpointer: Checkpointer | None = None

    def open(self) -> SQLiteStore:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._check_columns()
        self._add_columns()
        self._conn().executescript(SCHEMA)
        return self

    def _add_columns(self) -> None:
        """Add :data:`_ADDED_COLUMNS` to a file written before them.

        The job, the API's workers and ``verify`` open one file side by side: a column
        another process added meanwhile is there, not an error.
        """
        db = self._conn()
        for table, columns in _ADDED_COLUMNS.items():
            have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            for name, declared in columns:
                if have and name not in have:
                    try:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declared}")
                    except sqlite3.OperationalError as exc:
                        if "duplicate column" not in str(exc):
                            raise

    def _check_columns(self) -> None:
        """Refuse a file written before DESIGN §4b: its views lack what reads now need."""
        db = self._conn()
        for table, columns in _NEW_COLUMNS.items():
            have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            missing = [c for c in columns if have and c not in have]
            if missing:
                msg = (f"the store {self.path} predates reposts, blocks and deleted accounts "
                       f"(table {table} has no {', '.join(missing)}): set it aside with "
                       "`fanout rebuild` and replay the history")
                raise StoreError(msg)

    def close(self) -> None:
        with self._lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            self._local.writer = False

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False,
                                   isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
        return conn

    # -- write side ----------------------------------------------------------------
    def _write(self, plan: WritePlan, batch_id: int) -> None:
        start = time.perf_counter()
        db = self._conn()
        if not getattr(self._local, "writer", False):
            # The writer's page cache: inserts land all over home_timeline's B-tree, and
            # with SQLite's default 2 MB they reread pages (the sink alone: 142k → 190k rows/s).
            db.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
            if self.path != ":memory:":
                db.execute("PRAGMA wal_autocheckpoint = 0")  # the Checkpointer's job
            self._local.writer = True
        with self._lock:
            if self.path != ":memory:" and (self._checkpointer is None
                                            or not self._checkpointer.running):
                self._checkpointer = Checkpointer(self.path)
            if self._checkpointer is not None:
                self._checkpointer.wait()  # the log starts over only after it
            db.execute("BEGIN IMMEDIATE")
            try:
                moved = self._write_tables(db, plan)
                homes = self._write_timelines(db, plan)
                self._write_changes(db, plan, moved, homes)
                self._write_bookkeeping(db, plan, batch_id, time.perf_counter() - start)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            if self._checkpointer is not None:
                self._checkpointer.request()

    def _write_tables(self, db: sqlite3.Connection, plan: WritePlan) -> set[int]:
        """The plan's rows; returns the originals its tweet ids were stored under before."""
        plan.dead += stored_conflicts(plan, self._stored_claims(db, plan))
        moved = self._stored_originals(db, plan)
        self._write_tweets(db, plan)
        self._write_reposts(db, plan)
        self._write_graph(db, plan)
        self._write_users(db, plan)
        self._write_relations(db, plan)
        return moved

    @staticmethod
    def _stored_originals(db: sqlite3.Connection, plan: WritePlan) -> set[int]:
        """The originals the plan's tweet ids were stored as reposts of, before it.

        Whatever the plan writes under such an id (shown, hidden, another original, a
        post that outranks it) may change that original's shown reposts, so the change
        feed names it (as Cassandra's :func:`moved_originals`, a superset of it).
        """
        if not (plan.reposts or plan.tweets or plan.foreign_deletes):
            return set()
        ids = sorted({*plan.tweets, *plan.reposts, *(t.tweet_id for t in plan.foreign_deletes)})
        out: set[int] = set()
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i:i + _IN_CHUNK]
            out.update(o for (o,) in db.execute(
                "SELECT original_id FROM tweets WHERE original_id != 0 AND tweet_id IN "  # noqa: S608
                f"({','.join('?' * len(chunk))})", chunk))
        return out

    @staticmethod
    def _write_changes(db: sqlite3.Connection, plan: WritePlan, moved: set[int],
                       homes: set[int]) -> None:
        """The batch's row of the change feed, if it may change a page; then the trim.

        ``homes``: users whose cache the store itself regenerated or dropped (a dormant
        reader): their pages read the same, but are named anyway, as ``page_version``
        counted them.
        """
        changes = Changes.of(plan, moved)
        if homes - changes.homes and not changes.everything:
            changes = dataclasses.replace(changes, homes=changes.homes | homes)
        if not changes:
            return
        now = int(time.time() * 1000)
        seq = db.execute(_FEED_ADD, (now, int(changes.everything), *(
            pack_ids(ids) for ids in (changes.homes, changes.authors, changes.tweets,
                                      changes.users, changes.originals)))).lastrowid
        assert seq is not None
        db.execute("DELETE FROM page_changes WHERE seq <= ?", (seq - FEED_BATCHES,))
        db.execute("DELETE FROM page_changes WHERE seq IN (SELECT seq FROM page_changes "
                   "WHERE seq < ? ORDER BY seq LIMIT ?) AND at < ?",
                   (seq, _FEED_TRIM_SCAN, now - FEED_MS))

    @staticmethod
    def _stored_claims(db: sqlite3.Connection,
                       plan: WritePlan) -> dict[int, tuple[int | None, int | None]]:
        """(created_at, author_id) of the stored rows of the plan's claims (id conflicts)."""
        ids = [t for rows in (plan.tweets, plan.reposts) for t, r in rows.items() if r.created_at]
        out: dict[int, tuple[int | None, int | None]] = {}
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i:i + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            out.update((t, (at, author)) for t, at, author in db.execute(
                f"SELECT tweet_id, created_at, author_id FROM tweets WHERE tweet_id IN ({marks})",  # noqa: S608
                chunk))
        return out

    @staticmethod
    def _write_tweets(db: sqlite3.Connection, plan: WritePlan) -> None:
        live = [t for t in plan.tweets.values() if not t.deleted]
        gone = [t for t in plan.tweets.values() if t.deleted] + plan.foreign_deletes
        # A tweet id belongs to whoever posted it: a delete under another author's
        # id (a forged or mistaken delete) neither hides it nor keeps it hidden. Of two
        # authors' claims, the earlier owns the id (views.stores.plan): _RIVAL.
        db.executemany(
            "INSERT INTO tweets VALUES (?, ?, ?, ?, 0, ?, 0, 0, ?, ?) ON CONFLICT (tweet_id) "
            "DO UPDATE SET author_id = excluded.author_id, created_at = excluded.created_at, "
            "text = excluded.text, deleted = 0, reply_to = excluded.reply_to, "
            "original_id = 0, original_author = 0, record = excluded.record, "
            f"ref_id = excluded.ref_id WHERE {_RIVAL}",
            [(t.tweet_id, t.author_id, t.created_at, t.text, t.reply_to, t.record, t.ref_id)
             for t in live])
        # A tweet deleted in an earlier batch stays deleted, and one another author
        # owns is not this author's entry: no live row for either. In author_tweets'
        # key order, as the follows (_write_graph).
        db.executemany(
            "INSERT OR IGNORE INTO author_tweets SELECT ?, ?, ? WHERE EXISTS "
            "(SELECT 1 FROM tweets WHERE tweet_id = ? AND author_id = ? AND deleted = 0)",
            sorted((t.author_id, t.created_at, t.tweet_id, t.tweet_id, t.author_id)
                   for t in live))
        db.executemany(
            "DELETE FROM author_tweets WHERE author_id = ? AND tweet_id = ?",
            [(t.author_id, t.tweet_id) for t in gone])
        # The author's own delete hides the tweet, and a first known time makes the
        # row a claim; a deleted claim may also outrank another author's.
        db.executemany(_GONE, [(t.tweet_id, t.author_id, t.created_at) for t in gone])

    @staticmethod
    def _write_reposts(db: sqlite3.Connection, plan: WritePlan) -> None:
        """Reposts: the last state written wins, shown or not (unlike a post's delete).

        A shown repost is one of its reposter's entries, so it is in ``author_tweets``
        exactly while shown, at the time last written (a duplicate with an earlier
        time may replace it: the row at the stored time goes first). Written after
        the tweets, so that in one batch the join's repost state is what stays.
        """
        rows = plan.reposts.values()
        db.executemany(
            "DELETE FROM author_tweets WHERE author_id = ? AND tweet_id = ? AND created_at = "
            "(SELECT created_at FROM tweets WHERE tweet_id = ?)",
            [(r.author_id, r.tweet_id, r.tweet_id) for r in rows])
        db.executemany(
            "DELETE FROM author_tweets WHERE author_id = ? AND created_at = ? AND tweet_id = ?",
            [(r.author_id, r.created_at, r.tweet_id) for r in rows if r.deleted])
        db.executemany(
            "INSERT INTO tweets VALUES (?, ?, ?, '', ?, 0, ?, ?, 0, 0) ON CONFLICT (tweet_id) "
            "DO UPDATE SET author_id = excluded.author_id, created_at = excluded.created_at, "
            "text = '', deleted = excluded.deleted, reply_to = 0, record = 0, ref_id = 0, "
            "original_id = excluded.original_id, original_author = excluded.original_author "
            f"WHERE tweets.author_id = excluded.author_id OR {_RIVAL}",
            [(r.tweet_id, r.author_id, r.created_at, int(r.deleted), r.original_id,
              r.original_author) for r in rows])
        db.executemany(
            "INSERT OR IGNORE INTO author_tweets SELECT ?, ?, ? WHERE EXISTS "
            "(SELECT 1 FROM tweets WHERE tweet_id = ? AND author_id = ?)",
            [(r.author_id, r.created_at, r.tweet_id, r.tweet_id, r.author_id)
             for r in rows if not r.deleted])

    @staticmethod
    def _write_graph(db: sqlite3.Connection, plan: WritePlan) -> None:
        # In key order: a batch's follows arrive in any order, and B-tree inserts in key
        # order touch each page once. Random edges went in 2x faster; ego-twitter's,
        # which arrive partly grouped, 14-24%. Each key is in
        # the plan once, so the order changes nothing else.
        edges = plan.follows.values()
        on = sorted((e.follower_id, e.followee_id, e.created_at) for e in edges if e.active)
        off = sorted((e.follower_id, e.followee_id) for e in edges if not e.active)
        insert_rows(db, "INSERT OR REPLACE INTO follows", 3, on)
        db.executemany("DELETE FROM follows WHERE follower_id = ? AND followee_id = ?", off)
        stars = sorted(plan.celeb_edges.items())
        insert_rows(db, "INSERT OR IGNORE INTO celebrity_follows", 2,
                    [pair for pair, on in stars if on])
        db.executemany("DELETE FROM celebrity_follows WHERE user_id = ? AND celebrity_id = ?",
                       [pair for pair, on in stars if not on])
        db.executemany("INSERT OR IGNORE INTO celebrities VALUES (?)",
                       [(a,) for a, on in plan.celebs.items() if on])
        db.executemany("DELETE FROM celebrities WHERE author_id = ?",
                       [(a,) for a, on in plan.celebs.items() if not on])

    @staticmethod
    def _write_users(db: sqlite3.Connection, plan: WritePlan) -> None:
        """Profiles, newest wins; a deleted account forgets its profile and stays deleted."""
        db.executemany(
            "INSERT INTO users VALUES (?, ?, ?, ?, 0) ON CONFLICT (user_id) DO UPDATE SET "
            "handle = excluded.handle, name = excluded.name, created_at = excluded.created_at "
            "WHERE excluded.created_at >= users.created_at AND users.deleted = 0",
            [(p.user_id, p.handle, p.name, p.created_at) for p in plan.users.values()])
        db.executemany(
            "INSERT INTO users VALUES (?, '', '', ?, 1) ON CONFLICT (user_id) DO UPDATE SET "
            "handle = '', name = '', deleted = 1, "
            "created_at = max(users.created_at, excluded.created_at)",
            list(plan.deleted_users.items()))

    @staticmethod
    def _write_relations(db: sqlite3.Connection, plan: WritePlan) -> None:
        """Blocks and mutes that stand; a block is also kept under the blocked user.

        ``relations(u)`` is then one read of ``u``'s rows: blocks made by ``u``
        (``block``), blocks of ``u`` (``blocked_by``) and mutes made by ``u``.
        """
        rows = plan.relations.values()
        on = [r for r in rows if r.on]
        off = [r for r in rows if not r.on]
        db.executemany("INSERT OR REPLACE INTO relations VALUES (?, ?, ?, ?)",
                       [row for r in on for row in _relation_rows(r)])
        db.executemany(
            "DELETE FROM relations WHERE user_id = ? AND other_id = ? AND relation = ?",
            [row[:3] for r in off for row in _relation_rows(r)])

    def _write_timelines(self, db: sqlite3.Connection, plan: WritePlan) -> set[int]:
        """The timeline rows; returns the users whose cache was regenerated or dropped."""
        # Not a row another author's claim owns at its time: two claims of one id at one
        # time share a row, and the wipe of the author it lists leaves the owner's entry.
        db.executemany(
            "DELETE FROM home_timeline WHERE user_id = ? AND author_id = ? AND NOT EXISTS ("
            "SELECT 1 FROM tweets WHERE tweets.tweet_id = home_timeline.tweet_id "
            "AND tweets.author_id != home_timeline.author_id "
            "AND tweets.created_at = home_timeline.created_at)", sorted(plan.wipes))
        # A remove whose time the join did not know takes it from the tweets table.
        db.executemany(
            "DELETE FROM home_timeline WHERE user_id = ? AND tweet_id = ? AND author_id = ? "
            "AND created_at = coalesce(nullif(?, 0), "
            "(SELECT created_at FROM tweets WHERE tweet_id = ?))",
            [(u, t, a, c, t) for u, t, c, a in plan.removes])
        ordered = SortedAdds(plan.adds)  # one sort: the users it reaches, then the kept
        meta = self._meta(db, set(ordered.users()) | set(plan.horizons) | set(plan.activity))
        homes = self._read(db, plan.activity, meta)
        for user, key in plan.horizons.items():
            meta[user][0] = max(meta[user][0], key)
        homes |= self._go_dormant(db, plan.adds, meta)
        # At or below its horizon a timeline is read through the query, not the cache,
        # so an add there would only be trimmed again: skip it (all of a dormant one's).
        adds = ordered.kept({u: m[0] for u, m in meta.items()})
        del ordered  # its whole-batch order; the kept adds have their own
        insert_flat(db, "INSERT OR IGNORE INTO home_timeline", 4, adds.flat())
        self.rows_written += len(adds)
        for user, added in adds.per_user():
            self._maybe_trim(db, user, meta[user], added)
        insert_rows(db, "INSERT OR REPLACE INTO timeline_meta", 5,
                    [(u, h[0], h[1], size, read_at) for u, (h, size, read_at) in meta.items()])
        return homes

    def _read(self, db: sqlite3.Connection, activity: dict[int, int],
              meta: dict[int, list]) -> set[int]:
        """Record reads; a dormant user who read gets their cache regenerated (returned)."""
        regenerated = set()
        for user, read_at in activity.items():
            m = meta[user]
            m[2] = max(m[2], read_at)
            if m[0] == DORMANT:
                m[0], m[1] = self._regenerate(db, user)
                regenerated.add(user)
        return regenerated

    def _regenerate(self, db: sqlite3.Connection, user: int) -> tuple[Key, int]:
        """Fill a returning user's cache as fan-out would have: (horizon, size).

        The newest ``cap`` entries of the followees on fan-out (celebrities are merged
        at read time), read from ``author_tweets`` after this batch's tweets were
        written; below them the horizon, where reads go to the query.
        """
        celebs = set(self.celebrities_followed(user))
        authors = [a for a in self.followees(user) if a not in celebs]
        entries = self.author_tweets(authors, None, self.cap + 1)
        kept = entries[:self.cap]
        insert_rows(db, "INSERT OR IGNORE INTO home_timeline", 4,
                    [(user, e.created_at, e.tweet_id, e.author_id) for e in kept])
        self.rows_written += len(kept)
        horizon = entries[self.cap].key if len(entries) > self.cap else NO_HORIZON
        return horizon, len(kept)

    def _go_dormant(self, db: sqlite3.Connection, adds: Adds,
                    meta: dict[int, list]) -> set[int]:
        """Users an entry reaches more than ``inactive_ms`` after their newest read.

        Their cache is dropped and their horizon set to :data:`DORMANT`, so this
        batch's adds and every later one skip them until they read again. Returns them.
        """
        dropped: set[int] = set()
        if not self.inactive_ms:
            return dropped
        for user, created_at, _, _ in adds:
            m = meta[user]
            if 0 <= m[2] < created_at - self.inactive_ms and m[0] != DORMANT:
                db.execute("DELETE FROM home_timeline WHERE user_id = ?", (user,))
                m[0], m[1] = DORMANT, 0
                dropped.add(user)
        return dropped

    @staticmethod
    def _meta(db: sqlite3.Connection, users: set[int]) -> dict[int, list]:
        """Per user: [horizon key, size estimate, newest read], (-1, -1), 0 and -1 if unseen."""
        meta: dict[int, list] = {u: [NO_HORIZON, 0, -1] for u in users}
        ordered = sorted(users)
        for i in range(0, len(ordered), 500):
            chunk = ordered[i:i + 500]
            for u, c, t, size, read_at in db.execute(
                    "SELECT user_id, horizon_created_at, horizon_tweet_id, size, read_at FROM "
                    f"timeline_meta WHERE user_id IN ({','.join('?' * len(chunk))})", chunk):
                meta[u] = [(c, t), size, read_at]
        return meta

    def _maybe_trim(self, db: sqlite3.Connection, user: int, meta: list, added: int) -> None:
        """Trim once the size estimate passes cap + slack: amortized, not every batch.

        The estimate only grows with adds (deletes make it an upper bound), so a
        timeline holds at most ``cap + slack`` rows plus one batch; reads stay exact
        because of the horizon.
        """
        meta[1] += added
        if meta[1] <= self.cap + self.trim_slack:
            return
        row = db.execute(
            "SELECT created_at, tweet_id FROM home_timeline WHERE user_id = ? "
            "ORDER BY created_at DESC, tweet_id DESC LIMIT 1 OFFSET ?",
            (user, self.cap)).fetchone()
        if row is None:
            meta[1] = db.execute("SELECT count(*) FROM home_timeline WHERE user_id = ?",
                                 (user,)).fetchone()[0]
            return
        db.execute("DELETE FROM home_timeline WHERE user_id = ? AND (created_at, tweet_id) <= "
                   "(?, ?)", (user, row[0], row[1]))
        meta[0] = max(meta[0], (row[0], row[1]))
        meta[1] = self.cap

    @staticmethod
    def _write_bookkeeping(db: sqlite3.Connection, plan: WritePlan, batch_id: int,
                           seconds: float) -> None:
        db.executemany(
            'INSERT INTO applied_offsets VALUES (?, ?, ?) ON CONFLICT (topic, partition) '
            'DO UPDATE SET "offset" = max("offset", excluded."offset")',
            [(t, p, o) for (t, p), o in plan.offsets.items()])
        now = int(time.time() * 1000)
        db.executemany(
            "INSERT OR IGNORE INTO dead_letters VALUES (?, ?, ?, ?, ?, ?)",
            [(d.topic, d.partition, d.offset, d.reason, d.raw, now) for d in plan.dead])
        if batch_id >= 0:
            db.execute("INSERT OR REPLACE INTO batches VALUES (?, ?, ?, ?, ?)",
                       (batch_id, now, plan.rows(), seconds, plan.max_event_time))

    # -- read side -------------------------------------------------------------------
    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """A read transaction: WAL readers see one commit throughout."""
        db = self._conn()
        db.execute("BEGIN")
        try:
            yield
        finally:
            db.execute("COMMIT")

    def cached(self, user: int, below: Key | None, limit: int) -> list[Entry]:
        below = below if below is not None else TOP
        rows = self._conn().execute(
            "SELECT created_at, tweet_id, author_id FROM home_timeline WHERE user_id = ? "
            "AND (created_at, tweet_id) < (?, ?) ORDER BY created_at DESC, tweet_id DESC "
            "LIMIT ?", (user, below[0], below[1], limit)).fetchall()
        return [Entry(*row) for row in rows]

    def horizon(self, user: int) -> Key | None:
        row = self._conn().execute(
            "SELECT horizon_created_at, horizon_tweet_id FROM timeline_meta WHERE user_id = ?",
            (user,)).fetchone()
        return (row[0], row[1]) if row and row[0] >= 0 else None

    def celebrities_followed(self, user: int) -> list[int]:
        return self._column("SELECT celebrity_id FROM celebrity_follows WHERE user_id = ?", user)

    def followees(self, user: int) -> list[int]:
        return self._column("SELECT followee_id FROM follows WHERE follower_id = ?", user)

    def _column(self, sql: str, *args: object) -> list[int]:
        return [row[0] for row in self._conn().execute(sql, args)]

    def author_tweets(self, authors: Sequence[int], below: Key | None,
                      limit: int) -> list[Entry]:
        """The authors' newest ``limit`` entries below ``below``, merged as they stream.

        Each author's rows come off the index newest first, one cursor an author, and a
        merge takes the newest of them until ``limit``: the rows read are ``limit`` plus
        a few an author, not ``limit`` an author (a deep page of a reader following
        dozens of prolific authors read every one of them in full).
        """
        below = below if below is not None else TOP
        db = self._conn()
        streams = [_entries(db.execute(
            "SELECT created_at, tweet_id FROM author_tweets WHERE author_id = ? "
            "AND (created_at, tweet_id) < (?, ?) ORDER BY created_at DESC, tweet_id DESC "
            "LIMIT ?", (author, below[0], below[1], limit)), author) for author in authors]
        return list(islice(heapq.merge(*streams, reverse=True), limit))

    def recent_by_author(self, authors: Sequence[int], n: int) -> dict[int, list[Entry]]:
        out: dict[int, list[Entry]] = {a: [] for a in authors}
        for author, created_at, tweet_id in self._many(
                "SELECT author_id, created_at, tweet_id FROM (SELECT author_id, created_at, "
                "tweet_id, row_number() OVER (PARTITION BY author_id ORDER BY created_at DESC, "
                "tweet_id DESC) AS rank FROM author_tweets WHERE author_id IN ({})) "
                f"WHERE rank <= {int(n)} ORDER BY author_id, created_at DESC, tweet_id DESC",
                authors):
            out[author].append(Entry(created_at, tweet_id, author))
        return out

    def tweets(self, ids: Sequence[int]) -> dict[int, TweetRow]:
        return {r[0]: TweetRow(r[0], r[1], r[2], r[3], bool(r[4]), *r[5:]) for r in self._many(
            "SELECT tweet_id, author_id, created_at, text, deleted, reply_to, original_id, "
            "original_author, record, ref_id FROM tweets WHERE tweet_id IN ({})", ids)}

    def users(self, ids: Sequence[int]) -> dict[int, UserRow]:
        return {r[0]: UserRow(r[0], r[1], r[2], bool(r[3])) for r in self._many(
            "SELECT user_id, handle, name, deleted FROM users WHERE user_id IN ({})", ids)}

    def relations(self, user: int) -> Relations:
        rows = self._conn().execute(
            "SELECT other_id, relation FROM relations WHERE user_id = ?", (user,)).fetchall()
        return Relations(blocked=frozenset(o for o, r in rows if r in (BLOCK, BLOCKED_BY)),
                         muted=frozenset(o for o, r in rows if r == MUTE))

    def reposts_of(self, originals: Sequence[int], above: Mapping[int, Key] | None = None,
                   reader: int | None = None) -> dict[int, list[Entry]]:
        """With a ``reader``, the reposts by the reader's followees only.

        The follow edges are in this file, so they filter in the query: a viral tweet's
        thousands of reposts by strangers are never read out.
        """
        out: dict[int, list[Entry]] = {}
        by, args = ("", ()) if reader is None else (_BY_FOLLOWEES, (reader,))
        # `original_id != 0` spelled out: it lets SQLite use the partial index.
        rows = self._many(
            "SELECT original_id, created_at, tweet_id, author_id FROM tweets "
            f"WHERE original_id IN ({{}}) AND original_id != 0 AND deleted = 0{by} "
            "ORDER BY original_id, created_at DESC, tweet_id DESC", originals, args) \
            if not above else self._reposts_above(originals, above, by, args)
        for original, created_at, tweet_id, author in rows:
            out.setdefault(original, []).append(Entry(created_at, tweet_id, author))
        return out

    def _reposts_above(self, originals: Sequence[int], above: Mapping[int, Key], by: str,
                       args: tuple[int, ...]) -> list[tuple]:
        """Each original's reposts above its own bound: a range of the partial index each."""
        bounds = [(o, *above.get(o, (-1, -1))) for o in dict.fromkeys(originals)]
        out: list[tuple] = []
        for i in range(0, len(bounds), 160):  # 3 parameters an original, under 500
            chunk = bounds[i:i + 160]
            out.extend(self._conn().execute(
                "WITH b(o, c, t) AS (VALUES " + ",".join(["(?, ?, ?)"] * len(chunk)) + ") "
                "SELECT r.original_id, r.created_at, r.tweet_id, r.author_id "
                "FROM b JOIN tweets r ON r.original_id = b.o "
                f"WHERE r.original_id != 0 AND r.deleted = 0{by.replace('author_id', 'r.author_id')} "
                "AND (r.created_at, r.tweet_id) > (b.c, b.t) "
                "ORDER BY r.original_id, r.created_at DESC, r.tweet_id DESC",
                [v for row in chunk for v in row] + list(args)))
        return out

    def _many(self, sql: str, ids: Sequence[int], args: tuple[int, ...] = ()) -> list[tuple]:
        """``sql`` over ``ids`` in chunks of 500 (SQLite's parameter limit); order per chunk.

        ``args``: parameters after the ids'.
        """
        ids = list(dict.fromkeys(ids))
        out: list[tuple] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            out.extend(self._conn().execute(sql.format(",".join("?" * len(chunk))),
                                            [*chunk, *args]))
        return out

    def celebrities(self) -> list[int]:
        return self._column("SELECT author_id FROM celebrities ORDER BY author_id")

    def applied_offsets(self) -> dict[tuple[str, int], int]:
        rows = self._conn().execute('SELECT topic, partition, "offset" FROM applied_offsets')
        return {(t, p): o for t, p, o in rows}

    def version(self) -> StoreVersion:
        """The change feed (:class:`SQLiteFeed`), on a connection of its own."""
        if str(self.path).startswith((":memory:", "file::memory:")):
            return StoreVersion(self)  # another connection to :memory: is another database
        return SQLiteFeed(self)


    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        rows = self._conn().execute(
            'SELECT topic, partition, "offset", reason, raw, seen_at FROM dead_letters '
            'ORDER BY seen_at DESC, topic, partition, "offset" LIMIT ?', (limit,))
        return [DeadLetter(t, p, o, r, bytes(raw or b""), s) for t, p, o, r, raw, s in rows]

    def counts(self) -> dict[str, int]:
        db = self._conn()
        return {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in _TABLES}  # noqa: S608

    def home_users(self) -> list[int]:
        return self._column(
            "SELECT follower_id FROM follows UNION SELECT user_id FROM home_timeline "
            "UNION SELECT user_id FROM celebrity_follows ORDER BY 1")

    def batches(self, limit: int = 100) -> list[BatchInfo]:
        return [BatchInfo(*row) for row in self._conn().execute(
            "SELECT batch_id, finished_at, rows, seconds, max_event_time FROM batches "
            "ORDER BY batch_id DESC LIMIT ?", (limit,))]

    def dead_letter_count(self) -> int:
        # A scan of dead_letters only: bad records are few, unlike timeline rows.
        return int(self._conn().execute("SELECT count(*) FROM dead_letters").fetchone()[0])


class SQLiteFeed(ChangeFeed):
    """The ``page_changes`` rows the sink writes in each batch's transaction (DESIGN §7).

    :meth:`position` is the newest row's ``seq``, read only when ``PRAGMA
    data_version`` — on a connection of this object's own, a microsecond — says another
    connection committed since the last look; :meth:`since` reads the rows in between,
    and gives None when the trim took one of them (``seq`` has no gaps): the reader
    forgets everything. Questions are cheap, so every read asks (``fresh_s`` 0).
    """

    def __init__(self, store: SQLiteStore) -> None:
        super().__init__(store)
        self._db = sqlite3.connect(store.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._seen: int | None = None
        self._committed = 0

    def position(self) -> int:
        with self._lock:
            seen = self._db.execute("PRAGMA data_version").fetchone()[0]
            if seen != self._seen:
                # A commit since the last look (or a first look): read the newest row.
                # One landing between the two reads is seen again by the next call.
                self._seen = seen
                self._committed = self._db.execute(
                    "SELECT coalesce(max(seq), 0) FROM page_changes").fetchone()[0]
            return self._committed

    def since(self, seen: int | None, committed: int) -> list[tuple[int, Changes]] | None:
        if seen is None or committed < seen:
            return None  # a first look, or another file under the path
        with self._lock:
            rows = self._db.execute(_FEED_SINCE, (seen, committed)).fetchall()
        if len(rows) != committed - seen:
            return None  # trimmed past ``seen``: the feed cannot say what changed
        return [(seq, Changes(unpack_ids(homes), unpack_ids(authors), unpack_ids(tweets),
                              unpack_ids(users), bool(everything), unpack_ids(originals)))
                for seq, everything, homes, authors, tweets, users, originals in rows]

    def close(self) -> None:
        self._db.close()
