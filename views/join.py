"""The incremental join of tweets and follows, as a pure per-author state machine.

Spark groups the changelogs by join key (the author) and hands each group's new
events to :func:`apply_batch` with that author's :class:`AuthorState`; the result is
the new state and the :class:`~views.delta.Delta` rows that bring the store in line.
No Spark, Kafka or database here, so it is tested directly (``tests/views/test_join.py``).

**Semantics (DESIGN §4).** The view is ``tweets ⋈ follows`` where both tables are a
function of the *set* of events seen, whatever their arrival order or duplication:

- a follower edge takes the op of its newest event by ``(created_at, op)``, with an
  unfollow winning a tie, so an unfollow seen before its follow still wins;
- a tweet is live once posted unless a delete for it (by its author) exists, in any
  order: the delete leaves a tombstone that a late post cannot pass.

Within a batch, events apply in ``(created_at, topic, offset)`` order, so a rerun over
the same input gives the same result.

**Lateness and bounded state** (DESIGN §4). With a lateness bound ``L``
(:attr:`JoinConfig.lateness`), a tweets- or follows-topic record is *late* when its
``created_at`` is more than ``L`` before the newest ``created_at`` of the same key
and topic at an earlier offset (the key's *mark* on that topic). A late record is a
dead letter with the reason ``late`` and changes nothing else. Offsets order one key's
records of one topic (they share a partition), so which records are late is a
function of the log alone, not of batches or of how partitions interleave, and
:class:`views.reference.Reference` applies the same rule. After a batch, state that
only defeats records older than ``mark - L`` is dropped (:func:`_prune`): no on-time
record can need it any more.

**Paths.** A normal author's posts are fanned out to each follower's cached timeline.
An author whose active follower count reaches ``promote_at`` becomes a celebrity
(checked once per batch, after its events): their tweets stay in ``author_tweets`` and
each follower gets a ``celebrity_follows`` edge, merged at read time. They return to
fan-out below ``demote_below`` (hysteresis, so a count wobbling at the threshold does
not flap). Both moves keep every timeline equal to the query.

**Recent tweets.** The state keeps an author's newest ``cap`` live tweets, enough to
fill a new follower's top ``cap``. When older live tweets exist (``evicted``), a
backfill also raises the follower's horizon there: the timeline below it is read
from ``author_tweets`` at read time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Final, NamedTuple

from ingest.events import FOLLOWS, KINDS, TOPIC_RANK, TWEETS, Event, Kind, Relation, encode
from views.delta import Delta, Key, pack
from views.row import event_fields, to_event

NO_KEY: Key = (-1, -1)
DAY_MS = 86_400_000
#: The default lateness bound: three days, in milliseconds (FANOUT_LATENESS_DAYS).
DEFAULT_LATENESS_MS = 3 * DAY_MS
#: A mark before any record (the smallest signed 64-bit value, as the codec stores it).
NO_MARK = -(2**63)
#: The topics whose records can be late, by rank: the ones whose state is pruned.
#: (Profiles and reads keep one value per key, so they need no bound.)
BOUNDED_RANKS = (TOPIC_RANK[FOLLOWS], TOPIC_RANK[TWEETS])
_TOPIC_OF_RANK = {rank: topic for topic, rank in TOPIC_RANK.items()}


@dataclass(frozen=True, slots=True)
class JoinConfig:
    """Cap and celebrity thresholds; ``demote_below`` ≤ ``promote_at``.

    ``lateness`` is the lateness bound in milliseconds (module docstring); None means
    no bound: no record is late and the state keeps every tombstone, undo and dead
    edge for good.
    """

    cap: int = 800
    promote_at: int = 1000
    demote_below: int = 800
    lateness: int | None = DEFAULT_LATENESS_MS

    def __post_init__(self) -> None:
        if (self.cap < 1 or not 0 < self.demote_below <= self.promote_at
                or (self.lateness is not None and self.lateness < 0)):
            msg = (f"invalid join config {self!r}: need cap ≥ 1, 0 < demote_below ≤ "
                   "promote_at, lateness ≥ 0 or None")
            raise ValueError(msg)

    @classmethod
    def with_ratio(cls, cap: int, promote_at: int, demote_ratio: float = 0.8,
                   lateness: int | None = DEFAULT_LATENESS_MS) -> JoinConfig:
        """Config that demotes below ``demote_ratio × promote_at`` (at least 1)."""
        return cls(cap, promote_at, max(1, int(promote_at * demote_ratio)), lateness)


@dataclass(slots=True)
class AuthorState:
    """Everything the join remembers about one key (an author, also a user)."""

    #: follower id → (created_at, active) of the edge's winning event.
    followers: dict[int, tuple[int, bool]] = field(default_factory=dict)
    #: The newest ``cap`` live tweets: tweet id → created_at.
    tweets: dict[int, int] = field(default_factory=dict)
    #: Deleted ids (posts or reposts), kept so a late or duplicated post stays deleted:
    #: id → the newest created_at of the delete and of the records of the id it
    #: defeated, which is when the tombstone may be dropped (:func:`_prune`).
    tombstones: dict[int, int] = field(default_factory=dict)
    #: Newest key of a live tweet no longer kept in ``tweets`` (NO_KEY if none).
    evicted: Key = NO_KEY
    celebrity: bool = False
    #: created_at of the newest profile applied (-1: none yet).
    profile_at: int = -1
    #: Every repost seen by this author: repost id → (created_at, original id, original author).
    reposts: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    #: This author's unreposts (final, like tombstones; a delete also undoes): repost
    #: id → the newest created_at of the unrepost and of the repost it undid.
    undone: dict[int, int] = field(default_factory=dict)
    #: Original tweet → the one repost of it shown now (see :func:`_settle_reposts`).
    shown: dict[int, int] = field(default_factory=dict)
    #: (acting user, "block" or "mute") → (created_at, on) of the winning event.
    relations: dict[tuple[int, str], tuple[int, bool]] = field(default_factory=dict)
    #: The account is deleted (final: later profiles are ignored).
    deleted: bool = False
    #: The newest created_at seen of this key's follows and tweets records (by topic
    #: rank, :data:`BOUNDED_RANKS`); NO_MARK before the first. Lateness is judged by them.
    marks: list[int] = field(default_factory=lambda: [NO_MARK, NO_MARK])
    #: Active followers (-1: not counted yet); derived, so not part of equality.
    active: int = field(default=-1, compare=False)

    def follower_count(self) -> int:
        if self.active < 0:
            self.active = sum(1 for _, on in self.followers.values() if on)
        return self.active

    def set_follower(self, user: int, created_at: int, active: bool) -> None:
        previous = self.followers.get(user)
        if self.active >= 0:
            self.active += int(active) - int(previous is not None and previous[1])
        self.followers[user] = (created_at, active)

    def active_followers(self) -> Iterator[int]:
        return (f for f, (_, active) in self.followers.items() if active)


class Change(NamedTuple):
    """One event, flattened, with its place in the log; sorts in apply order.

    Flat tuples rather than the ingest event objects: the processor builds one per
    record, and that construction cost showed in profiles. Every field but ``rank``
    is the source row's column of the same name (:mod:`views.row`), which is how the
    processor reads them.
    """

    created_at: int
    rank: int
    offset: int
    kind: int
    tweet_id: int = 0
    other_id: int = 0
    ref_id: int = 0
    text: str | None = None
    name: str | None = None
    partition: int = 0

    @classmethod
    def of(cls, event: Event, offset: int = 0, partition: int = 0) -> Change:
        """The change of an ingest event: the event columns of its source row."""
        kind, _key, created_at, tweet_id, other_id, ref_id, text, name = event_fields(event)
        return cls(created_at, TOPIC_RANK[event.topic], offset, kind, tweet_id, other_id,
                   ref_id, text, name, partition)


_ORDER = itemgetter(0, 1, 2)
#: Log order of one key's records: by topic, then offset.
_LOG_ORDER = itemgetter(1, 2)


class _Out:
    """Collects a batch's deltas and nets them per row.

    Timeline changes net per (user, tweet). All of them concern this author's tweets,
    so a wipe of user ``u`` cancels every pending add for ``u``; an add after the
    wipe is kept and the sink applies wipes before adds (``views.stores.base``).
    Follower edges and celebrity edges net per follower. At the end everything is
    packed (:func:`views.delta.pack`): one row per post, not one per follower.
    """

    def __init__(self, author: int) -> None:
        self.author = author
        self.home: dict[tuple[int, int], tuple[bool, int]] = {}
        #: user → tweets in ``home``, built at the first wipe: most batches have none,
        #: and keeping it on every add cost as much as the add.
        self.by_user: dict[int, set[int]] | None = None
        self.wipes: set[int] = set()
        self.edges: dict[int, tuple[bool, int]] = {}
        self.starred: dict[int, bool] = {}
        self.horizons: dict[int, Key] = {}
        self.other: list[Delta] = []
        #: Newest home-timeline read by this key's user in the batch (-1: none).
        self.read_at = -1
        #: Reposts remembered (or replaced by a smaller copy) in the batch: the store
        #: hears of each, shown or not, since the id is this author's claim.
        self.claimed: set[int] = set()

    def add(self, user: int, tweet: int, created_at: int) -> None:
        self.home[(user, tweet)] = (True, created_at)
        if self.by_user is not None:
            self.by_user.setdefault(user, set()).add(tweet)

    def add_all(self, user: int, tweets: dict[int, int]) -> None:
        """:meth:`add` of each (tweet, created_at) in ``tweets``."""
        self.home.update(((user, tweet), (True, at)) for tweet, at in tweets.items())
        if self.by_user is not None and tweets:
            self.by_user.setdefault(user, set()).update(tweets)

    def remove(self, user: int, tweet: int, created_at: int) -> None:
        self.home[(user, tweet)] = (False, created_at)
        if self.by_user is not None:
            self.by_user.setdefault(user, set()).add(tweet)

    def wipe(self, user: int) -> None:
        if self.by_user is None:
            self.by_user = {}
            for seen, tweet in self.home:
                self.by_user.setdefault(seen, set()).add(tweet)
        for tweet in self.by_user.pop(user, ()):
            del self.home[(user, tweet)]
        self.wipes.add(user)

    def edge(self, user: int, active: bool, created_at: int) -> None:
        self.edges[user] = (active, created_at)

    def star(self, user: int, on: bool) -> None:
        self.starred[user] = on

    def horizon(self, user: int, key: Key) -> None:
        self.horizons[user] = max(self.horizons.get(user, key), key)

    def emit(self, delta: Delta) -> None:
        self.other.append(delta)

    def deltas(self) -> list[Delta]:
        if self.read_at >= 0:
            self.other.append(Delta.activity(self.author, self.read_at))
        return self.other + pack(self.author, self.home, self.wipes, self.edges,
                                 self.starred, self.horizons)


def apply_batch(
    state: AuthorState | None, key: int, changes: Iterable[Change], config: JoinConfig
) -> tuple[AuthorState, list[Delta]]:
    """Apply one batch of ``key``'s changes; return the new state and the deltas."""
    state = state if state is not None else AuthorState()
    out = _Out(key)
    lateness = config.lateness
    if lateness is not None:
        changes = _on_time(state, key, changes, lateness, out)
    originals: set[int] = set()
    rules = _RULES
    for change in sorted(changes, key=_ORDER):
        rules[change.kind](state, key, change, config, out, originals)
    _settle_reposts(state, key, originals, config, out)
    _settle_path(state, key, config, out)
    if lateness is not None:
        _prune(state, lateness)
    return state, out.deltas()


