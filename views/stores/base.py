"""The store contract: what the sink writes and what the read path reads.

A store has three sides, each a small abstract class, so that every caller types
against the side it uses and none asks which backend it holds:

- :class:`TimelineReader`, what serving reads (a page's rows, the celebrities, the
  applied offsets), with the capabilities a server needs: whether reads are answered
  in process (:attr:`~TimelineReader.reads_in_process`) and the page caches' tokens
  (:meth:`~TimelineReader.page_versions`);
- :class:`ViewWriter`, what the view job writes through (:meth:`~ViewWriter.apply`,
  or the sink a backend builds for the job's checkpoint, :meth:`~ViewWriter.job_sink`);
- :class:`StoreAdmin`, what operators, metrics and ``verify`` read about the store
  itself (dead letters, the batch log, row counts, the users to check).

:class:`Store` is all three, with the lifecycle: constructors never touch the network
or the disk, :meth:`Store.open` does.

:meth:`ViewWriter.apply` does the fixed work for every backend — it folds a
micro-batch's deltas into a :class:`WritePlan` (netting, ordering, per-partition
offsets) and hands it to the backend's one I/O hook, :meth:`ViewWriter._write`, which
applies the plan atomically and idempotently and trims timelines to the cap. Backends
implement that hook and the read methods; nothing else.

Applying the same plan twice leaves the store as applying it once (every write is an
upsert or a delete keyed by its primary key), which is what makes a micro-batch
replayed after a crash invisible (DESIGN §4, exactly-once in effect).

**One author per tweet id.** DESIGN §3 has a tweet id name one tweet, so one author;
the join, partitioned by author, cannot see a second author post or repost an id
another author holds. Where that contract is broken, the id belongs to the earliest
*claim* by ``(created_at, author_id)`` (:func:`outranks`), whatever the arrival order:
a claim is a post or a repost, live or since deleted, of known time; a delete of a
tweet the join never saw (time 0) claims nothing. Each store's ``tweets`` row holds
the owner's claim (a plan nets claims within a batch, the store's write against the
stored row), and the read path serves an entry only as its row's author's
(:mod:`serving.visibility`): the other authors' fanned-out rows are never served.
Each such id gets a dead letter (:data:`ID_CONFLICTS`), counted like any other.
:class:`views.reference.Reference` states the same rule on the events.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import json
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

from views.delta import (
    TOP,
    Delta,
    DeltaKind,
    Key,
    timeline_removes,
    unpack_longs,
)
from views.stores.adds import Adds

if TYPE_CHECKING:
    from views.sink import Sink

#: The horizon of a *dormant* user's timeline: above every key, so every read of it is
#: evaluated at read time (exact) and no fan-out write lands in it. A user becomes
#: dormant when an entry arrives more than ``ViewWriter.inactive_ms`` after their newest
#: read (the ``activity`` log); their next read's record regenerates the cache.
DORMANT: Key = TOP


class Entry(NamedTuple):
    """One timeline entry: position and author."""

    created_at: int
    tweet_id: int
    author_id: int

    @property
    def key(self) -> Key:
        return (self.created_at, self.tweet_id)


#: An Entry from a (created_at, tweet_id, author_id) tuple, without the keyword handling
#: of its constructor: a store builds one per timeline row it reads.
as_entry: Callable[[tuple[int, int, int]], Entry] = functools.partial(tuple.__new__, Entry)


class TweetRow(NamedTuple):
    """A tweet or a repost: what hydration reads, and what a write plan writes.

    A post has ``original_id`` 0 and, if it is a reply, ``reply_to`` the user it
    answers. A repost has ``original_id``/``original_author`` and empty text;
    its ``deleted`` is "not shown" (undone or superseded, see ``views.join``), which
    unlike a post's delete may be lifted again by a later write.
    """

    tweet_id: int
    author_id: int
    created_at: int
    text: str
    deleted: bool
    reply_to: int = 0
    original_id: int = 0
    original_author: int = 0

    @property
    def is_repost(self) -> bool:
        return self.original_id != 0


class UserRow(NamedTuple):
    """A user's profile for hydration; a deleted account reads as ``deleted`` (DESIGN §4b)."""

    user_id: int
    handle: str
    name: str
    deleted: bool = False


