"""Synthetic history: profiles, a power-law follow graph, posts, and what users do with them.

Deterministic for a given seed (and faker version): numpy's PCG64 draws every number
and a seeded faker fills small pools of names and sentences once, which are then
recombined (faker per tweet would be far too slow).

Time layout of a history over ``[start_ms, start_ms + span_ms)``: every profile is
created in the first 1% of the span (the profile phase), so a user exists before they
act; follows and posts fall uniformly over the rest (the activity window). An unfollow
is always later than the follow it undoes and a delete later than its post.

Popularity follows Zipf's law: followees are drawn with weight ``1 / rank**exponent``
over a random ranking of the users, and the top ``celebrities`` ranks additionally
share about ``celebrity_share`` of all edges, so a few users have very many followers
(about: nobody's expected follower count may exceed half of the users). Tweet
authors are drawn with weight ``followers + 1``. Tweet ids are snowflakes, Twitter's
layout: ``(created_at - TWITTER_EPOCH_MS) << 22 | worker << 12 | sequence``,
time-ordered 64-bit integers given to posts, replies and reposts together, so that no
two share one. The worker is the seed modulo 1,024: two histories of different seeds
(below 1,024 apart) never share an id, even over one window, so both can be replayed
into one stack without two authors claiming an id (DESIGN §4b's id-claim rule).

A :class:`~ingest.social.RecordMix` adds the records of DESIGN §4b (replies, reposts and
their undos, blocks, mutes, account deletions) along the graph; see ``ingest.social``
for the model and where its proportions come from. They draw from a random stream of
their own, so the posts, deletes and follows of a seed are the same with or without
them, and a history made with :data:`~ingest.social.POSTS_ONLY` (the default here) is
byte for byte the history of the generator before them, but for the worker bits of
its ids (zero, as before, for seed 0).
"""

from __future__ import annotations

import functools
import heapq
import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Final

import numpy as np
from faker import Faker

from ingest import social
from ingest.events import (
    BLOCK,
    MAX_TEXT,
    MUTE,
    TOPIC_RANK,
    AccountDelete,
    Activity,
    Delete,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
    UserUpsert,
    encode,
)
from ingest.social import NEVER, POSTS_ONLY, Posts, RecordMix

log = logging.getLogger(__name__)

TWITTER_EPOCH_MS: Final = 1_288_834_974_657
DEFAULT_START_MS: Final = 1_704_067_200_000  # 2024-01-01T00:00:00Z
DEFAULT_SPAN_MS: Final = 30 * 86_400_000
PROFILE_SHARE: Final = 0.01
FILES: Final = {"users": "users.jsonl", "follows": "follows.jsonl", "tweets": "tweets.jsonl",
                "activity": "activity.jsonl"}
MANIFEST: Final = "manifest.json"
_SEQUENCE_BITS: Final = 12
_WORKER_BITS: Final = 10
_HANDLE_LEN: Final = 15
#: The social records' own random stream: ``default_rng([seed, _SOCIAL_STREAM])``.
_SOCIAL_STREAM: Final = 13
#: The home-timeline reads' own random stream (so adding reads changes nothing else).
_READ_STREAM: Final = 17
#: How often a user who keeps reading reads, on average (a Poisson process).
READ_EVERY_MS: Final = 86_400_000
#: Kinds of event a history counts, in the manifest's order.
KINDS: Final = ("users", "account_deletes", "follows", "unfollows", "blocks", "unblocks",
                "mutes", "unmutes", "posts", "replies", "deletes", "reposts", "unreposts", "reads")

UserEvent = UserUpsert | AccountDelete
EdgeEvent = Follow | Relation
TweetEvent = Post | Delete | Repost | Unrepost


@dataclass
class History:
    """A generated history by topic, each list sorted by ``created_at``."""

    seed: int
    users: list[UserEvent]
    follows: list[EdgeEvent]
    tweets: list[TweetEvent]
    params: dict[str, Any] = field(default_factory=dict)
    #: Home-timeline reads (the activity topic), if asked for: see :func:`add_reads`.
    reads: list[Activity] = field(default_factory=list)

    def events(self) -> Iterator[Event]:
        """All events in event-time order (ties: follows, tweets, users, reads)."""
        def key(event: Event) -> tuple[int, int]:
            return event.created_at, TOPIC_RANK[event.topic]
        return heapq.merge(self.users, self.follows, self.tweets, self.reads, key=key)

    def counts(self) -> dict[str, int]:
        """Number of events by kind (:data:`KINDS`); they add up to all events."""
        seen = Counter(map(kind, [*self.users, *self.follows, *self.tweets, *self.reads]))
        return {name: seen[name] for name in KINDS}