def _on_time(state: AuthorState, key: int, changes: Iterable[Change], lateness: int,
             out: _Out) -> list[Change]:
    """The changes that are not late; each late one becomes a dead letter.

    Walks the key's records in log order (topic, offset), raising the key's mark on
    each topic as it goes, so a record is judged against the records before it in
    the log, whichever batch they came in.
    """
    marks = state.marks
    kept: list[Change] = []
    for change in sorted(changes, key=_LOG_ORDER):
        rank = change.rank
        if rank in BOUNDED_RANKS:
            mark = marks[rank]
            if change.created_at < mark - lateness:
                out.emit(_late(key, change, mark, lateness))
                continue
            if change.created_at > mark:
                marks[rank] = change.created_at
        kept.append(change)
    return kept


def _late(key: int, change: Change, mark: int, lateness: int) -> Delta:
    """The dead letter of a late record; its raw bytes are the event re-encoded."""
    topic = _TOPIC_OF_RANK[change.rank]
    event = to_event(change.kind, key, change.created_at, change.tweet_id, change.other_id,
                     change.ref_id, change.text, change.name)
    reason = (f"late: created_at {change.created_at} is more than {lateness} ms before "
              f"{mark}, the newest created_at of key {key} on {topic} before it")
    return Delta.dead_letter(topic, change.partition, change.offset, reason, encode(event)[1])