class Relations(NamedTuple):
    """What one user's home timeline must leave out besides deletes (DESIGN §4b).

    ``blocked``: users this user blocks or is blocked by (blocks act both ways);
    ``muted``: users this user mutes (one way).
    """

    blocked: frozenset[int] = frozenset()
    muted: frozenset[int] = frozenset()


class HomeStart(NamedTuple):
    """What a home page reads before it knows any entry (:meth:`TimelineReader.home_start`)."""

    horizon: Key | None
    celebrities: list[int]
    relations: Relations
    #: The first cached entries asked for, newest first.
    cached: list[Entry]


class Hydrated(NamedTuple):
    """What :meth:`TimelineReader.hydrate` read: rows by id, reposts by original, followees."""

    tweets: dict[int, TweetRow]
    users: dict[int, UserRow]
    reposts: dict[int, list[Entry]]
    #: The reader's followees, when asked for.
    followees: list[int] | None = None


class RelationRow(NamedTuple):
    """A block or mute to write: ``user_id`` acts on ``other_id``; ``on`` sets, else clears."""

    user_id: int
    other_id: int
    relation: str
    on: bool
    created_at: int


class ProfileRow(NamedTuple):
    """A profile to write: the newest ``created_at`` wins in the store."""

    user_id: int
    handle: str
    name: str
    created_at: int

    @classmethod
    def of(cls, d: Delta) -> ProfileRow:
        """The profile a USER delta carries."""
        return cls(d.user_id, d.text or "", d.name or "", d.created_at)


class FollowRow(NamedTuple):
    """A follow edge to write: ``active`` upserts it, else deletes it."""

    follower_id: int
    followee_id: int
    created_at: int
    active: bool


class DeadRow(NamedTuple):
    """A dead letter to write (the store stamps when it saw it)."""

    topic: str
    partition: int
    offset: int
    reason: str
    raw: bytes | None


class DeadLetter(NamedTuple):
    """A changelog record that failed validation."""

    topic: str
    partition: int
    offset: int
    reason: str
    raw: bytes
    seen_at: int


class BatchInfo(NamedTuple):
    """One applied micro-batch, from the store's batch log (for metrics)."""

    batch_id: int
    finished_at: int
    rows: int
    seconds: float
    max_event_time: int