def kind(event: Event) -> str:
    """The :data:`KINDS` name of ``event``: a reply is not a post, an unblock not a block."""
    if isinstance(event, Post):
        return "replies" if event.in_reply_to_user_id else "posts"
    if isinstance(event, UserUpsert):
        return "users"
    if isinstance(event, AccountDelete):
        return "account_deletes"
    return f"{event.op}s"


def add_reads(history: History, readers: float, start_ms: int, span_ms: int,
              every_ms: int = READ_EVERY_MS) -> History:
    """Home-timeline reads over the history, for inactive users (DESIGN §4b).

    Every user with a profile reads once just after signing up (the end of the profile
    phase); a share ``readers`` of them (drawn at random) keep reading, on average
    every ``every_ms`` (a Poisson process) until the end of the span, and the others
    never come back. With a span longer than ``FANOUT_INACTIVE_DAYS`` most of the
    others go dormant. Deterministic for the history's seed.
    """
    if not 0 <= readers <= 1:
        msg = f"readers must be a share in [0, 1], got {readers}"
        raise ValueError(msg)
    rng = np.random.default_rng([history.seed, _READ_STREAM])
    ids = np.array(sorted({u.user_id for u in history.users if isinstance(u, UserUpsert)}),
                   dtype=np.int64)
    lo, hi = activity_window(start_ms, span_ms)
    times = [np.full(len(ids), lo, dtype=np.int64)]
    owners = [ids]
    keep = ids[rng.random(len(ids)) < readers]
    expected = max(1, (hi - lo) // max(1, every_ms))
    counts = rng.poisson(expected, len(keep))
    owners.append(np.repeat(keep, counts))
    times.append(rng.integers(lo, hi, int(counts.sum()), dtype=np.int64))
    who, when = np.concatenate(owners), np.concatenate(times)
    order = np.lexsort((who, when))
    history.reads = [Activity(int(u), int(t)) for u, t in zip(who[order], when[order],
                                                              strict=True)]
    history.params |= {"readers": readers, "read_every_ms": every_ms}
    return history


@dataclass(frozen=True)
class FollowEdges:
    """Follow edges by user id: ``follower[i]`` follows ``followee[i]`` from ``since[i]`` on.

    What :func:`for_graph` needs of a graph's edges to draw activity along them (edge
    lists have no unfollows).
    """

    follower: np.ndarray
    followee: np.ndarray
    since: np.ndarray

    def graph(self, ids: np.ndarray) -> social.Graph:
        """The edges by index into the sorted ``ids``, which must hold every endpoint."""
        follower, followee = (np.searchsorted(ids, side) for side in (self.follower,
                                                                       self.followee))
        for index, side in ((follower, self.follower), (followee, self.followee)):
            if len(side) and not np.array_equal(ids[np.minimum(index, len(ids) - 1)], side):
                msg = "an edge names a user missing from the follower counts"
                raise ValueError(msg)
        return social.Graph(len(ids), follower, followee, self.since.astype(np.int64),
                            np.full(len(follower), NEVER, dtype=np.int64))


def activity_window(start_ms: int, span_ms: int) -> tuple[int, int]:
    """The ``[lo, hi)`` milliseconds in which follows and tweets fall (after profiles)."""
    return start_ms + int(span_ms * PROFILE_SHARE), start_ms + span_ms


def generate(users: int, follows: int, tweets: int, seed: int = 0, *,
             celebrities: int | None = None, celebrity_share: float = 0.2,
             zipf_exponent: float = 0.9, delete_ratio: float = 0.02,
             unfollow_ratio: float = 0.05, start_ms: int = DEFAULT_START_MS,
             span_ms: int = DEFAULT_SPAN_MS, mix: RecordMix = POSTS_ONLY) -> History:
    """A whole synthetic history: profiles, follow graph, posts, deletes, unfollows.

    ``tweets`` counts the posts, replies included; ``mix`` adds the records of DESIGN
    §4b. ``celebrities`` defaults to one per 2,000 users (at least one).
    """
    _check_sizes(users, follows, start_ms, span_ms)
    rng, texts = np.random.default_rng(seed), text_pool(seed)
    ids = np.arange(1, users + 1, dtype=np.int64)
    lo, hi = activity_window(start_ms, span_ms)
    k = max(1, users // 2000) if celebrities is None else celebrities
    probs = popularity(users, rng, k, celebrity_share, zipf_exponent, follows)
    follower, followee = _sample_edges(follows, probs, rng)
    follow_events, since, until = _follow_events(ids[follower], ids[followee], rng, lo, hi,
                                                 unfollow_ratio)
    followers = np.bincount(followee, minlength=users)
    params = {"users": users, "follows": follows, "tweets": tweets, "celebrities": k,
              "celebrity_share": celebrity_share, "zipf_exponent": zipf_exponent,
              "delete_ratio": delete_ratio, "unfollow_ratio": unfollow_ratio,
              "start_ms": start_ms, "span_ms": span_ms, "mix": asdict(mix)}
    users_topic: list[UserEvent] = [*profiles(ids, texts, rng, start_ms, lo)]
    made = History(seed, users_topic, follow_events, [], params)
    graph = social.Graph(users, follower, followee, since, until)
    _add_content(made, ids, followers, tweets, (rng, texts), (lo, hi), delete_ratio, mix,
                 graph)
    return made


def for_graph(follower_counts: Mapping[int, int], tweets: int, seed: int = 0, *,
              delete_ratio: float = 0.02, start_ms: int = DEFAULT_START_MS,
              span_ms: int = DEFAULT_SPAN_MS, mix: RecordMix = POSTS_ONLY,
              edges: FollowEdges | None = None) -> History:
    """Profiles for every user of an existing graph, posts by follower count, and more.

    ``follower_counts`` maps every user id of the graph (0 followers included) to its
    follower count; see :func:`follower_counts`. A ``mix`` beyond posts needs the
    graph's ``edges``, along which replies, reposts, blocks and mutes are drawn. The
    graph's own edges are not part of the result.
    """
    if not mix.posts_only and edges is None:
        msg = "replies, reposts, blocks, mutes and account deletions need the graph's edges"
        raise ValueError(msg)
    rng, texts = np.random.default_rng(seed), text_pool(seed)
    ids = np.fromiter(sorted(follower_counts), dtype=np.int64, count=len(follower_counts))
    weights = np.array([follower_counts[int(i)] for i in ids], dtype=np.int64)
    lo, hi = activity_window(start_ms, span_ms)
    params = {"tweets": tweets, "delete_ratio": delete_ratio, "start_ms": start_ms,
              "span_ms": span_ms, "graph_users": len(ids), "mix": asdict(mix)}
    users_topic: list[UserEvent] = [*profiles(ids, texts, rng, start_ms, lo)]
    made = History(seed, users_topic, [], [], params)
    graph = None if edges is None or mix.posts_only else edges.graph(ids)
    _add_content(made, ids, weights, tweets, (rng, texts), (lo, hi), delete_ratio, mix, graph)
    return made


def follower_counts(edges: Iterable[Event]) -> dict[int, int]:
    """Followers per user over active follow events; followers-only users map to 0."""
    counts: dict[int, int] = {}
    for event in edges:
        if isinstance(event, Follow) and event.active:
            counts[event.followee_id] = counts.get(event.followee_id, 0) + 1
            counts.setdefault(event.follower_id, 0)
    return counts


def write(history: History, out: Path) -> Path:
    """Write the history's files (:data:`FILES`, activity empty without reads) and manifest."""
    out.mkdir(parents=True, exist_ok=True)
    for name, events in (("users", history.users), ("follows", history.follows),
                         ("tweets", history.tweets), ("activity", history.reads)):
        with (out / FILES[name]).open("wb") as fh:
            fh.writelines(encode(e)[1] + b"\n" for e in events)
    manifest = {"seed": history.seed, "counts": history.counts(), "params": history.params,
                "files": FILES, "faker": version("faker"), "numpy": np.__version__}
    path = out / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def snowflake(created_at: np.ndarray, seed: int = 0) -> np.ndarray:
    """Time-ordered unique ids for sorted millisecond times (sequence within a ms).

    The worker bits are ``seed`` modulo 1,024 (module docstring).
    """
    ms = created_at.astype(np.int64) - TWITTER_EPOCH_MS
    first = np.searchsorted(created_at, created_at, side="left")
    sequence = np.arange(len(created_at), dtype=np.int64) - first
    if len(sequence) and sequence.max() >= 1 << _SEQUENCE_BITS:
        msg = (f"more than {1 << _SEQUENCE_BITS:,} tweets in one millisecond: give them a "
               "longer span")
        raise ValueError(msg)
    worker = seed % (1 << _WORKER_BITS)
    return (ms << (_WORKER_BITS + _SEQUENCE_BITS)) | (worker << _SEQUENCE_BITS) | sequence


class TextPool:
    """Names and tweet texts recombined from small faker-made pools (fast, seeded)."""

    def __init__(self, seed: int, size: int = 3_000) -> None:
        fake = Faker("en_US")
        fake.seed_instance(seed)
        self.sentences = [fake.sentence(nb_words=12) for _ in range(size)]
        self.tags = ["#" + fake.word() for _ in range(200)]
        self.first = [fake.first_name() for _ in range(500)]
        self.last = [fake.last_name() for _ in range(500)]

    def tweets(self, n: int, rng: np.random.Generator) -> list[str]:
        """``n`` texts of one to three sentences, a hashtag now and then, <= 280 chars."""
        picks = rng.integers(0, len(self.sentences), size=(n, 3)).tolist()
        lengths = rng.integers(1, 4, size=n).tolist()
        tags = rng.integers(-len(self.tags) * 3, len(self.tags), size=n).tolist()
        texts = []
        for pick, length, tag in zip(picks, lengths, tags, strict=True):
            text = " ".join(self.sentences[i] for i in pick[:length])
            if tag >= 0:
                text = f"{text} {self.tags[tag]}"
            texts.append(text[:MAX_TEXT].rstrip())
        return texts

    def names(self, n: int, rng: np.random.Generator) -> list[tuple[str, str]]:
        """``n`` (first, last) name pairs."""
        firsts = rng.integers(0, len(self.first), size=n).tolist()
        lasts = rng.integers(0, len(self.last), size=n).tolist()
        return [(self.first[f], self.last[la]) for f, la in zip(firsts, lasts, strict=True)]


@functools.lru_cache(maxsize=16)
def text_pool(seed: int, size: int = 3_000) -> TextPool:
    """The pool of ``seed`` and ``size``, made once a process.

    Making one takes ~0.1 s of Faker, and a test session asks for the same few seeds
    many times. A pool is only ever read.
    """
    return TextPool(seed, size)


def profiles(ids: np.ndarray, texts: TextPool, rng: np.random.Generator, lo: int, hi: int
             ) -> list[UserUpsert]:
    """One profile per id, created in ``[lo, hi)`` in id order, with unique handles."""
    times = np.linspace(lo, max(lo, hi - 1), num=len(ids), dtype=np.int64).tolist()
    used: set[str] = set()
    result = []
    for uid, (first, last), at in zip(ids.tolist(), texts.names(len(ids), rng), times,
                                      strict=True):
        result.append(UserUpsert(uid, _handle(first, last, uid, used), f"{first} {last}", at))
    return result


def popularity(users: int, rng: np.random.Generator, celebrities: int, share: float,
               exponent: float, edges: int) -> np.ndarray:
    """Probability of each user being the followee of an edge (Zipf plus celebrities)."""
    ranks = rng.permutation(users)
    weights = 1.0 / (ranks + 1.0) ** exponent
    top = ranks < celebrities
    if top.any() and 0 < share < 1:
        weights[top] *= share / (1 - share) * weights[~top].sum() / weights[top].sum()
    probs = weights / weights.sum()
    # Nobody can have more than users-1 followers: cap the expected in-degree at half
    # of that so sampling without duplicates stays cheap, and spread the excess.
    cap = 0.5 * (users - 1) / max(edges, 1)
    for _ in range(20):
        if probs.max() <= cap * 1.0001:
            break
        probs = np.minimum(probs, cap)
        probs /= probs.sum()
    return probs


def _sample_edges(n: int, probs: np.ndarray, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``n`` distinct (follower, followee) index pairs, no self-follows, random order."""
    users = len(probs)
    codes = np.empty(0, dtype=np.int64)
    for _ in range(50):
        need = n - len(codes)
        if need <= 0:
            break
        m = int(need * 1.3) + 64
        pair = rng.integers(0, users, m) * users + rng.choice(users, m, p=probs)
        pair = pair[pair // users != pair % users]
        merged = np.concatenate([codes, pair])
        _, first = np.unique(merged, return_index=True)
        codes = merged[np.sort(first)]
    if len(codes) < n:
        msg = f"could not draw {n} distinct follow edges among {users} users"
        raise ValueError(msg)
    codes = codes[:n]
    return codes // users, codes % users


def _follow_events(follower: np.ndarray, followee: np.ndarray, rng: np.random.Generator,
                   lo: int, hi: int, unfollow_ratio: float
                   ) -> tuple[list[EdgeEvent], np.ndarray, np.ndarray]:
    """Follow and unfollow events, and when each edge starts and ends (NEVER)."""
    times = np.sort(rng.integers(lo, hi, len(follower)))
    k = round(len(follower) * unfollow_ratio)
    undo = rng.choice(len(follower), size=k, replace=False)
    later = _later(times[undo], hi, rng)
    events: list[EdgeEvent] = [Follow(f, g, t) for f, g, t in
                               zip(follower.tolist(), followee.tolist(), times.tolist(),
                                   strict=True)]
    events += [Follow(f, g, t, active=False) for f, g, t in
               zip(follower[undo].tolist(), followee[undo].tolist(), later.tolist(),
                   strict=True)]
    events.sort(key=_time)
    until = np.full(len(follower), NEVER, dtype=np.int64)
    until[undo] = later
    return events, times, until


def _add_content(made: History, ids: np.ndarray, weights: np.ndarray, n: int,
                 draws: tuple[np.random.Generator, TextPool], window: tuple[int, int],
                 delete_ratio: float, mix: RecordMix, graph: social.Graph | None) -> None:
    """Fill ``made`` with ``n`` posts (replies included) and the rest of ``mix``."""
    rng, texts = draws
    if n and not len(ids):
        msg = "cannot generate tweets without users"
        raise ValueError(msg)
    originals, words, gone = _originals(ids, weights, n - round(n * mix.replies), rng, texts,
                                        window, delete_ratio)
    if graph is None or mix.posts_only:
        made.tweets = _tweets(made.seed, ids, originals, words, gone, None, [])
        return
    stream = np.random.default_rng([made.seed, _SOCIAL_STREAM])
    drawn = social.draw(mix, graph, originals, n, stream, window, delete_ratio)
    short = n - len(originals) - len(drawn.replies)
    if short > 0:  # replies the graph had no room for are posts, so n posts there are
        extra, more_words, more_gone = _originals(ids, weights, short, stream, texts, window,
                                                  delete_ratio)
        before = len(originals)
        gone = np.concatenate([gone, before + more_gone])
        originals, words = social.concat(originals, extra), [*words, *more_words]
        # Reposts point into originals then replies: the replies moved up by ``short``.
        drawn.reposts["original"] += np.where(drawn.reposts["original"] >= before, short, 0)
    made.tweets = _tweets(made.seed, ids, originals, words, gone, drawn,
                          texts.tweets(len(drawn.replies), stream))
    made.follows = sorted([*made.follows, *_relations(ids, drawn.relations)], key=_time)
    made.users = sorted([*made.users, *(AccountDelete(u, t) for u, t in zip(
        ids[drawn.gone["user"]].tolist(), drawn.gone["time"].tolist(), strict=True))],
        key=_time)


def _originals(ids: np.ndarray, weights: np.ndarray, n: int, rng: np.random.Generator,
               texts: TextPool, window: tuple[int, int], delete_ratio: float
               ) -> tuple[Posts, list[str], np.ndarray]:
    """``n`` posts by follower-weighted authors: (posts, texts, the deleted ones in order).

    The draws, in their order, are those of the generator before DESIGN §4b.
    """
    lo, hi = window
    if not n:
        empty = np.zeros(0, dtype=np.int64)
        return Posts(empty, empty, empty, empty), [], empty
    w = weights.astype(np.float64) + 1.0
    authors = rng.choice(len(ids), size=n, p=w / w.sum())
    times = np.sort(rng.integers(lo, hi, n))
    words = texts.tweets(n, rng)
    gone = rng.choice(n, size=round(n * delete_ratio), replace=False)
    deleted_at = np.full(n, NEVER, dtype=np.int64)
    deleted_at[gone] = _later(times[gone], hi, rng)
    return Posts(authors, times, deleted_at, np.full(n, -1, dtype=np.int64)), words, gone


def _tweets(seed: int, ids: np.ndarray, originals: Posts, words: list[str], gone: np.ndarray,
            drawn: social.Social | None, reply_words: list[str]) -> list[TweetEvent]:
    """The tweets topic's events; posts, replies and reposts share one snowflake sequence."""
    replies = drawn.replies if drawn is not None else Posts(*(np.zeros(0, np.int64),) * 4)
    reposts = drawn.reposts if drawn is not None else {"time": np.zeros(0, np.int64)}
    times = np.concatenate([originals.time, replies.time, reposts["time"]])
    order = np.argsort(times, kind="stable")
    tweet_ids = np.empty(len(times), dtype=np.int64)
    tweet_ids[order] = snowflake(times[order], seed)
    posts = social.concat(originals, replies)
    post_ids = tweet_ids[:len(posts)]
    authors = ids[posts.author]
    reply_to = np.where(posts.reply_to >= 0, ids[np.maximum(posts.reply_to, 0)], 0)
    events: list[TweetEvent] = [
        Post(i, a, t, s, r) for i, a, t, s, r in zip(
            post_ids.tolist(), authors.tolist(), posts.time.tolist(), [*words, *reply_words],
            reply_to.tolist(), strict=True)]
    deleted = [*gone.tolist(), *(len(originals) + np.flatnonzero(
        replies.deleted_at != NEVER)).tolist()]
    events += [Delete(int(post_ids[j]), int(authors[j]), int(posts.deleted_at[j]))
               for j in deleted]
    if drawn is not None:
        events += _repost_events(ids, drawn.reposts, tweet_ids[len(posts):], post_ids, authors)
    events.sort(key=_time)
    return events


def _repost_events(ids: np.ndarray, reposts: social.Rows, repost_ids: np.ndarray,
                   post_ids: np.ndarray, post_authors: np.ndarray) -> list[TweetEvent]:
    """Reposts, and their undos: an unrepost, or a delete naming the repost id."""
    actors = ids[reposts["actor"]].tolist()
    original = reposts["original"]
    events: list[TweetEvent] = [
        Repost(i, a, o, oa, t) for i, a, o, oa, t in zip(
            repost_ids.tolist(), actors, post_ids[original].tolist(),
            post_authors[original].tolist(), reposts["time"].tolist(), strict=True)]
    for j in np.flatnonzero(reposts["undone_at"] != NEVER).tolist():
        undo = Delete if reposts["by_delete"][j] else Unrepost
        events.append(undo(int(repost_ids[j]), actors[j], int(reposts["undone_at"][j])))
    return events


def _relations(ids: np.ndarray, rows: social.Rows) -> list[EdgeEvent]:
    """Blocks and mutes, and the unblocks and unmutes of some."""
    actors, targets = ids[rows["actor"]].tolist(), ids[rows["target"]].tolist()
    kinds = [MUTE if m else BLOCK for m in rows["mute"].tolist()]
    events: list[EdgeEvent] = [
        Relation(a, x, t, k) for a, x, t, k in zip(actors, targets, rows["time"].tolist(),
                                                    kinds, strict=True)]
    for j in np.flatnonzero(rows["undone_at"] != NEVER).tolist():
        events.append(Relation(actors[j], targets[j], int(rows["undone_at"][j]), kinds[j],
                               active=False))
    return events


def _later(times: np.ndarray, hi: int, rng: np.random.Generator) -> np.ndarray:
    """A time strictly after each of ``times``, before ``hi`` when there is room."""
    room = np.maximum(hi - times - 1, 1)
    return times + 1 + (rng.random(len(times)) * room).astype(np.int64)


def _handle(first: str, last: str, uid: int, used: set[str]) -> str:
    # Bases are letters only, so base + decimal id can never collide with another base.
    base = re.sub(r"[^a-z]", "", f"{first}{last}".lower()) or "user"
    handle = base[:_HANDLE_LEN]
    if handle in used:
        suffix = str(uid)
        handle = base[:max(3, _HANDLE_LEN - len(suffix))] + suffix
    used.add(handle)
    return handle


def _time(event: Event) -> int:
    return event.created_at


def _check_sizes(users: int, follows: int, start_ms: int, span_ms: int) -> None:
    if users < 2:
        msg = "need at least 2 users"
        raise ValueError(msg)
    if follows > users * (users - 1) // 2:
        msg = f"{follows} follows is too dense a graph for {users} users"
        raise ValueError(msg)
    if start_ms <= TWITTER_EPOCH_MS:
        msg = f"start_ms must be after the snowflake epoch {TWITTER_EPOCH_MS}"
        raise ValueError(msg)
    if span_ms < 1000:
        msg = "span_ms must be at least one second"
        raise ValueError(msg)
