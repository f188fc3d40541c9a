"""What a simulated user does next: the HTTP call for each action of the mix.

A :class:`Planner` turns the :class:`~loadgen.workload.Mix` and the
:class:`~loadgen.workload.Workload` into concrete :class:`Call` objects — which user
reads, who posts, replies, reposts, blocks or mutes whom — without doing any I/O, so
the Locust user in ``locustfile.py`` only sends what it is given and records what
came back. The preconditions are those a person using the service meets:

- A reply or a repost is of a tweet the actor's home timeline shows: the action
  starts with a read of that timeline (named and timed as any home read), and the
  write follows on one of the tweets the page showed — never the actor's own, never
  one the actor's repost from this run still shows. A page with nothing to act on
  ends the action there.
- Undos (delete, unrepost, unfollow, unblock, unmute) undo only what this process did
  (a :class:`Memory` of its tweets, reposts and edges), so a run never undoes history
  it did not write; when there is nothing to undo yet, the opposite write is made.
- Users reserved for the fan-out probe never follow, unfollow, block, mute or delete
  their account, and nobody blocks, mutes or deletes them, so the probe's edges stay.
- A deleted account is gone for good (DESIGN §4b): once this process deleted it, or
  an answer said so, the planner neither acts as it nor reads its timelines again.

Some refusals are what a correct API answers while others act at the same time, and
each call lists those it may get (:attr:`Call.expected`): 404 for a timeline of an
account deleted by another process or in the replayed history, 404 for a reply to or
repost of a tweet deleted since it was read, 409 for a repost of a tweet the actor
reposted before the run or from another process. The Locust user counts them beside
the latencies, not as errors, and tells the planner (:meth:`Planner.refused`).

Following an edge that already existed and later unfollowing it does remove a
historical edge; with Zipf-drawn pairs that is rare and only changes the data, not
what is measured.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from urllib.parse import urlencode

import numpy as np

from ingest.generator import text_pool
from loadgen.workload import ACTIONS, Mix, Workload, ZipfPicker

PAGE_LIMIT: Final = 20
MEMORY: Final = 10_000
_TRIES: Final = 5

HOME: Final = "GET home"
HOME_NEXT: Final = "GET home (next page)"
TWEETS: Final = "GET tweets"
POST: Final = "POST tweet"
REPLY: Final = "POST reply"
REPOST: Final = "POST repost"
UNREPOST: Final = "DELETE repost"
DELETE: Final = "DELETE tweet"
FOLLOW: Final = "PUT follow"
UNFOLLOW: Final = "DELETE follow"
BLOCK: Final = "PUT block"
UNBLOCK: Final = "DELETE block"
MUTE: Final = "PUT mute"
UNMUTE: Final = "DELETE mute"
DELETE_ACCOUNT: Final = "DELETE account"
#: The request each action of the mix ends with (a reply or repost is read first).
ACTION_NAMES: Final = {"home": HOME, "tweets": TWEETS, "post": POST, "reply": REPLY,
                       "repost": REPOST, "unrepost": UNREPOST, "delete": DELETE,
                       "follow": FOLLOW, "unfollow": UNFOLLOW, "block": BLOCK,
                       "unblock": UNBLOCK, "mute": MUTE, "unmute": UNMUTE,
                       "delete_account": DELETE_ACCOUNT}
NAMES: Final = (HOME, HOME_NEXT, *list(ACTION_NAMES.values())[1:])
#: Writes whose answer carries what a later undo needs (the new id).
_DECODED: Final = frozenset({POST, REPLY, REPOST})
#: A timeline of a deleted account answers 404 (DESIGN §4b).
GONE: Final = (404,)

_Kept = TypeVar("_Kept", bound=tuple[Any, ...])


@dataclass(frozen=True)
class Call:
    """One HTTP request to make, named for the statistics.

    ``actor`` is the user whose credentials the request carries (the writer, or the
    owner of a home timeline); ``other`` is the user acted on (followee, blocked or
    muted user, the author of a tweet replied to or reposted, the author of a tweets
    page). ``then`` marks a home read that a reply or repost follows on;
    ``expected``: statuses that are answers, not failures (see the module docstring).
    """

    method: str
    path: str
    name: str
    actor: int | None = None
    other: int | None = None
    params: dict[str, Any] | None = None
    body: dict[str, Any] | None = None
    then: str | None = None
    expected: tuple[int, ...] = ()

    def url(self) -> str:
        """Path and query string."""
        return f"{self.path}?{urlencode(self.params)}" if self.params else self.path


def _kept() -> deque[Any]:
    return deque(maxlen=MEMORY)


@dataclass
class Memory:
    """What this process did and learned, shared by its users (bounded).

    ``tweets``: (author, tweet id) posted, for deletes; ``reposts``: (actor, repost id,
    original id), for unreposts, and ``reposted`` the (actor, original id) pairs among
    them (a second repost is refused); ``follows``, ``blocks``, ``mutes``: edges
    (actor, other) for their undos; ``gone``: deleted accounts.
    """

    tweets: deque[tuple[int, str]] = field(default_factory=_kept)
    reposts: deque[tuple[int, str, str]] = field(default_factory=deque)
    reposted: set[tuple[int, str]] = field(default_factory=set)
    follows: deque[tuple[int, int]] = field(default_factory=_kept)
    blocks: deque[tuple[int, int]] = field(default_factory=_kept)
    mutes: deque[tuple[int, int]] = field(default_factory=_kept)
    gone: set[int] = field(default_factory=set)

    def add_repost(self, actor: int, repost_id: str, original_id: str) -> None:
        """Remember a repost; past :data:`MEMORY` of them the oldest is forgotten."""
        if len(self.reposts) >= MEMORY:
            old_actor, _, old_original = self.reposts.popleft()
            self.reposted.discard((old_actor, old_original))
        self.reposts.append((actor, repost_id, original_id))
        self.reposted.add((actor, original_id))

    def take(self, kept: deque[_Kept]) -> _Kept | None:
        """The oldest act in ``kept`` whose actor still has an account (removed), or None."""
        while kept:
            item = kept.popleft()
            if item[0] not in self.gone:
                return item
        return None


class Planner:
    """Draws actions and their calls; see the module docstring."""

    def __init__(self, workload: Workload, mix: Mix, rng: random.Random,
                 memory: Memory | None = None, texts: list[str] | None = None) -> None:
        self.mix, self.rng = mix, rng
        self.memory = memory if memory is not None else Memory()
        self.texts = texts or tweet_texts(rng.randrange(2**31))
        self.readers = ZipfPicker(workload.readers, workload.exponent)
        self.authors = ZipfPicker(workload.authors, workload.exponent)
        self.actors = ZipfPicker(_ranked_actors(workload), workload.exponent)
        self.reserved = frozenset(workload.reserved)
        self._deletable = [u for u in self.actors.items if u not in self.reserved]
        self._edges = {FOLLOW: self.memory.follows, BLOCK: self.memory.blocks,
                       MUTE: self.memory.mutes}
        self._weights = list(mix.weights().values())
        self._page_on: bool | None = None

    def next_call(self) -> Call:
        """The call for the next action drawn from the mix."""
        action = self.rng.choices(ACTIONS, weights=self._weights)[0]
        return getattr(self, f"_{action}")()

    def answered(self, call: Call, body: dict[str, Any] | None, pages: int = 1) -> Call | None:
        """Learn from a successful answer (``body``); the follow-up call, if any.

        New tweets, reposts and edges are remembered for their undos, a deleted
        account as gone; a home page read for a reply or repost leads to it, another
        may be followed by the next page (``pages`` read so far).
        """
        if body is None or call.actor is None:
            self._page_on = None
            return None
        if call.then is not None:
            return self._act_on_page(call, call.actor, body)
        if call.name in (HOME, HOME_NEXT):
            return self._next_page(call.actor, body.get("next_cursor"), pages)
        self._remember(call, call.actor, body)
        return None

    def refused(self, call: Call, status: int) -> None:
        """Learn from an expected refusal: a timeline's 404 says its account is gone."""
        self._page_on = None
        user = call.actor if call.name in (HOME, HOME_NEXT) else call.other
        if status == 404 and call.name in (HOME, HOME_NEXT, TWEETS) and user is not None:
            self.memory.gone.add(user)

    def needs_body(self, call: Call, pages: int = 1) -> bool:
        """Whether :meth:`answered` will read the answer's body (else any 2xx will do).

        A load generator that decodes every 11 KB page spends more on JSON than the
        API does on the read, so the user decodes only what is used: a new tweet's or
        repost's id, a page read for a reply or repost, and a home page the user will
        page on from — which is drawn here, before the answer, instead of after it.
        """
        if call.then is not None:
            self._page_on = False
            return True
        if call.name in (HOME, HOME_NEXT):
            self._page_on = pages < self.mix.max_pages and self.rng.random() < self.mix.page
            return self._page_on
        return call.name in _DECODED

    def _next_page(self, user: int, cursor: str | None, pages: int) -> Call | None:
        page_on, self._page_on = self._page_on, None
        if page_on is None:  # not drawn by needs_body: draw now
            page_on = pages < self.mix.max_pages and (
                cursor is not None and self.rng.random() < self.mix.page)
        if cursor is None or not page_on:
            return None
        return Call("GET", f"/v1/users/{user}/home", HOME_NEXT, user,
                    params={"limit": PAGE_LIMIT, "cursor": cursor}, expected=GONE)

    def _act_on_page(self, call: Call, actor: int, body: dict[str, Any]) -> Call | None:
        """The reply or repost a read leads to: of a tweet the page showed, not the actor's."""
        shown = [t for t in map(_shown, body.get("entries") or ())
                 if t is not None and t[1] != actor and t[1] not in self.memory.gone]
        if call.then == "repost":
            shown = [t for t in shown if (actor, t[0]) not in self.memory.reposted]
        if not shown:
            return None
        tweet_id, author = self.rng.choice(shown)
        if call.then == "repost":
            return Call("POST", f"/v1/tweets/{tweet_id}/reposts", REPOST, actor, author,
                        expected=(404, 409))
        return Call("POST", "/v1/tweets", REPLY, actor, author, expected=(404,),
                    body={"text": self.rng.choice(self.texts), "in_reply_to": tweet_id})

    def _remember(self, call: Call, actor: int, body: dict[str, Any]) -> None:
        if call.name in (POST, REPLY) and "tweet_id" in body:
            self.memory.tweets.append((actor, str(body["tweet_id"])))
        elif call.name == REPOST and "repost_id" in body:
            self.memory.add_repost(actor, str(body["repost_id"]), str(body["original_id"]))
        elif call.name == DELETE_ACCOUNT:
            self.memory.gone.add(actor)
        elif call.name in self._edges and call.other is not None:
            self._edges[call.name].append((actor, call.other))

    def _pick(self, picker: ZipfPicker, free: bool = False) -> int | None:
        """A user still holding an account (and, if ``free``, not reserved), or None.

        Drawn by rank; when every draw hits a deleted or reserved user, uniformly
        among the others, so a small workload goes on while anyone is left.
        """
        def ok(user: int) -> bool:
            return user not in self.memory.gone and not (free and user in self.reserved)

        for _ in range(_TRIES):
            if ok(user := picker.pick(self.rng)):
                return user
        left = [u for u in picker.items if ok(u)]
        return self.rng.choice(left) if left else None

    # -- one method per action -------------------------------------------------------
    def _home(self, then: str | None = None) -> Call:
        user = self._pick(self.readers)
        if user is None:  # every account is deleted: read one (its 404 is expected)
            user = self.readers.pick(self.rng)
        return Call("GET", f"/v1/users/{user}/home", HOME, user, params={"limit": PAGE_LIMIT},
                    then=then, expected=GONE)

    def _tweets(self) -> Call:
        author = self._pick(self.authors)
        if author is None:
            author = self.authors.pick(self.rng)
        return Call("GET", f"/v1/users/{author}/tweets", TWEETS, other=author,
                    params={"limit": PAGE_LIMIT}, expected=GONE)

    def _post(self) -> Call:
        author = self._pick(self.actors)
        if author is None:
            return self._home()
        return Call("POST", "/v1/tweets", POST, author, body={"text": self.rng.choice(self.texts)})

    def _reply(self) -> Call:
        return self._home(then="reply")

    def _repost(self) -> Call:
        return self._home(then="repost")

    def _unrepost(self) -> Call:
        kept = self.memory.take(self.memory.reposts)
        if kept is None:
            return self._repost()
        actor, repost_id, original_id = kept
        self.memory.reposted.discard((actor, original_id))
        return Call("DELETE", f"/v1/reposts/{repost_id}", UNREPOST, actor)

    def _delete(self) -> Call:
        kept = self.memory.take(self.memory.tweets)
        if kept is None:
            return self._post()
        author, tweet_id = kept
        return Call("DELETE", f"/v1/tweets/{tweet_id}", DELETE, author)

    def _follow(self) -> Call:
        return self._edge("following", FOLLOW)

    def _unfollow(self) -> Call:
        return self._undo_edge(self.memory.follows, "following", UNFOLLOW) or self._follow()

    def _block(self) -> Call:
        return self._edge("blocks", BLOCK, protect=True)

    def _unblock(self) -> Call:
        return self._undo_edge(self.memory.blocks, "blocks", UNBLOCK) or self._block()

    def _mute(self) -> Call:
        return self._edge("mutes", MUTE, protect=True)

    def _unmute(self) -> Call:
        return self._undo_edge(self.memory.mutes, "mutes", UNMUTE) or self._mute()

    def _delete_account(self) -> Call:
        for _ in range(_TRIES if self._deletable else 0):
            user = self.rng.choice(self._deletable)
            if user not in self.memory.gone:
                return Call("DELETE", f"/v1/users/{user}", DELETE_ACCOUNT, user)
        return self._home()  # nobody left who may be deleted: read instead

    def _edge(self, path: str, name: str, protect: bool = False) -> Call:
        """A free actor toward an author drawn by popularity (``protect``: not reserved)."""
        for _ in range(_TRIES):
            actor, other = self._pick(self.actors, free=True), self._pick(self.authors, protect)
            if actor is not None and other is not None and other != actor:
                return Call("PUT", f"/v1/users/{actor}/{path}/{other}", name, actor, other)
        return self._home()  # only reserved or deleted users are left: read instead

    def _undo_edge(self, kept: deque[tuple[int, int]], path: str, name: str) -> Call | None:
        edge = self.memory.take(kept)
        if edge is None:
            return None
        actor, other = edge
        return Call("DELETE", f"/v1/users/{actor}/{path}/{other}", name, actor, other)


def _shown(entry: dict[str, Any]) -> tuple[str, int] | None:
    """(tweet id, author id) of the tweet a timeline entry shows (a repost's original)."""
    tweet = entry.get("tweet") or {}
    tweet_id, author = tweet.get("id"), (tweet.get("author") or {}).get("id")
    return None if tweet_id is None or author is None else (str(tweet_id), int(author))


def _ranked_actors(workload: Workload) -> list[int]:
    """Actors in author-popularity order (popular users post more), or every reader."""
    if not workload.actors:
        return workload.authors
    rank = {user: i for i, user in enumerate(workload.authors)}
    return sorted(workload.actors, key=lambda u: rank.get(u, len(rank)))


def tweet_texts(seed: int, n: int = 500) -> list[str]:
    """A pool of realistic tweet texts from the history generator's text pool."""
    return text_pool(seed, size=200).tweets(n, np.random.default_rng(seed))