@dataclass
class WritePlan:
    """One micro-batch's deltas as typed rows, netted and in apply order (:meth:`ViewWriter.plan`)."""

    #: tweet_id → the tweet to write (``deleted``: hide it; ``created_at`` 0: not known)
    tweets: dict[int, TweetRow] = field(default_factory=dict)
    #: Deletes of an id that ``tweets`` holds a delete of under another author. Only the
    #: one by the author who posted the tweet hides it; the store knows who that is.
    foreign_deletes: list[TweetRow] = field(default_factory=list)
    #: (follower, followee) → the edge
    follows: dict[tuple[int, int], FollowRow] = field(default_factory=dict)
    #: (user, celebrity) → edge on
    celeb_edges: dict[tuple[int, int], bool] = field(default_factory=dict)
    #: author → on the celebrity path
    celebs: dict[int, bool] = field(default_factory=dict)
    users: dict[int, ProfileRow] = field(default_factory=dict)
    #: user → created_at of the account's deletion (final: later profiles never undo it)
    deleted_users: dict[int, int] = field(default_factory=dict)
    #: (user, other, relation) → the block or mute, last write wins
    relations: dict[tuple[int, int, str], RelationRow] = field(default_factory=dict)
    #: user → newest home-timeline read (what inactive users are derived from)
    activity: dict[int, int] = field(default_factory=dict)
    #: repost id → the repost, last write wins (``deleted`` = not shown; not final)
    reposts: dict[int, TweetRow] = field(default_factory=dict)
    wipes: set[tuple[int, int]] = field(default_factory=set)
    #: (user, tweet, created_at or 0 if unknown, author)
    removes: list[tuple[int, int, int, int]] = field(default_factory=list)
    #: (user, created_at, tweet, author), column-wise
    adds: Adds = field(default_factory=Adds)
    horizons: dict[int, Key] = field(default_factory=dict)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    max_event_time: int = 0
    dead: list[DeadRow] = field(default_factory=list)

    # -- one row each; the same precedence whatever order the rows come in ---------------
    def follow(self, follower: int, followee: int, created_at: int, on: bool) -> None:
        """A follow edge's newest event wins, an unfollow a tie (as in the join)."""
        key = (follower, followee)
        old = self.follows.get(key)
        if old is None or (created_at, not on) > (old.created_at, not old.active):
            self.follows[key] = FollowRow(follower, followee, created_at, on)

    def relation(self, row: RelationRow) -> None:
        """A block's or mute's newest event wins, the un-op a tie (as in the join)."""
        key = (row.user_id, row.other_id, row.relation)
        old = self.relations.get(key)
        if old is None or (row.created_at, not row.on) > (old.created_at, not old.on):
            self.relations[key] = row

    def profile(self, d: Delta) -> None:
        """A USER delta: an account deletion (final), else the newest profile."""
        if d.flag:
            self.deleted_users[d.user_id] = max(d.created_at,
                                                self.deleted_users.get(d.user_id, d.created_at))
            return
        old = self.users.get(d.user_id)
        if old is None or d.created_at >= old.created_at:
            self.users[d.user_id] = ProfileRow.of(d)

    def horizon(self, user: int, key: Key) -> None:
        self.horizons[user] = max(self.horizons.get(user, key), key)

    def read(self, user: int, at: int) -> None:
        """A home-timeline read (the ``activity`` log): the newest counts."""
        self.activity[user] = max(at, self.activity.get(user, -1))

    def offset(self, topic: str, partition: int, offset: int, event_time: int) -> None:
        where = (topic, partition)
        self.offsets[where] = max(self.offsets.get(where, -1), offset)
        self.max_event_time = max(self.max_event_time, event_time)

    def shows(self) -> bool:
        """Whether any page may read differently after this plan (the page version).

        Everything but the bookkeeping: applied offsets, dead letters and the read
        times of the ``activity`` log (a dormant reader's regenerated cache is the
        store's own business and counted there).
        """
        return any((self.tweets, self.follows, self.celeb_edges, self.celebs, self.users,
                    self.deleted_users, self.relations, self.reposts, self.wipes,
                    self.removes, self.adds, self.horizons))

    def rows(self) -> int:
        parts: tuple[Sized, ...] = (self.tweets, self.foreign_deletes, self.follows,
                                     self.celeb_edges, self.celebs,
                                     self.users, self.deleted_users, self.relations,
                                     self.reposts, self.activity, self.wipes, self.removes, self.adds,
                                     self.horizons, self.dead)
        return sum(len(part) for part in parts)


@dataclass(frozen=True)
class BatchStats:
    """What one :meth:`ViewWriter.apply` did."""

    batch_id: int
    deltas: int
    timeline_adds: int
    timeline_removes: int
    dead_letters: int
    seconds: float


#: A store's committed position, as :meth:`PageVersions.check` reports it.
Position = Hashable


