"""What users do besides posting, drawn along the follow graph (DESIGN §4b records).

A :class:`RecordMix` says how much of each record a synthetic history holds; :func:`draw`
makes the replies, reposts, blocks, mutes and account deletions of one history, given
its follow graph and the original posts already drawn, in index space (user ``i`` is
``ids[i]``, post ``j`` is row ``j`` of :class:`Posts`). ``ingest.generator`` turns the
result into events and gives the tweets-topic records their snowflake ids.

The model, each act at a time ``t`` by a user who still has an account then, toward
users who still have one (a deleted account never acts again, and nobody replies to,
reposts or blocks it afterwards; follows drawn before stay as drawn, and the view
ignores those, DESIGN §4b):

- A *reply* answers a post by a followee (a follow edge live at ``t``, the post made
  before ``t`` and not deleted by then, one of that followee's latest few), or answers
  a reply addressed to the replier (a back-and-forth, up to three deep, minutes later).
- A *repost* takes an entry that the reposter's home timeline would show: a post or a
  repost by a followee, recent, still up; a repost of a repost reposts the original
  (cascades travel along the graph). Nobody reposts their own tweet or one tweet
  twice. Some reposts are undone later, by an ``unrepost`` or, a third of them, by a
  tweets-topic ``delete`` naming the repost id (both are undos, DESIGN §4b).
- A *block* or *mute* is aimed at a replier (someone who replied to the user), a
  followee, or now and then a stranger; some are undone later.
- An *account deletion* picks a user with followers, after the last thing they did.

Actors are drawn by the number of accounts they follow (who follows more reads and
shares more). Everything comes from the ``rng`` passed in, so a seed fixes the result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Final

import numpy as np

log = logging.getLogger(__name__)

#: "Never" in a time column (not deleted, not undone, not unfollowed).
NEVER: Final = np.iinfo(np.int64).max
#: Share of a user's undos of a repost made as a tweets-topic ``delete``.
UNDO_BY_DELETE: Final = 1 / 3
#: Replies that answer a reply addressed to their author, at depth 2 and 3.
ANSWER_SHARE: Final = 0.4
ANSWER_DEPTHS: Final = (0.6, 0.4)
#: Mean delay of an answer in a conversation, and of a block or mute after a reply (ms).
ANSWER_DELAY_MS: Final = 20 * 60_000
REACTION_DELAY_MS: Final = 60 * 60_000
#: Recency: how many of a followee's entries back the one picked is, ~ geometric.
RECENCY_P: Final = 0.35
REPOST_ROUNDS: Final = 3
#: Whom blocks and mutes aim at: (repliers, followees, strangers). Modelling
#: assumptions: no public figures break blocks down by target.
BLOCK_TARGETS: Final = (0.6, 0.25, 0.15)
MUTE_TARGETS: Final = (0.3, 0.6, 0.1)
_BATCHES: Final = 12

Rows = dict[str, np.ndarray]


@dataclass(frozen=True)
class RecordMix:
    """How much of each record a generated history holds, relative to its posts.

    ``replies``: share of the posts that are replies. ``reposts``, ``blocks``,
    ``mutes``: per post. ``*_ratio``: share of those undone later.
    ``account_deletes``: share of the users whose account is deleted.
    """

    replies: float = 0.0
    reposts: float = 0.0
    unrepost_ratio: float = 0.0
    blocks: float = 0.0
    mutes: float = 0.0
    unblock_ratio: float = 0.0
    unmute_ratio: float = 0.0
    account_deletes: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            limit = 1.0 if f.name == "replies" or f.name.endswith(("_ratio", "_deletes")) else None
            if not value >= 0 or (limit is not None and not value < limit):
                msg = f"{f.name} must be in [0, {limit or 'inf'}), got {value}"
                raise ValueError(msg)

    @property
    def posts_only(self) -> bool:
        """No record of DESIGN §4b: a history as before them (posts, deletes, follows)."""
        return not any(getattr(self, f.name) for f in fields(self))


#: Posts, deletes, follows and unfollows only: histories from before DESIGN §4b,
#: byte for byte (the social records draw from a random stream of their own).
POSTS_ONLY: Final = RecordMix()
#: Reposts and replies from Pew Research Center, "The Behaviors and Attitudes of U.S.
#: Adults on Twitter" (2021; summed up in "10 facts about Americans and Twitter", 2022):
#: of the tweets of the most active quarter of users, who send 97% of all tweets, 46%
#: are retweets and 30% replies, so about 24% are original tweets (quote tweets
#: included). Hence 30/54 = 0.55 of posts are replies and 46/54 = 0.85 reposts per post.
#: Blocks, mutes, undos and account deletions: no public per-post rate; these are
#: assumptions that keep them rare (one block per 500 posts, one mute per 1,000, 0.2%
#: of accounts deleted over the history), which is what the issue asks of them.
SOCIAL: Final = RecordMix(replies=0.55, reposts=0.85, unrepost_ratio=0.03, blocks=0.002,
                          mutes=0.001, unblock_ratio=0.1, unmute_ratio=0.2,
                          account_deletes=0.002)
MIXES: Final = {"posts": POSTS_ONLY, "social": SOCIAL}


@dataclass
class Graph:
    """Follow edges by user index: ``follower[i]`` follows ``followee[i]`` in ``[since, until)``."""

    users: int
    follower: np.ndarray
    followee: np.ndarray
    since: np.ndarray
    until: np.ndarray

    def __post_init__(self) -> None:
        order = np.argsort(self.follower, kind="stable")
        self._by_follower = order
        self._start = np.searchsorted(self.follower[order], np.arange(self.users + 1))
        self.out_degree = np.diff(self._start)
        self.in_degree = np.bincount(self.followee, minlength=self.users)

    def actors(self, m: int, rng: np.random.Generator) -> np.ndarray:
        """``m`` users drawn by how many accounts they follow."""
        return rng.choice(self.users, size=m, p=self.out_degree / self.out_degree.sum())

    def edge_of(self, users: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One out-edge of each of ``users`` (who all follow someone), uniformly."""
        offset = (rng.random(len(users)) * self.out_degree[users]).astype(np.int64)
        return self._by_follower[self._start[users] + offset]