def _prune(state: AuthorState, lateness: int) -> None:
    """Drop what only defeats records older than the marks minus ``lateness``.

    Every later record of this key on a topic is either late (older than the floor:
    the mark minus ``lateness``, and marks only rise) or not older than the floor.
    A dead follow, block or mute edge older than the floor loses to any such record
    anyway. A tombstone or undo older than the floor only defeats copies of the
    records it already defeated (DESIGN §3: a duplicate is an exact copy, and a
    post or repost is not newer than its delete or undo), which are late now; the
    undone repost goes with it, since it can never be shown again.
    """
    follows_floor = state.marks[BOUNDED_RANKS[0]] - lateness
    tweets_floor = state.marks[BOUNDED_RANKS[1]] - lateness
    if len(state.followers) > state.follower_count():
        for user in [u for u, (at, on) in state.followers.items()
                     if not on and at < follows_floor]:
            del state.followers[user]
    if state.relations:
        for slot in [s for s, (at, on) in state.relations.items()
                     if not on and at < follows_floor]:
            del state.relations[slot]
    for dead in (state.tombstones, state.undone):
        if dead:
            for entry in [i for i, at in dead.items() if at < tweets_floor]:
                del dead[entry]
                state.reposts.pop(entry, None)


# -- the rules: one per kind of record, dispatched by _RULES; all take the same arguments;
# ``originals`` collects the original tweets whose shown repost the batch may change.