class PageVersions:
    """Tokens that say whether a cached page's inputs changed (``serving.pagecache``).

    A page is a function of the store's committed rows. :meth:`check` asks the store
    what is committed now (one cheap question) and gives that position and the page's
    token; a page kept under a token is served again while :meth:`check` gives the
    same token. :meth:`keep` says whether a page rendered after ``check`` returned
    ``position`` may be kept: nothing was committed in between, so its contents are
    the token's. ``rows`` names every row the decision read, found or not (``("t",
    tweet_id)``, ``("u", user_id)``, ``("a", author_id)`` for an author's list of
    tweets), for backends whose tokens follow them.

    This default has one token for the whole store, the applied changelog offsets,
    which every micro-batch moves; backends that know more override it (SQLite: a
    version only page-visible writes move; Cassandra: per user, from the batches'
    change feed).
    """

    def __init__(self, store: TimelineReader) -> None:
        self.store = store

    def position(self) -> Position:
        """What the store has committed now."""
        return tuple(sorted(self.store.applied_offsets().items()))

    def check(self, kind: str, user: int) -> tuple[Position, Hashable]:
        """The committed position, and the token of ``kind``'s page of ``user`` there."""
        position = self.position()
        return position, position

    def keep_fresh(self) -> None:
        """Keep :meth:`check_now` answerable while pages are read (a server's tokens).

        This default has nothing to keep fresh.
        """

    def check_now(self, kind: str, user: int) -> tuple[Position, Hashable] | None:
        """:meth:`check`, if it can be answered without waiting on the store; else None.

        What lets a cached page be served on the event loop, with no worker thread, by a
        server whose store is read over the network. This default never can.
        """
        return None

    def keep(self, position: Position, kind: str, user: int,
             rows: Iterable[tuple[str, int]]) -> bool:
        """Whether a page rendered from ``position`` may be kept under its token."""
        return self.position() == position

    def reader(self, store: TimelineReader) -> TimelineReader:
        """What a page of ``store`` rendered for the page cache reads.

        ``store`` itself, or (for the store these tokens are of) a backend's reader that
        keeps rows across pages while the tokens say they stand (Cassandra:
        :class:`~views.stores.cassandra.changes.CachedRows`). Such a reader lags the
        store as a cached page does, by the backend's answer window: ``?after=`` reads
        do not go through it.
        """
        return store

    def close(self) -> None:
        """Release what the tokens hold (connections, indexes)."""


class TimelineReader(abc.ABC):
    """What serving reads: a page's rows, the celebrities, and how far the view has applied.

    Reads see committed rows only. Besides the reads, a reader declares what a server
    needs to know of it, so that no caller asks which backend it holds:
    :attr:`reads_in_process` and :meth:`page_versions`.
    """

    #: Whether reads are answered in this process in microseconds (no network), so a
    #: server may run them inline rather than on a worker thread.
    reads_in_process: bool = False

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        """Reads inside see one committed state (where the backend can offer it)."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def cached(self, user: int, below: Key | None, limit: int) -> list[Entry]:
        """Cached home entries of ``user`` with key < ``below``, newest first."""

    def home_start(self, user: int, below: Key | None, limit: int) -> HomeStart:
        """The reads a home page starts with, none of which needs another's answer.

        :meth:`horizon`, :meth:`celebrities_followed` and :meth:`relations` of ``user``,
        and :meth:`cached` ``(user, below, limit)``. A backend that pays a round trip
        per read issues them at once; this default reads them in turn.
        """
        return HomeStart(self.horizon(user), self.celebrities_followed(user),
                         self.relations(user), self.cached(user, below, limit))

    @abc.abstractmethod
    def horizon(self, user: int) -> Key | None:
        """The key below which ``user``'s cache may be incomplete (None: complete).

        :data:`DORMANT` for an inactive user: nothing of the cache is trusted.
        """

    @abc.abstractmethod
    def celebrities_followed(self, user: int) -> list[int]:
        """Celebrities ``user`` follows (merged at read time)."""

    @abc.abstractmethod
    def followees(self, user: int) -> list[int]:
        """Everyone ``user`` follows."""

    @abc.abstractmethod
    def author_tweets(self, authors: Sequence[int], below: Key | None,
                      limit: int) -> list[Entry]:
        """Live tweets of ``authors`` with key < ``below``, newest first, at most ``limit``."""

    def recent_by_author(self, authors: Sequence[int], n: int) -> dict[int, list[Entry]]:
        """Each author's newest ``n`` live tweets, newest first (backends batch this)."""
        return {a: self.author_tweets([a], None, n) for a in authors}

    @abc.abstractmethod
    def tweets(self, ids: Sequence[int]) -> dict[int, TweetRow]:
        """Tweets and reposts by id (deleted or hidden ones included, flagged)."""

    @abc.abstractmethod
    def users(self, ids: Sequence[int]) -> dict[int, UserRow]:
        """Profiles by id; a deleted account is a row with ``deleted`` set."""

    @abc.abstractmethod
    def relations(self, user: int) -> Relations:
        """The blocks (both ways) and mutes that filter ``user``'s home timeline."""

    @abc.abstractmethod
    def reposts_of(self, originals: Sequence[int], above: Mapping[int, Key] | None = None,
                   reader: int | None = None) -> dict[int, list[Entry]]:
        """Shown reposts of each original tweet, newest first (``author_id``: the reposter).

        Originals with none are left out. What the read path needs to keep one entry
        per original tweet (the newest appearance) across pages. ``above``: only the
        reposts whose key is above the original's key there (a page asks only for those
        newer than its own entry: a viral tweet's older reposts are not read).
        ``reader``: the store may leave out reposts by authors ``reader`` does not
        follow, where it can tell without another round trip (only a followee's repost
        shows on a home page; the caller filters by the followees anyway).
        """

    def hydrate(self, tweets: Sequence[int], users: Sequence[int], reposts: Mapping[int, Key],
                reader: int | None = None, followees: bool = False) -> Hydrated:
        """Tweets, profiles, reposts above bounds and the reader's followees, read together.

        :meth:`tweets`, :meth:`users`, :meth:`reposts_of` (``reposts``: each original's
        bound) and, with ``followees``, :meth:`followees` of ``reader``. What a page decides on once it has its entries' rows: one round trip on a store
        that can run them at once (Cassandra); in turn here.
        """
        return Hydrated(self.tweets(tweets) if tweets else {},
                        self.users(users) if users else {},
                        self.reposts_of(list(reposts), reposts, reader) if reposts else {},
                        self.followees(reader) if followees and reader is not None else None)

    @abc.abstractmethod
    def celebrities(self) -> list[int]:
        """Every author on the celebrity path."""

    @abc.abstractmethod
    def applied_offsets(self) -> dict[tuple[str, int], int]:
        """Highest applied offset per (logical topic, partition).

        Where the view stands: what an ``?after=`` read waits for, what ``verify`` and
        the health check report, and the default page token (:class:`PageVersions`).
        """

    def page_versions(self) -> PageVersions:
        """The page caches' validity tokens for this store (see :class:`PageVersions`).

        One per reading process, built after the store is opened; close it before the
        store.
        """
        return PageVersions(self)


