"""Page-cache tokens, and the rows kept across pages (:mod:`serving.pagecache`).

A cached page is served again while its token stands. :class:`PageVersions` gives the
tokens; what it builds on is the store's to give
(:meth:`~views.stores.contract.TimelineReader.version`, :mod:`views.stores.versions`):
a version, one token for every page, or a change feed, from which
:class:`FeedVersions` keeps a token per page. :func:`page_versions` picks.

A page cache that asks "did anything change?" of a store-wide version drops every
page at every batch, and a batch lands every second or so under writes. A store that
keeps a change feed (Cassandra: a ``page_changes`` row per writer of a batch,
:mod:`views.stores.cassandra.changes`; SQLite: one per batch,
:class:`views.stores.sqlite.SQLiteFeed`) says more: the users whose home pages and the
authors whose own pages may read differently, and the tweet and user rows that changed.
:class:`FeedVersions` reads it in an API process. Each page read asks one cheap
question, the committed timestamp (one row); when it moved, the changes of the batches
in between are read and the pages they touch are forgotten: a home or own page by its
user, any page by the tweet and user rows and the authors' lists of tweets it was
decided on (registered by :meth:`FeedVersions.keep`: a celebrity's new post reaches no
follower's home by the fan-out, only the pages that read the celebrity's list). A
page's token is the timestamp of the last batch that touched it, within an *epoch*:
everything of an earlier epoch is forgotten wholesale (at start, after a gap the feed
cannot cover, when the keyspace went back in time, or when the indexes grow past their
bound). Activity records and trims touch no page: a page is a function of the query,
which neither changes.

**Rows across pages.** Tweet and profile rows change only by the batches that name
them in the feed (a delete, a repost shown or hidden, a profile, an account deleted),
so :meth:`FeedVersions.reader` gives the page renders a reader
(:class:`CachedRows`) that keeps the rows it read, up to :data:`MAX_ROWS` each, and
forgets each as soon as a batch taken in names it; a row read while a batch was being
taken in is not kept (it may predate that batch). It keeps two more answers the same
way. An original's shown reposts above a key (every page asks it of each entry, and a
tweet is on the pages of all its author's followers): a batch that shows, hides or
moves a repost names its original in the feed's ``originals``, which no page watches —
a repost that can change what a reader sees reaches that reader's page through its
timeline or its reposter's list of tweets. And a reader's followees (read when a page
holds a reply to a third user, or a newer appearance of an original): a batch that
writes a follow edge names its follower among the ``homes``. A page of 200 entries
whose tweets other pages read already costs only its ``home_start`` round.

Reads share questions: a read takes the last answer if it was asked for at most
``fresh_s`` before the read arrived (the store URL's ``page_fresh_ms``, 20 ms by
default; 0: only an answer asked for after it arrived), else waits for the next. The
store sees at most about one such request per process and window, not one per read,
and a cached page lags a commit by at most the window — on top of the second or so
a post takes to reach the store, and never for ``?after=`` reads, which bypass the
cache. An API process's tokens (:meth:`FeedVersions.keep_fresh`) ask again every half
window while pages are read (a read in the last two windows), from a thread of their
own, and never hold the indexes' lock over the network, so a cached page's token is
known without waiting (:meth:`FeedVersions.check_now`) and the page is served on the
event loop: two such requests a window per process while reads arrive, a few per read
when reads are sparse, none when idle.

**Shards.** A process given some feed shards (``FANOUT_FEED_SHARDS``,
:func:`views.stores.versions.shard` of the user) keeps tokens only for pages of users
in them, and reads only those shards' homes (Cassandra stores them per shard; the
rows every page may depend on — authors, tweets, profiles, originals — come from the
rows shard, read by all). A page of another user is served, rendered each time: its
token is new on every :meth:`FeedVersions.check`, and it is never kept; its reader's
followees are not kept either (the batch naming them may be another shard's). Its
stream is refused (:mod:`serving.stream`, 421 naming the shard). See docs/design.md §7,
*Scaling out*.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final

from views.delta import Key
from views.stores.contract import ReaderProxy, TimelineReader
from views.stores.rows import FLOOR, Entry, Hydrated, TweetRow, UserRow
from views.stores.versions import FEED_SHARDS, ChangeFeed, Changes, Shards, StoreVersion, shard

log = logging.getLogger(__name__)

#: Pages (and dependent ids) an API process indexes before forgetting everything.
MAX_INDEXED: Final = 500_000
#: Windows without a page read after which :meth:`FeedVersions.refresh` stops asking: a
#: read that arrives later would have found the answer stale anyway, so an isolated read
#: costs at most a few questions, not one every half window for a second.
REFRESH_IDLE_WINDOWS: Final = 2
#: Tweet or profile rows a :class:`CachedRows` keeps (each table) before forgetting them;
#: also the reposts, and the followees, it keeps (entries, all lists together).
MAX_ROWS: Final = 200_000
#: An original's reposts, or a reader's followees, are kept up to this many (a viral
#: tweet's or a prolific follower's list is read each time).
MAX_LIST: Final = 2_000

HOME: Final = "home"
OWN: Final = "tweets"


def page_versions(store: TimelineReader, shards: Shards = None) -> PageVersions:
    """The page caches' tokens for ``store``: per page from a change feed, else one.

    ``shards``: the feed shards this process keeps tokens for (None: all; only a change
    feed has shards, a store-wide version serves every page alike). One per reading
    process, built after the store is opened; close it before the store.
    """
    version = store.version()
    if isinstance(version, ChangeFeed):
        return FeedVersions(store, version.for_shards(shards), shards=shards)
    return PageVersions(store, version)


def describe_shards(shards: Shards) -> str:
    """``shards`` as a message names them."""
    return f"all {FEED_SHARDS}" if shards is None else \
        f"{', '.join(map(str, sorted(shards)))} of {FEED_SHARDS}"


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

    This one has one token for the whole store, its version
    (:class:`~views.stores.versions.StoreVersion`: the applied changelog offsets, as
    for an in-memory SQLite store); :class:`FeedVersions` keeps one per page from a
    store's change feed (SQLite's file, Cassandra).
    """

    def __init__(self, store: TimelineReader, version: StoreVersion | None = None) -> None:
        self.store = store
        self.version = version if version is not None else StoreVersion(store)

    def position(self) -> Position:
        """What the store has committed now."""
        return self.version.position()

    def check(self, kind: str, user: int) -> tuple[Position, Hashable]:
        """The committed position, and the token of ``kind``'s page of ``user`` there."""
        position = self.position()
        return position, position

    def keep_fresh(self) -> None:
        """Keep :meth:`check_now` answerable while pages are read (a server's tokens).

        This default has nothing to keep fresh.
        """

    def holds(self, user: int) -> bool:
        """Whether ``user``'s pages are kept and streamed here (in this process's shards)."""
        return True

    def shard_of(self, user: int) -> tuple[int, str]:
        """``user``'s feed shard, and what this process's shards are (for a message)."""
        return shard(user), describe_shards(None)

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
        :class:`CachedRows`). Such a reader lags the
        store as a cached page does, by the backend's answer window: ``?after=`` reads
        do not go through it.
        """
        return store

    def close(self) -> None:
        """Release what the tokens hold (the version's connection, indexes)."""
        self.version.close()


def _split(kept: Mapping[int, Any], ids: Sequence[int]) -> tuple[dict[int, Any], list[int]]:
    """The kept rows of ``ids``, and the ids (once each) not kept."""
    get = kept.get
    found = {i: row for i in ids if (row := get(i)) is not None}
    if len(found) == len(ids):  # all kept, none twice: the usual answer, one loop
        return found, []
    return found, [i for i in dict.fromkeys(ids) if i not in found]


def _above(entries: list[Entry], bound: Key) -> list[Entry]:
    """The entries (newest first) strictly above ``bound``: a prefix."""
    for i, e in enumerate(entries):
        if (e.created_at, e.tweet_id) <= bound:
            return entries[:i]
    return entries


class FeedVersions(PageVersions):
    """Per-page tokens kept current from the change feed (see the module docstring)."""

    def __init__(self, store: TimelineReader, feed: ChangeFeed,
                 clock: Callable[[], float] = time.monotonic, *, shards: Shards = None
                 ) -> None:
        super().__init__(store, feed)
        self.feed, self._clock, self.fresh_s = feed, clock, feed.fresh_s
        self.shards = shards
        # the homes the feed gives are ours already, unless it reads other shards too
        self._filter_homes = shards is not None and feed.shards != shards
        self._lock = threading.Lock()  # the indexes and kept rows; never held over the network
        self._asking = threading.Lock()  # one question to the store at a time
        self._last_read = -float("inf")  # when a page last asked for its token
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        self._seen: int | None = None  # the committed ts the indexes are current to
        self._asked: float | None = None  # when the newest answer's question was asked
        self._epoch = 0
        self._touched: dict[tuple[str, int], int] = {}
        self._watchers: dict[tuple[str, int], set[tuple[str, int]]] = {}
        self._tweets: dict[int, TweetRow] = {}
        self._users: dict[int, UserRow] = {}
        # original → (bound, its shown reposts strictly above the bound, newest first)
        self._reposts: dict[int, tuple[Key, list[Entry]]] = {}
        self._followees: dict[int, list[int]] = {}
        self._listed = 0  # entries in the kept lists (reposts and followees)
        self._generation = 0  # moves whenever a kept row may have gone stale
        self._reader = CachedRows(store, self)
        self.questions = self.catch_ups = self.resets = 0
        self.row_hits = self.row_misses = 0

    def position(self) -> Position:
        """The committed batch timestamp, the indexes brought up to it first.

        An answer asked for less than ``fresh_s`` before this call arrived is taken as
        current; otherwise the store is asked (one row), one question at a time.
        """
        return self._current(self.fresh_s)

    def refresh(self) -> None:
        """Ask the store again if the answer is half a window old and a page read lately.

        What :meth:`keep_fresh`'s thread does every half window: while reads arrive at
        least once in :data:`REFRESH_IDLE_WINDOWS` windows, the answer :meth:`check_now`
        needs is never older than the window; sparser reads ask for themselves.
        """
        if self._clock() - self._last_read <= self.fresh_s * REFRESH_IDLE_WINDOWS:
            self._current(self.fresh_s / 2)

    def keep_fresh(self) -> None:
        """Start a thread that calls :meth:`refresh` every half window, until :meth:`close`."""
        if self.fresh_s <= 0 or self._refresher is not None:
            return
        self._refresher = threading.Thread(target=self._refreshing, name="page-versions",
                                           daemon=True)
        self._refresher.start()

    def close(self) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join(timeout=5)

    def _refreshing(self) -> None:
        while not self._stop.wait(self.fresh_s / 2):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the store is down: reads ask, and say so
                log.debug("page versions: refresh failed", exc_info=True)

    def _current(self, max_age: float) -> Position:
        """The position, asking the store if the answer is older than ``max_age``."""
        arrived = self._clock()
        with self._asking:
            with self._lock:
                if self._asked is not None and self._asked >= arrived - max_age:
                    return self._seen
            asked = self._clock()
            committed = self._committed()
            rows = self._feed(committed)  # over the network: the indexes stay readable
            with self._lock:
                self._take_in(committed, rows)
                self._asked = asked
                return self._seen

    def holds(self, user: int) -> bool:
        return self.shards is None or shard(user) in self.shards

    def shard_of(self, user: int) -> tuple[int, str]:
        return shard(user), describe_shards(self.shards)

    def check(self, kind: str, user: int) -> tuple[Position, Hashable]:
        """The position, and the page's token: a new one each time outside our shards."""
        self._last_read = self._clock()
        position = self.position()
        if not self.holds(user):
            return position, object()  # equal to no kept token: rendered anew
        with self._lock:
            return position, (self._epoch, self._touched.get((kind, user), 0))

    def check_now(self, kind: str, user: int) -> tuple[Position, Hashable] | None:
        """:meth:`check` when the newest answer is within the window and no catch-up runs.

        None for a page outside our shards: it is never kept.
        """
        arrived = self._last_read = self._clock()
        if not self.holds(user) or not self._lock.acquire(blocking=False):
            return None
        try:
            if self._asked is None or self._asked < arrived - self.fresh_s:
                return None
            return self._seen, (self._epoch, self._touched.get((kind, user), 0))
        finally:
            self._lock.release()

    def keep(self, position: Position, kind: str, user: int,
             rows: Iterable[tuple[str, int]]) -> bool:
        """Keep (and watch its rows) only if no batch was taken in since ``position``.

        Never a page outside our shards.
        """
        if not self.holds(user):
            return False
        with self._lock:
            if position != self._seen:
                return False
            page = (kind, user)
            for row in rows:
                self._watchers.setdefault(row, set()).add(page)
            if len(self._watchers) > MAX_INDEXED:
                self._reset()
            return True

    def reader(self, store: TimelineReader) -> TimelineReader:
        """:class:`CachedRows` over a network store; a store read in process itself.

        Rows read in process cost microseconds, and are read in a snapshot
        (``TimelineReader.snapshot``) that may predate a batch already taken in, so
        keeping them would need the snapshot's position. A store whose rows are not the
        same for every reader (``rows_shared`` false: SQLite's ``reposts_of`` lists the
        reader's followees' reposts only) reads itself however it is read, as a list
        kept for every reader must not hold one reader's answer.
        """
        if store is not self.store or store.reads_in_process or not store.rows_shared:
            return store
        return self._reader

    def hydrate(self, tweets: Sequence[int], users: Sequence[int], reposts: Mapping[int, Key],
                reader: int | None, followees: bool, fetch: Callable[..., Hydrated]
                ) -> Hydrated:
        """:meth:`TimelineReader.hydrate` from what is kept; the rest by one ``fetch``.

        A kept list of reposts answers a bound at or above its own. What is fetched is
        kept only if no batch was taken in while it was read (and a list of reposts only
        if no list with a lower bound is kept already). ``fetch``'s answers must not
        depend on the reader (the Cassandra store's do not).
        """
        want_followees = followees and reader is not None
        # a reader of another shard: the batch that changes its followees is not read here
        keep_followees = want_followees and self.holds(reader)  # type: ignore[arg-type]
        with self._lock:
            got_t, ask_t = _split(self._tweets, tweets)
            got_u, ask_u = _split(self._users, users)
            got_r: dict[int, list[Entry]] = {}
            ask_r: dict[int, Key] = {}
            for o, bound in reposts.items():
                kept = self._reposts.get(o)
                if kept is None or bound < kept[0]:
                    ask_r[o] = bound
                elif kept[1] and (newer := _above(kept[1], bound)):
                    got_r[o] = newer
            kept_f = self._followees.get(reader) if keep_followees else None  # type: ignore[arg-type]
            ask_f = want_followees and kept_f is None
            asked = len(ask_t) + len(ask_u) + len(ask_r) + ask_f
            self.row_misses += asked
            self.row_hits += len(got_t) + len(got_u) + len(reposts) - len(ask_r) \
                + (kept_f is not None)
            generation = self._generation
        if not asked:
            return Hydrated(got_t, got_u, got_r, kept_f)
        read = fetch(ask_t, ask_u, ask_r, reader, ask_f)
        with self._lock:
            if generation == self._generation:
                self._keep_rows(self._tweets, read.tweets)
                self._keep_rows(self._users, read.users)
                for o, bound in ask_r.items():
                    found, kept = read.reposts.get(o, []), self._reposts.get(o)
                    if len(found) <= MAX_LIST and (kept is None or bound < kept[0]):
                        self._keep_list(self._reposts, o, (bound, found), len(found))
                if ask_f and keep_followees and read.followees is not None \
                        and len(read.followees) <= MAX_LIST:
                    self._keep_list(self._followees, reader, read.followees,  # type: ignore[arg-type]
                                    len(read.followees))
        return Hydrated({**got_t, **read.tweets}, {**got_u, **read.users},
                        {**got_r, **read.reposts}, kept_f if kept_f is not None else read.followees)

    @staticmethod
    def _keep_rows(kept: dict[int, Any], fetched: Mapping[int, Any]) -> None:
        if len(kept) + len(fetched) > MAX_ROWS:
            kept.clear()
        kept.update(fetched)

    def _keep_list(self, lists: dict[int, Any], key: int, value: Any, size: int) -> None:
        """Keep one list (the lock held), every list forgotten first if over the bound."""
        self._drop_list(lists, key)
        if self._listed + size + 1 > MAX_ROWS:
            self._reposts.clear()
            self._followees.clear()
            self._listed = 0
        self._listed += size + 1
        lists[key] = value

    def _drop_list(self, lists: dict[int, Any], key: int) -> None:
        value = lists.pop(key, None)
        if value is not None:
            self._listed -= len(value[1] if lists is self._reposts else value) + 1

    def _committed(self) -> int:
        self.questions += 1
        return self.feed.position()

    def _feed(self, committed: int) -> list[tuple[int, Changes]] | None:
        """The changes of the batches in (seen, committed]; None if the feed cannot cover them."""
        seen = self._seen  # written only while _asking is held, as it is here
        return [] if committed == seen else self.feed.since(seen, committed)

    def _take_in(self, committed: int, changes: list[tuple[int, Changes]] | None) -> None:
        """Take in the batches :meth:`_feed` read (the lock held); forget everything if None."""
        if changes is None:
            self._reset()
        elif committed != self._seen:
            self.catch_ups += 1
            for ts, batch in changes:
                self._take(ts, batch)
        self._seen = committed

    def _take(self, ts: int, changes: Changes) -> None:
        if changes.everything:
            self._reset()
            return
        homes, authors = changes.homes, changes.authors
        if self._filter_homes:
            homes = frozenset(u for u in homes if self.holds(u))
        if changes.tweets or changes.users or changes.originals or homes:
            self._generation += 1
            for t in changes.tweets:
                self._tweets.pop(t, None)
            for u in changes.users:
                self._users.pop(u, None)
            for o in changes.originals:
                self._drop_list(self._reposts, o)
            for u in homes:  # a follow edge written names its follower here
                self._drop_list(self._followees, u)
        pages = [(HOME, u) for u in homes]
        pages += [(OWN, a) for a in authors if self.shards is None or self.holds(a)]
        for row in (*(("t", t) for t in changes.tweets), *(("u", u) for u in changes.users),
                    *(("a", a) for a in changes.authors)):
            pages += self._watchers.pop(row, ())
        for page in pages:
            self._touched[page] = ts
        if len(self._touched) > MAX_INDEXED:
            self._reset()

    def _reset(self) -> None:
        """Every page kept so far is stale: a new epoch, and the indexes dropped."""
        self.resets += 1
        self._epoch += 1
        self._generation += 1
        self._touched.clear()
        self._watchers.clear()
        self._tweets.clear()
        self._users.clear()
        self._reposts.clear()
        self._followees.clear()
        self._listed = 0


class CachedRows(ReaderProxy):
    """The store, with rows, reposts and followees kept across pages by :class:`FeedVersions`."""

    def __init__(self, inner: TimelineReader, versions: FeedVersions) -> None:
        super().__init__(inner)
        self.versions = versions

    def hydrate(self, tweets: Sequence[int], users: Sequence[int], reposts: Mapping[int, Key],
                reader: int | None = None, followees: bool = False) -> Hydrated:
        return self.versions.hydrate(tweets, users, reposts, reader, followees,
                                     self.inner.hydrate)

    def tweets(self, ids: Sequence[int]) -> dict[int, TweetRow]:
        return self.hydrate(ids, (), {}).tweets

    def users(self, ids: Sequence[int]) -> dict[int, UserRow]:
        return self.hydrate((), ids, {}).users

    def reposts_of(self, originals: Sequence[int], above: Mapping[int, Key] | None = None,
                   reader: int | None = None) -> dict[int, list[Entry]]:
        bounds = above or {}
        return self.hydrate((), (), {o: bounds.get(o, FLOOR) for o in originals}, reader).reposts

    def followees(self, user: int) -> list[int]:
        return self.hydrate((), (), {}, user, followees=True).followees or []