def _post(state: AuthorState, key: int, post: Change, cfg: JoinConfig, out: _Out,
          originals: set[int]) -> None:
    dead_at = state.tombstones.get(post.tweet_id)
    if dead_at is not None:
        # Deleted before it arrived: not shown, but the store learns its time, which
        # makes the id this author's claim (views.stores.base, one author per id).
        state.tombstones[post.tweet_id] = max(dead_at, post.created_at)
        out.emit(Delta.tweet_deleted(post.tweet_id, key, post.created_at))
        return
    if post.tweet_id in state.tweets or post.tweet_id in state.reposts:
        return
    out.emit(Delta.tweet(post.tweet_id, key, post.created_at, post.text, post.other_id,
                         post.kind, post.ref_id))
    _keep(state, post.tweet_id, post.created_at, cfg.cap)
    if not state.celebrity:
        for follower in state.active_followers():
            out.add(follower, post.tweet_id, post.created_at)


def _keep(state: AuthorState, tweet_id: int, created_at: int, cap: int) -> None:
    """Keep the tweet among the newest ``cap``; remember the newest one let go."""
    state.tweets[tweet_id] = created_at
    if len(state.tweets) > cap:
        oldest = min(state.tweets.items(), key=lambda item: (item[1], item[0]))
        del state.tweets[oldest[0]]
        state.evicted = max(state.evicted, (oldest[1], oldest[0]))


def _delete(state: AuthorState, key: int, delete: Change, cfg: JoinConfig, out: _Out,
            originals: set[int]) -> None:
    tweet_id = delete.tweet_id
    _undo(state, tweet_id, originals)  # a delete naming a repost undoes it
    dead_at = state.tombstones.get(tweet_id)
    if dead_at is not None:
        state.tombstones[tweet_id] = max(dead_at, delete.created_at)
        return
    # 0 = the tweet's time is not known here (evicted, or the post is yet to come).
    created_at = state.tweets.pop(tweet_id, 0)
    repost = state.reposts.get(tweet_id)
    state.tombstones[tweet_id] = max(delete.created_at, created_at,
                                     repost[0] if repost is not None else 0)
    out.emit(Delta.tweet_deleted(delete.tweet_id, key, created_at))
    if not state.celebrity:
        # The tweet may sit in any follower's cache, kept or not kept here.
        for follower in state.active_followers():
            out.remove(follower, delete.tweet_id, created_at)


def _follow(state: AuthorState, key: int, follow: Change, cfg: JoinConfig, out: _Out,
            originals: set[int]) -> None:
    user, active = follow.other_id, follow.kind == Kind.FOLLOW
    previous = state.followers.get(user)
    # Newest event wins; at equal times an unfollow wins (rank 1 > 0).
    if previous is not None and _edge_rank(previous) >= _edge_rank((follow.created_at, active)):
        return
    state.set_follower(user, follow.created_at, active)
    was_active = previous is not None and previous[1]
    if was_active == active:
        return
    out.edge(user, active, follow.created_at)
    if state.celebrity:
        out.star(user, active)
    elif active:
        _backfill(state, user, out)
    else:
        out.wipe(user)