class ReaderProxy(TimelineReader):
    """A :class:`TimelineReader` that passes every read to ``inner``; subclasses override some."""

    def __init__(self, inner: TimelineReader) -> None:
        self.inner = inner
        self.reads_in_process = inner.reads_in_process

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        return self.inner.snapshot()

    def cached(self, user: int, below: Key | None, limit: int) -> list[Entry]:
        return self.inner.cached(user, below, limit)

    def home_start(self, user: int, below: Key | None, limit: int) -> HomeStart:
        return self.inner.home_start(user, below, limit)

    def horizon(self, user: int) -> Key | None:
        return self.inner.horizon(user)

    def celebrities_followed(self, user: int) -> list[int]:
        return self.inner.celebrities_followed(user)

    def followees(self, user: int) -> list[int]:
        return self.inner.followees(user)

    def author_tweets(self, authors: Sequence[int], below: Key | None,
                      limit: int) -> list[Entry]:
        return self.inner.author_tweets(authors, below, limit)

    def recent_by_author(self, authors: Sequence[int], n: int) -> dict[int, list[Entry]]:
        return self.inner.recent_by_author(authors, n)

    def tweets(self, ids: Sequence[int]) -> dict[int, TweetRow]:
        return self.inner.tweets(ids)

    def users(self, ids: Sequence[int]) -> dict[int, UserRow]:
        return self.inner.users(ids)

    def relations(self, user: int) -> Relations:
        return self.inner.relations(user)

    def reposts_of(self, originals: Sequence[int], above: Mapping[int, Key] | None = None,
                   reader: int | None = None) -> dict[int, list[Entry]]:
        return self.inner.reposts_of(originals, above, reader)

    def hydrate(self, tweets: Sequence[int], users: Sequence[int], reposts: Mapping[int, Key],
                reader: int | None = None, followees: bool = False) -> Hydrated:
        return self.inner.hydrate(tweets, users, reposts, reader, followees)

    def celebrities(self) -> list[int]:
        return self.inner.celebrities()

    def applied_offsets(self) -> dict[tuple[str, int], int]:
        return self.inner.applied_offsets()

    def page_versions(self) -> PageVersions:
        return self.inner.page_versions()


