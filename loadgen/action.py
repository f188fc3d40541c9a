"""What a simulated user does next: the HTTP call for each action of the mix.

A :class:`Planner` turns the :class:`~loadgen.workload.Mix` and the
:class:`~loadgen.workload.Workload` into concrete :class:`Call` objects — which user
reads, who posts, who follows whom — without doing any I/O, so the Locust user in
``locustfile.py`` only sends what it is given and records what came back.

Deletes and unfollows undo only what this process did (a :class:`Memory` of the
tweets it posted and the edges it created), so a run never deletes history it did not
write; when there is nothing to undo yet, the opposite write is made instead. Users
reserved for the fan-out probe never follow or unfollow, so the probe's edges stay.
Following an edge that already existed and later unfollowing it does remove a
historical edge; with Zipf-drawn pairs that is rare and only changes the data, not
what is measured.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlencode

import numpy as np

from ingest.generator import TextPool
from loadgen.workload import ACTIONS, Mix, Workload, ZipfPicker

PAGE_LIMIT: Final = 20
MEMORY: Final = 10_000
_TRIES: Final = 5

HOME: Final = "GET home"
HOME_NEXT: Final = "GET home (next page)"
TWEETS: Final = "GET tweets"
POST: Final = "POST tweet"
DELETE: Final = "DELETE tweet"
FOLLOW: Final = "PUT follow"
UNFOLLOW: Final = "DELETE follow"
NAMES: Final = (HOME, HOME_NEXT, TWEETS, POST, DELETE, FOLLOW, UNFOLLOW)


@dataclass(frozen=True)
class Call:
    """One HTTP request to make, named for the statistics.

    ``actor`` is the user whose credentials the request carries (the writer, or the
    owner of a home timeline); ``other`` is the followee of a follow or unfollow.
    """

    method: str
    path: str
    name: str
    actor: int | None = None
    other: int | None = None
    params: dict[str, Any] | None = None
    body: dict[str, Any] | None = None

    def url(self) -> str:
        """Path and query string."""
        return f"{self.path}?{urlencode(self.params)}" if self.params else self.path


@dataclass
class Memory:
    """Tweets posted and edges created by this process (bounded, shared by its users)."""

    tweets: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=MEMORY))
    follows: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=MEMORY))


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
        self._weights = list(mix.weights().values())
        self._page_on: bool | None = None

    def next_call(self) -> Call:
        """The call for the next action drawn from the mix."""
        action = self.rng.choices(ACTIONS, weights=self._weights)[0]
        return getattr(self, f"_{action}")()

    def answered(self, call: Call, body: dict[str, Any] | None, pages: int = 1) -> Call | None:
        """Learn from a successful answer (``body``); the follow-up call, if any.

        A posted tweet and a created edge are remembered for a later delete or
        unfollow; a home page may be followed by the next one (``pages`` read so far).
        """
        if body is None or call.actor is None:
            self._page_on = None
            return None
        if call.name == POST and "tweet_id" in body:
            self.memory.tweets.append((call.actor, str(body["tweet_id"])))
        elif call.name == FOLLOW and call.other is not None:
            self.memory.follows.append((call.actor, call.other))
        elif call.name in (HOME, HOME_NEXT):
            return self._next_page(call.actor, body.get("next_cursor"), pages)
        return None

    def needs_body(self, call: Call, pages: int = 1) -> bool:
        """Whether :meth:`answered` will read the answer's body (else any 2xx will do).

        A load generator that decodes every 11 KB page spends more on JSON than the
        API does on the read, so the user decodes only what is used: a post's answer
        (its tweet id), and a home page the user will page on from — which is drawn
        here, before the answer, instead of after it.
        """
        if call.name in (HOME, HOME_NEXT):
            self._page_on = pages < self.mix.max_pages and self.rng.random() < self.mix.page
            return self._page_on
        return call.name == POST

    def _next_page(self, user: int, cursor: str | None, pages: int) -> Call | None:
        page_on, self._page_on = self._page_on, None
        if page_on is None:  # not drawn by needs_body: draw now
            page_on = pages < self.mix.max_pages and (
                cursor is not None and self.rng.random() < self.mix.page)
        if cursor is None or not page_on:
            return None
        return Call("GET", f"/v1/users/{user}/home", HOME_NEXT, user,
                    params={"limit": PAGE_LIMIT, "cursor": cursor})

    # -- one method per action -------------------------------------------------------
    def _home(self) -> Call:
        user = self.readers.pick(self.rng)
        return Call("GET", f"/v1/users/{user}/home", HOME, user, params={"limit": PAGE_LIMIT})

    def _tweets(self) -> Call:
        author = self.authors.pick(self.rng)
        return Call("GET", f"/v1/users/{author}/tweets", TWEETS, params={"limit": PAGE_LIMIT})

    def _post(self) -> Call:
        author = self.actors.pick(self.rng)
        return Call("POST", "/v1/tweets", POST, author, body={"text": self.rng.choice(self.texts)})

    def _delete(self) -> Call:
        if not self.memory.tweets:
            return self._post()
        author, tweet_id = self.memory.tweets.popleft()
        return Call("DELETE", f"/v1/tweets/{tweet_id}", DELETE, author)

    def _follow(self) -> Call:
        for _ in range(_TRIES):
            follower = self.actors.pick(self.rng)
            followee = self.authors.pick(self.rng)
            if follower not in self.reserved and followee != follower:
                return Call("PUT", f"/v1/users/{follower}/following/{followee}", FOLLOW,
                            follower, followee)
        return self._home()  # every draw hit a reserved user: read instead

    def _unfollow(self) -> Call:
        if not self.memory.follows:
            return self._follow()
        follower, followee = self.memory.follows.popleft()
        return Call("DELETE", f"/v1/users/{follower}/following/{followee}", UNFOLLOW,
                    follower, followee)


def _ranked_actors(workload: Workload) -> list[int]:
    """Actors in author-popularity order (popular users post more), or every reader."""
    if not workload.actors:
        return workload.authors
    rank = {user: i for i, user in enumerate(workload.authors)}
    return sorted(workload.actors, key=lambda u: rank.get(u, len(rank)))


def tweet_texts(seed: int, n: int = 500) -> list[str]:
    """A pool of realistic tweet texts from the history generator's text pool."""
    return TextPool(seed, size=200).tweets(n, np.random.default_rng(seed))