def _edge_rank(edge: tuple[int, bool]) -> tuple[int, int]:
    return (edge[0], 0 if edge[1] else 1)


def _backfill(state: AuthorState, user: int, out: _Out) -> None:
    out.add_all(user, state.tweets)
    if state.evicted != NO_KEY:
        out.horizon(user, state.evicted)


def _repost(state: AuthorState, key: int, repost: Change, cfg: JoinConfig, out: _Out,
            originals: set[int]) -> None:
    """Remember the repost; which of a user's reposts of a tweet shows is settled per batch.

    Copies of one repost id count by their smallest (created_at, original, its
    author): a smaller copy replaces what was remembered, and if that version is shown
    it is hidden first, so that settling shows the new one in its place.
    """
    seen = state.reposts.get(repost.tweet_id)
    mine = (repost.created_at, repost.ref_id, repost.other_id)
    for dead in (state.tombstones, state.undone):
        dead_at = dead.get(repost.tweet_id)
        if dead_at is not None:
            dead[repost.tweet_id] = max(dead_at, repost.created_at)
    if seen is not None:
        if seen <= mine:
            return
        if state.shown.get(seen[1]) == repost.tweet_id:
            _show_repost(state, key, repost.tweet_id, False, cfg, out)
            del state.shown[seen[1]]
        originals.add(seen[1])
    state.reposts[repost.tweet_id] = mine
    originals.add(repost.ref_id)
    out.claimed.add(repost.tweet_id)


def _unrepost(state: AuthorState, key: int, unrepost: Change, cfg: JoinConfig, out: _Out,
              originals: set[int]) -> None:
    repost_id = unrepost.tweet_id
    _undo(state, repost_id, originals)
    seen = state.reposts.get(repost_id)
    state.undone[repost_id] = max(state.undone.get(repost_id, unrepost.created_at),
                                  unrepost.created_at, seen[0] if seen is not None else 0)


def _undo(state: AuthorState, entry_id: int, originals: set[int]) -> None:
    seen = state.reposts.get(entry_id)
    if seen is not None:
        originals.add(seen[1])


def _settle_reposts(state: AuthorState, key: int, originals: set[int], cfg: JoinConfig,
                    out: _Out) -> None:
    """Show, per original tweet touched, the author's one live repost of it.

    Of the reposts of a tweet not undone (by an unrepost or a delete naming it), the
    earliest by (created_at, id) is shown and the others are no-ops while it stands
    (DESIGN §4b: one live repost per user and tweet). Computed from everything seen,
    so arrival order does not matter; a late, earlier repost takes over from the
    one shown. A shown repost is an entry of this author, fanned out like a post.
    """
    if not originals:
        return
    live = live_reposts(state.reposts, state.undone.keys() | state.tombstones.keys(),
                        originals)
    for original in originals:
        new = live.get(original)
        old = state.shown.get(original)
        if new == old:
            continue
        if old is not None:
            _show_repost(state, key, old, False, cfg, out)
            del state.shown[original]
        if new is not None:
            _show_repost(state, key, new, True, cfg, out)
            state.shown[original] = new
    # A repost never shown (superseded or undone from the start) is still a claim on
    # its id (views.stores.base): the store hears of it, hidden.
    for repost in sorted(out.claimed):
        if state.shown.get(state.reposts[repost][1]) != repost:
            _show_repost(state, key, repost, False, cfg, out)


def live_reposts(reposts: dict[int, tuple[int, int, int]], undone: Set[int],
                 originals: set[int] | None = None) -> dict[int, int]:
    """Original → the repost of it to show: the earliest by (created_at, id) not undone.

    Only for ``originals`` when given. The one statement of the rule: the join settles
    with it, and the state codec derives ``AuthorState.shown`` with it.
    """
    best: dict[int, tuple[int, int]] = {}
    for rid, (at, original, _) in reposts.items():
        if ((originals is None or original in originals) and rid not in undone
                and (at, rid) < best.get(original, _NEVER)):
            best[original] = (at, rid)
    return {original: rid for original, (_, rid) in best.items()}


_NEVER = (2**63, 2**63)