class ViewWriter(abc.ABC):
    """What the view job writes through: one micro-batch of deltas at a time.

    :meth:`apply` does the fixed work (module docstring) and hands the plan to the
    backend's one I/O hook, :meth:`_write`. A backend that takes its writes another
    way builds its own sink for the job (:meth:`job_sink`).
    """

    #: Entries a user's cached timeline keeps; older ones are trimmed below a horizon.
    cap: int
    #: Inactive users (DESIGN §4b): a user whose newest read is older than this (in
    #: event time) than an entry meant for them gets no more fan-out writes until they
    #: read again (0: off). See :data:`DORMANT`.
    inactive_ms: int

    def apply(self, deltas: Iterable[Delta], batch_id: int = -1) -> BatchStats:
        """Apply one micro-batch of deltas atomically and idempotently."""
        start = time.perf_counter()
        plan = self.plan(deltas)
        self._write(plan, batch_id)
        return BatchStats(batch_id, plan.rows(), len(plan.adds), len(plan.removes),
                          len(plan.dead), time.perf_counter() - start)

    @staticmethod
    def plan(deltas: Iterable[Delta]) -> WritePlan:
        """Fold deltas into a plan: last write per row wins, deletes of tweets stick.

        Timeline changes apply as wipes, then removes, then adds. They need no netting
        here: a (user, tweet) pair only ever comes from the tweet's author's key, which
        the join already netted (and it cancelled any add a later wipe undoes).
        """
        plan = WritePlan()
        for d in deltas:
            fold(plan, d)
        return plan

    @abc.abstractmethod
    def _write(self, plan: WritePlan, batch_id: int) -> None:
        """Apply ``plan`` in one atomic step and trim touched timelines to ``cap``."""

    def job_sink(self, checkpoint: Path) -> Sink | None:
        """The sink the view job writes this store through, when the backend has its own.

        None (the default): the job's batches come to the driver and go through
        :meth:`apply` (``views.sink``, spooled). A backend that takes writes from
        many clients at once gives its own, bound to the job's ``checkpoint``.
        """
        return None


class StoreAdmin(abc.ABC):
    """What operators, metrics and ``verify`` read about the store rather than a page."""

    @abc.abstractmethod
    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest dead letters."""

    @abc.abstractmethod
    def dead_letter_count(self) -> int:
        """How many dead letters the store holds; read on every metrics scrape."""

    @abc.abstractmethod
    def batches(self, limit: int = 100) -> list[BatchInfo]:
        """The newest ``limit`` logged micro-batches, newest (highest batch_id) first.

        ``max_event_time`` is the newest event time applied in the batch (0: none),
        so view lag is now minus the largest of these. Read on every metrics scrape:
        must cost O(limit), not a table scan.
        """

    @abc.abstractmethod
    def counts(self) -> dict[str, int]:
        """Row counts per table (for summaries and metrics)."""

    @abc.abstractmethod
    def home_users(self) -> list[int]:
        """Users with at least one followee (what verify walks)."""


class Store(TimelineReader, ViewWriter, StoreAdmin):
    """A materialized-view store: its three sides and its lifecycle (module docstring)."""

    def __init__(self, cap: int = 800, inactive_days: float = 0.0) -> None:
        self.cap = cap
        self.inactive_ms = round(inactive_days * 86_400_000)

    @abc.abstractmethod
    def open(self) -> Store:
        """Connect and create the schema if needed; return self."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> Store:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def outranks(row: TweetRow, created_at: int | None, author_id: int | None) -> bool:
    """Whether ``row``'s claim owns its id over a stored one (module docstring).

    ``created_at`` None or 0: the stored row claims nothing (a delete of unknown time).
    A row of the stored author is that author's own update, never a rival claim.
    """
    if author_id is None or author_id == row.author_id or not created_at:
        return True
    return bool(row.created_at) and (row.created_at, row.author_id) < (created_at, author_id)