@dataclass
class Posts:
    """Posts by index: ``author``, ``time``, ``deleted_at`` (NEVER), ``reply_to`` (-1)."""

    author: np.ndarray
    time: np.ndarray
    deleted_at: np.ndarray
    reply_to: np.ndarray

    def __len__(self) -> int:
        return len(self.author)


@dataclass
class Social:
    """What :func:`draw` made: replies, reposts, relations and deleted accounts."""

    replies: Posts
    reposts: Rows    # actor, time, original (post index), undone_at, by_delete
    relations: Rows  # actor, target, time, mute (0 block, 1 mute), undone_at
    gone: Rows       # user, time


class Timeline:
    """Entries by actor and time, to find a user's latest entries before a moment."""

    def __init__(self, actor: np.ndarray, time: np.ndarray, lo: int, span: int) -> None:
        self.span, self.lo = span, lo
        keys = actor.astype(np.int64) * span + (time - lo)
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]

    def recent(self, users: np.ndarray, t: np.ndarray, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
        """(entry, found): one of each user's latest entries strictly before ``t``."""
        first = np.searchsorted(self.keys, users * self.span)
        before = np.searchsorted(self.keys, users * self.span + (t - self.lo)) - first
        back = np.minimum(rng.geometric(RECENCY_P, len(users)) - 1, np.maximum(before - 1, 0))
        if not len(self.order):
            return np.zeros(len(users), dtype=np.int64), np.zeros(len(users), dtype=bool)
        return self.order[np.where(before > 0, first + before - 1 - back, 0)], before > 0


def draw(mix: RecordMix, graph: Graph, originals: Posts, n_posts: int,
         rng: np.random.Generator, window: tuple[int, int], delete_ratio: float) -> Social:
    """The social records of a history whose ``originals`` are drawn (see module doc).

    ``n_posts`` is the history's post budget: ``originals`` plus the replies to draw.
    """
    lo, hi = window
    if graph.users * (hi - lo) >= 2**62:
        msg = "too many users for the time window to index entries by (user, time)"
        raise ValueError(msg)
    ctx = _Context(graph, rng, lo, hi, delete_ratio)
    gone = ctx.delete_accounts(round(graph.users * mix.account_deletes), originals)
    replies = ctx.replies(n_posts - len(originals), originals)
    reposts = ctx.reposts(round(n_posts * mix.reposts), concat(originals, replies),
                          mix.unrepost_ratio)
    relations = _concat_rows(
        ctx.relations(round(n_posts * mix.blocks), 0, BLOCK_TARGETS, replies, mix.unblock_ratio),
        ctx.relations(round(n_posts * mix.mutes), 1, MUTE_TARGETS, replies, mix.unmute_ratio))
    return Social(replies, reposts, relations, gone)


class _Context:
    """The graph, the random stream, the window and who is gone when, shared by the steps."""

    def __init__(self, graph: Graph, rng: np.random.Generator, lo: int, hi: int,
                 delete_ratio: float) -> None:
        self.graph, self.rng, self.lo, self.hi = graph, rng, lo, hi
        self.delete_ratio = delete_ratio
        self.gone = np.full(graph.users, NEVER, dtype=np.int64)
        self.can_follow = graph.out_degree.sum() > 0

    # -- account deletions -------------------------------------------------------------
    def delete_accounts(self, n: int, originals: Posts) -> Rows:
        """``n`` users with followers, each deleted after the last thing they did."""
        g = self.graph
        last = np.full(g.users, self.lo - 1, dtype=np.int64)
        np.maximum.at(last, originals.author, originals.time)
        deleted = originals.deleted_at != NEVER
        np.maximum.at(last, originals.author[deleted], originals.deleted_at[deleted])
        np.maximum.at(last, g.follower, np.where(g.until == NEVER, g.since, g.until))
        candidates = np.flatnonzero((g.in_degree > 0) & (last < self.hi - 2))
        users = np.sort(self.rng.choice(candidates, size=min(n, len(candidates)),
                                        replace=False))
        _short("account deletions", n, len(users))
        times = _later(last[users], np.full(len(users), self.hi), self.rng)
        self.gone[users] = times
        return {"user": users, "time": times}

    # -- replies -----------------------------------------------------------------------
    def replies(self, n: int, originals: Posts) -> Posts:
        """``n`` replies: to followees' posts, and answers to replies (conversations)."""
        answers = round(n * ANSWER_SHARE) if self.can_follow else 0
        timeline = Timeline(originals.author, originals.time, self.lo, self.hi - self.lo)
        direct = self._direct_replies(n - answers, timeline, originals)
        rounds, previous = [direct], direct
        for share in ANSWER_DEPTHS:
            previous = self._answers(round(answers * share), previous)
            rounds.append(previous)
        made = concat(*rounds)
        if len(made) < n:  # too few conversations to answer: reply to followees instead
            made = concat(made, self._direct_replies(n - len(made), timeline, originals))
        _short("replies", n, len(made))
        return made

    def _direct_replies(self, n: int, timeline: Timeline, originals: Posts) -> Posts:
        def batch(m: int) -> Rows:
            u, t, f, ok = self._followee_at(m)
            post, found = timeline.recent(f, t, self.rng)
            ok &= found & (originals.deleted_at[post] > t)
            return {"author": u[ok], "time": t[ok], "to": f[ok]}

        rows = _collect(n, batch) if n and self.can_follow and len(originals) else _no_rows(
            "author", "time", "to")
        return self._posts(rows)

    def _answers(self, n: int, replies: Posts) -> Posts:
        def batch(m: int) -> Rows:
            r = self.rng.integers(0, len(replies), m)
            author, to = replies.reply_to[r], replies.author[r]
            t = replies.time[r] + 1 + self.rng.exponential(ANSWER_DELAY_MS, m).astype(np.int64)
            ok = (t < self.hi) & (replies.deleted_at[r] > t)
            ok &= (self.gone[author] > t) & (self.gone[to] > t)
            return {"author": author[ok], "time": t[ok], "to": to[ok], "reply": r[ok]}

        if not n or not len(replies):
            return self._posts(_no_rows("author", "time", "to"))
        return self._posts(_collect(n, batch, key="reply"))

    def _posts(self, rows: Rows) -> Posts:
        """Replies from rows, some deleted later by their authors (``delete_ratio``)."""
        order = np.argsort(rows["time"], kind="stable")
        author, time = rows["author"][order], rows["time"][order]
        return Posts(author, time, self._undo(time, author, self.delete_ratio),
                     rows["to"][order])

    # -- reposts -----------------------------------------------------------------------
    def reposts(self, n: int, posts: Posts, undo_ratio: float) -> Rows:
        """``n`` reposts of entries the reposters' home timelines show, in cascades."""
        made = _no_rows("actor", "time", "original", "undone_at")
        if not (n and self.can_follow and len(posts)):
            _short("reposts", n, 0)
            return made | {"by_delete": np.zeros(0, dtype=bool)}
        for r in range(REPOST_ROUNDS):
            need = n * (r + 1) // REPOST_ROUNDS - len(made["actor"])
            batch = self._repost_round(need, posts, made, undo_ratio)
            made = {k: np.concatenate([made[k], batch[k]]) for k in made}
        _short("reposts", n, len(made["actor"]))
        undone = made["undone_at"] != NEVER
        by_delete = undone & (self.rng.random(len(undone)) < UNDO_BY_DELETE)
        return made | {"by_delete": by_delete}

    def _repost_round(self, n: int, posts: Posts, made: Rows, undo_ratio: float) -> Rows:
        actor = np.concatenate([posts.author, made["actor"]])
        original = np.concatenate([np.arange(len(posts)), made["original"]])
        hidden = np.concatenate([posts.deleted_at, made["undone_at"]])
        timeline = Timeline(actor, np.concatenate([posts.time, made["time"]]),
                            self.lo, self.hi - self.lo)
        taken = made["actor"] * len(posts) + made["original"]

        def batch(m: int) -> Rows:
            u, t, f, ok = self._followee_at(m)
            entry, found = timeline.recent(f, t, self.rng)
            o = original[entry]
            a = posts.author[o]
            ok &= found & (hidden[entry] > t) & (posts.deleted_at[o] > t)
            ok &= (self.gone[a] > t) & (a != u)
            code = u * len(posts) + o
            ok &= ~np.isin(code, taken)
            return {"actor": u[ok], "time": t[ok], "original": o[ok], "code": code[ok]}

        rows = _collect(n, batch, key="code") if n > 0 else _no_rows("actor", "time",
                                                                     "original", "code")
        undone = self._undo(rows["time"], rows["actor"], undo_ratio,
                            posts.author[rows["original"]])
        return {"actor": rows["actor"], "time": rows["time"], "original": rows["original"],
                "undone_at": undone}

    # -- blocks and mutes --------------------------------------------------------------
    def relations(self, n: int, mute: int, targets: tuple[float, float, float],
                  replies: Posts, undo_ratio: float) -> Rows:
        """``n`` blocks (``mute=0``) or mutes of repliers, followees and strangers."""
        sources = (self._at_repliers, self._at_followees, self._at_strangers,
                   self._at_strangers)  # the last one makes up for pairs drawn twice
        upto = [*np.cumsum([round(n * share) for share in targets[:2]]).tolist(), n, n]
        made = _no_rows("actor", "target", "time")
        for source, total in zip(sources, upto, strict=True):
            # What a source cannot give (no replies, no edges) falls to the next one.
            more = source(total - len(made["actor"]), replies)
            made = _first_per_pair(_concat_rows(made, more), self.graph.users)
        _short("blocks" if mute == 0 else "mutes", n, len(made["actor"]))
        order = np.argsort(made["time"], kind="stable")
        made = {k: v[order] for k, v in made.items()}
        return made | {"mute": np.full(len(order), mute, dtype=np.int64),
                       "undone_at": self._undo(made["time"], made["actor"], undo_ratio,
                                               made["target"])}

    def _at_repliers(self, n: int, replies: Posts) -> Rows:
        def batch(m: int) -> Rows:
            r = self.rng.integers(0, len(replies), m)
            actor, target = replies.reply_to[r], replies.author[r]
            t = replies.time[r] + 1 + self.rng.exponential(REACTION_DELAY_MS, m).astype(np.int64)
            ok = (t < self.hi) & (self.gone[actor] > t) & (self.gone[target] > t)
            return {"actor": actor[ok], "target": target[ok], "time": t[ok]}

        return _collect(n, batch) if n > 0 and len(replies) else _no_rows("actor", "target",
                                                                           "time")

    def _at_followees(self, n: int, _: Posts) -> Rows:
        def batch(m: int) -> Rows:
            u, t, f, ok = self._followee_at(m)
            return {"actor": u[ok], "target": f[ok], "time": t[ok]}

        return _collect(n, batch) if n > 0 and self.can_follow else _no_rows("actor", "target",
                                                                              "time")

    def _at_strangers(self, n: int, _: Posts) -> Rows:
        def batch(m: int) -> Rows:
            u = self.rng.integers(0, self.graph.users, m)
            x = self.rng.integers(0, self.graph.users, m)
            t = self.rng.integers(self.lo, self.hi, m)
            ok = (u != x) & (self.gone[u] > t) & (self.gone[x] > t)
            return {"actor": u[ok], "target": x[ok], "time": t[ok]}

        return _collect(n, batch) if n > 0 and self.graph.users > 1 else _no_rows(
            "actor", "target", "time")

    # -- shared steps ------------------------------------------------------------------
    def _followee_at(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(user, t, followee, ok) of ``m`` users drawn by out-degree at random times.

        ``followee`` is one of the accounts each follows; ``ok`` where that edge is live
        at ``t`` and both still have their accounts then.
        """
        g = self.graph
        u = g.actors(m, self.rng)
        t = self.rng.integers(self.lo, self.hi, m)
        e = g.edge_of(u, self.rng)
        f = g.followee[e]
        ok = (g.since[e] < t) & (t < g.until[e]) & (self.gone[u] > t) & (self.gone[f] > t)
        return u, t, f, ok

    def _undo(self, times: np.ndarray, actors: np.ndarray, ratio: float,
              others: np.ndarray | None = None) -> np.ndarray:
        """When each act is undone by its actor (NEVER for most).

        A ``ratio`` share is undone later, within the window, while the actor and the
        user acted toward (``others``) still have their accounts.
        """
        undone = np.full(len(times), NEVER, dtype=np.int64)
        limit = np.minimum(self.gone[actors], self.hi)
        if others is not None:
            limit = np.minimum(limit, self.gone[others])
        room = np.flatnonzero(limit - times > 1)
        k = min(round(len(times) * ratio), len(room))
        if k:
            pick = np.sort(self.rng.choice(room, size=k, replace=False))
            undone[pick] = _later(times[pick], limit[pick], self.rng)
        return undone


def _collect(need: int, batch: Callable[[int], Rows], key: str | None = None) -> Rows:
    """Rows from ``batch(m)`` calls until ``need`` (unique by ``key``) or out of tries.

    Rows stay in the order drawn, so the times of the first ``need`` stay uniform.
    """
    got = batch(max(64, 2 * need))
    for _ in range(_BATCHES):
        if key is not None:
            _, first = np.unique(got[key], return_index=True)
            got = {k: v[np.sort(first)] for k, v in got.items()}
        have = len(next(iter(got.values())))
        if have >= need:
            break
        more = batch(max(64, 2 * (need - have)))
        got = {k: np.concatenate([got[k], more[k]]) for k in got}
    return {k: v[:need] for k, v in got.items()}


def _first_per_pair(rows: Rows, users: int) -> Rows:
    """One relation per (actor, target): the first drawn."""
    _, first = np.unique(rows["actor"] * users + rows["target"], return_index=True)
    keep = np.sort(first)
    return {k: v[keep] for k, v in rows.items()}


def _later(times: np.ndarray, limit: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A time strictly after each of ``times`` and strictly before its ``limit``."""
    room = np.maximum(limit - times - 1, 1)
    return times + 1 + (rng.random(len(times)) * room).astype(np.int64).clip(0, room - 1)


def concat(*parts: Posts) -> Posts:
    """The posts of ``parts``, one after the other."""
    return Posts(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Posts)))


def _concat_rows(a: Rows, b: Rows) -> Rows:
    return {k: np.concatenate([a[k], b[k]]) for k in a}


def _no_rows(*names: str) -> Rows:
    return {name: np.zeros(0, dtype=np.int64) for name in names}


def _short(what: str, wanted: int, made: int) -> None:
    if made < wanted:
        log.warning("drew %d of %d %s: the graph and posts offer no more", made, wanted, what)
