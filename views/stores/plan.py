"""The write plan: one micro-batch's deltas folded into rows, netted, in apply order.

Every backend's write path folds through :func:`fold` into a :class:`WritePlan`
(:meth:`views.stores.contract.ViewWriter.plan`, and the Cassandra executor sink's
stages): a follow edge, block or mute is its newest event (the un-op winning a tie), a
profile the newest, an account deletion final, a tweet's delete sticks, rival claims
on an id netted by the id-claim rule, reads, horizons and offsets kept as maxima.

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

import json
from collections.abc import Mapping, Sized
from dataclasses import dataclass, field
from typing import Final

from views.delta import Delta, DeltaKind, Key, timeline_removes, unpack_longs
from views.stores.adds import Adds
from views.stores.rows import DeadRow, FollowRow, ProfileRow, RelationRow, TweetRow


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
                   reply_to=d.reply_to, record=d.record, ref_id=d.ref_id)
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