#: The dead letters' topic for tweet ids two authors claim: one letter per id (its
#: ``offset``), the first conflict seen; its raw record is both claims, as JSON.
ID_CONFLICTS: Final = "tweet-id-conflicts"


def id_conflict(tweet_id: int, one: tuple[int, int], other: tuple[int, int]) -> DeadRow:
    """The dead letter for ``tweet_id`` claimed as (created_at, author) ``one`` and ``other``."""
    (at, owner), (other_at, author) = sorted((one, other))
    reason = (f"tweet id {tweet_id} has two authors: {owner} (created_at {at}) and {author} "
              f"(created_at {other_at}); the earliest claim, {owner}'s, owns it, and "
              f"{author}'s records of it are not served")
    raw = json.dumps({"tweet_id": tweet_id,
                      "owner": {"author_id": owner, "created_at": at},
                      "other": {"author_id": author, "created_at": other_at}})
    return DeadRow(ID_CONFLICTS, 0, tweet_id, reason, raw.encode())


def stored_conflicts(plan: WritePlan,
                     stored: Mapping[int, tuple[int | None, int | None]]) -> list[DeadRow]:
    """Dead letters for the plan's claims on ids another author's stored claim holds.

    ``stored``: tweet id → (created_at, author_id) of its stored row (None: unknown).
    """
    out: list[DeadRow] = []
    seen = {d.offset for d in plan.dead if d.topic == ID_CONFLICTS}
    for row in (*plan.tweets.values(), *plan.reposts.values()):
        at, author = stored.get(row.tweet_id, (None, None))
        if row.created_at and at and author is not None and author != row.author_id \
                and row.tweet_id not in seen:
            out.append(id_conflict(row.tweet_id, (row.created_at, row.author_id), (at, author)))
    return out


def _rival(row: TweetRow, other: TweetRow | None) -> bool:
    """Whether ``other`` is another author's claim on ``row``'s id."""
    return other is not None and other.author_id != row.author_id and bool(other.created_at)


def _fold_tweet(plan: WritePlan, d: Delta) -> None:
    row = TweetRow(d.tweet_id, d.author_id, d.created_at, d.text or "", bool(d.flag),
                   reply_to=d.reply_to)
    old = plan.tweets.get(d.tweet_id)
    repost = plan.reposts.get(d.tweet_id)
    if row.created_at and repost is not None and _rival(row, repost):
        if not outranks(row, repost.created_at, repost.author_id):
            _lost(plan, row, repost)
            return
        del plan.reposts[d.tweet_id]
        _lost(plan, repost, row)
    if row.created_at and old is not None and _rival(row, old):
        if outranks(row, old.created_at, old.author_id):
            plan.tweets[d.tweet_id] = row
            _lost(plan, old, row)
        else:
            _lost(plan, row, old)
        return
    if old is not None and old.author_id != row.author_id and old.deleted and row.deleted:
        # Two deletes of one id under two authors, and no post of it in the batch: one
        # may be a forgery, and which is the store's to tell. Both are written; a
        # claim (a delete of known time) first, as the stronger fact.
        if row.created_at and not old.created_at:
            plan.tweets[d.tweet_id], row = row, old
        plan.foreign_deletes.append(row)
        return
    if old is not None and old.author_id != row.author_id and old.deleted != row.deleted:
        # A tweet id belongs to whoever posted it: a delete under another author's id
        # in the post's batch hides nothing (the stores apply the same rule across
        # batches), so the post is what this batch writes.
        if row.deleted:
            return
    elif old is not None:
        # A post and its delete in one batch: deleted wins, keep what is known.
        row = row._replace(deleted=old.deleted or row.deleted,
                           created_at=row.created_at or old.created_at,
                           text=row.text if old.deleted else old.text)
    plan.tweets[d.tweet_id] = row