def _show_repost(state: AuthorState, key: int, repost_id: int, shown: bool, cfg: JoinConfig,
                 out: _Out) -> None:
    created_at, original, original_author = state.reposts[repost_id]
    out.emit(Delta.repost(repost_id, key, created_at, (original, original_author), shown))
    if shown:
        _keep(state, repost_id, created_at, cfg.cap)
    else:
        state.tweets.pop(repost_id, None)
    if not state.celebrity:
        for follower in state.active_followers():
            if shown:
                out.add(follower, repost_id, created_at)
            else:
                out.remove(follower, repost_id, created_at)


#: (relation, on) of each kind of block or mute record, by code: its row of the table
#: of kinds.
_RELATIONS: Final[dict[int, tuple[str, bool]]] = {
    k.kind: (k.implied["relation"], k.implied["active"]) for k in KINDS if k.event is Relation}


def _relation(state: AuthorState, key: int, change: Change, cfg: JoinConfig, out: _Out,
              originals: set[int]) -> None:
    """A block or mute of this key by ``other_id``: the newest event wins, an un-op a tie."""
    relation, on = _RELATIONS[change.kind]
    slot = (change.other_id, relation)
    previous = state.relations.get(slot)
    if previous is not None and _edge_rank(previous) >= _edge_rank((change.created_at, on)):
        return
    state.relations[slot] = (change.created_at, on)
    if (previous is not None and previous[1]) != on:
        out.emit(Delta.relation(change.other_id, key, relation, on, change.created_at))


def _account_delete(state: AuthorState, key: int, change: Change, cfg: JoinConfig, out: _Out,
                    originals: set[int]) -> None:
    if not state.deleted:
        state.deleted = True
        out.emit(Delta.account_deleted(key, change.created_at))


def _profile(state: AuthorState, key: int, user: Change, cfg: JoinConfig, out: _Out,
             originals: set[int]) -> None:
    if state.deleted or user.created_at < state.profile_at:
        return
    state.profile_at = user.created_at
    out.emit(Delta.profile(key, user.created_at, user.text, user.name))


def _read(state: AuthorState, key: int, read: Change, cfg: JoinConfig, out: _Out,
          originals: set[int]) -> None:
    """A home-timeline read: the batch passes the newest on (inactive users)."""
    out.read_at = max(out.read_at, read.created_at)


Rule = Callable[[AuthorState, int, Change, JoinConfig, _Out, set[int]], None]


def _by_code(rules: Mapping[Kind, Rule]) -> list[Rule]:
    """``rules`` as a list indexed by kind code; every kind of record must have one."""
    missing = [k.kind.name for k in KINDS if k.kind not in rules]
    if missing:
        msg = f"no join rule for the record kind(s) {', '.join(missing)} (ingest.events.KINDS)"
        raise TypeError(msg)
    table: list[Rule] = [_no_event] * (max(rules) + 1)
    for kind, rule in rules.items():
        table[kind] = rule
    return table


def _no_event(state: AuthorState, key: int, change: Change, cfg: JoinConfig, out: _Out,
              originals: set[int]) -> None:
    msg = f"row kind {change.kind} carries no event: it never reaches the join"
    raise ValueError(msg)


#: The join's rule for each kind of record (``ingest.events.KINDS``), by code: what a new
#: kind adds to the join is a rule and its line here.
_RULES: Final = _by_code({
    Kind.POST: _post,
    Kind.DELETE: _delete,
    Kind.REPOST: _repost,
    Kind.UNREPOST: _unrepost,
    Kind.FOLLOW: _follow,
    Kind.UNFOLLOW: _follow,
    Kind.BLOCK: _relation,
    Kind.UNBLOCK: _relation,
    Kind.MUTE: _relation,
    Kind.UNMUTE: _relation,
    Kind.USER: _profile,
    Kind.USER_DELETE: _account_delete,
    Kind.ACTIVITY: _read,
})


def _settle_path(state: AuthorState, key: int, cfg: JoinConfig, out: _Out) -> None:
    """Move the author between fan-out and read-time merge, with hysteresis."""
    count = state.follower_count()
    if not state.celebrity and count >= cfg.promote_at:
        state.celebrity = True
        for follower in state.active_followers():
            out.wipe(follower)
            out.star(follower, True)
    elif state.celebrity and count < cfg.demote_below:
        state.celebrity = False
        for follower in state.active_followers():
            out.star(follower, False)
            _backfill(state, follower, out)
    else:
        return
    out.emit(Delta.celebrity(key, state.celebrity))