def _lost(plan: WritePlan, row: TweetRow, owner: TweetRow) -> None:
    """A claim ``owner``'s outranks: a dead letter; its author's own rows go if deleted."""
    plan.dead.append(id_conflict(row.tweet_id, (owner.created_at, owner.author_id),
                                 (row.created_at, row.author_id)))
    if row.deleted and not row.is_repost:
        plan.foreign_deletes.append(row)


def _fold_remove(plan: WritePlan, d: Delta) -> None:
    plan.removes.extend(timeline_removes(d))


def _fold_add(plan: WritePlan, d: Delta) -> None:
    plan.adds.take(d)


def _fold_horizon(plan: WritePlan, d: Delta) -> None:
    key = (d.created_at, d.tweet_id)
    for user in unpack_longs(d.raw or b""):
        plan.horizon(user, key)


def _fold_offset(plan: WritePlan, d: Delta) -> None:
    plan.offset(d.topic or "", d.partition, d.offset, d.created_at)


def _fold_wipe(plan: WritePlan, d: Delta) -> None:
    # Adds from other keys for these users are other authors' tweets: kept.
    plan.wipes.update((user, d.author_id) for user in unpack_longs(d.raw or b""))


def _fold_follow(plan: WritePlan, d: Delta) -> None:
    pairs = unpack_longs(d.raw or b"")
    for follower, created_at in zip(pairs[::2], pairs[1::2], strict=True):
        plan.follow(int(follower), d.author_id, int(created_at), bool(d.flag))


def _fold_celeb_edge(plan: WritePlan, d: Delta) -> None:
    for user in unpack_longs(d.raw or b""):
        plan.celeb_edges[(user, d.author_id)] = bool(d.flag)


def _fold_dead(plan: WritePlan, d: Delta) -> None:
    plan.dead.append(DeadRow(d.topic or "", d.partition, d.offset, d.text or "", d.raw))


def _fold_repost(plan: WritePlan, d: Delta) -> None:
    row = TweetRow(d.tweet_id, d.author_id, d.created_at, "", not d.flag, 0, d.original_id,
                   d.original_author)
    for rivals in (plan.reposts, plan.tweets):
        other = rivals.get(d.tweet_id)
        if other is not None and _rival(row, other):
            if not outranks(row, other.created_at, other.author_id):
                _lost(plan, row, other)
                return
            del rivals[d.tweet_id]
            _lost(plan, other, row)
    plan.reposts[d.tweet_id] = row


def _fold_relation(plan: WritePlan, d: Delta) -> None:
    plan.relation(RelationRow(d.user_id, d.author_id, d.text or "", bool(d.flag),
                              d.created_at))


_FOLD = {
    DeltaKind.TL_ADD: _fold_add,
    DeltaKind.FANOUT: _fold_add,
    DeltaKind.BACKFILL: _fold_add,
    DeltaKind.TL_DEL: _fold_remove,
    DeltaKind.UNFANOUT: _fold_remove,
    DeltaKind.TL_WIPE: _fold_wipe,
    DeltaKind.HORIZON: _fold_horizon,
    DeltaKind.TWEET: _fold_tweet,
    DeltaKind.FOLLOW: _fold_follow,
    DeltaKind.CELEB_EDGE: _fold_celeb_edge,
    DeltaKind.CELEB: lambda p, d: p.celebs.__setitem__(d.author_id, bool(d.flag)),
    DeltaKind.USER: WritePlan.profile,
    DeltaKind.REPOST: _fold_repost,
    DeltaKind.ACTIVITY: lambda p, d: p.read(d.user_id, d.created_at),
    DeltaKind.RELATION: _fold_relation,
    DeltaKind.OFFSET: _fold_offset,
    DeltaKind.DEAD: _fold_dead,
}


def fold(plan: WritePlan, d: Delta) -> None:
    """One delta into ``plan``: every backend's write path folds through this."""
    _FOLD[DeltaKind(d.kind)](plan, d)
