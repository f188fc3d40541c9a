"""HTTP write routes: every write of the API becomes one changelog record (DESIGN §2, §7).

``POST /v1/tweets``, ``DELETE /v1/tweets/{tweet_id}`` and
``PUT|DELETE /v1/users/{user_id}/following/{other_id}`` build an event, check it
against the changelog contract (the same :func:`ingest.events.decode` the job runs,
so nothing the API accepts is dead-lettered later), produce it with acks=all and
answer 202 with a consistency token naming where it landed (:mod:`ingest.consistency`).
There are no dual writes: the views learn of the write from the changelog only.

The routes know nothing of who the caller is: ``current_user`` is a FastAPI
dependency supplied by the app (serving owns auth) that returns the acting user's
id or raises. Failures raise :class:`~ingest.errors.WriteRejected`, which the app maps
to its JSON error shape. :class:`SharedProducer` is the process's one producer: made
on first use (constructors never touch the network), bounded at every step, and
failing fast for a short cool-down after the broker was found unreachable, so a
broker outage answers 503 quickly instead of tying up every worker thread.
"""

# No ``from __future__ import annotations``: FastAPI resolves the route signatures.

import logging
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple, Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ingest.consistency import encode_token
from ingest.errors import BrokerUnavailable, IngestError, InvalidEvent, WriteRejected
from ingest.events import MAX_ID, MAX_TEXT, Delete, Event, Follow, Post, decode, encode
from ingest.producer import ChangelogProducer, Position
from ingest.settings import KafkaSettings
from ingest.snowflake import Snowflake, now_ms
from ingest.topics import TopicLayoutError

log = logging.getLogger(__name__)

ID_NOTE = "Ids are decimal strings of positive 64-bit integers (up to 2^63-1)."
#: OpenAPI schema of an id in a path. The parameter is parsed as text by the route
#: (exact beyond 2^53, one error message), but documented as what it means.
ID_PATH_SCHEMA: dict[str, Any] = {"type": "integer", "format": "int64", "minimum": 1,
                                  "maximum": MAX_ID}


def _space_class() -> str:
    r"""A regex class of exactly Python's whitespace (what ``str.strip()`` removes).

    Spelled out because ``\s`` differs between regex dialects (ECMA's, which OpenAPI
    tools use, lacks \x1c-\x1f), and the contract's rule is Python's ``strip``.
    """
    # U+3000 is the highest whitespace code point (a test checks all of Unicode).
    codes = [c for c in range(0x3001) if chr(c).isspace()]
    runs: list[tuple[int, int]] = []
    for c in codes:
        if runs and runs[-1][1] == c - 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in runs)


#: Documented pattern of tweet text: at least one character that is not whitespace.
NOT_ONLY_SPACE = f"[^{_space_class()}]"


class Sender(Protocol):
    """What the routes need of a producer (:class:`ChangelogProducer` has it)."""

    def send_sync(self, event: Event, timeout: float = 10.0) -> Position: ...


# -- bodies (also the OpenAPI schema) ---------------------------------------------------
class NewTweet(BaseModel):
    """The body of ``POST /v1/tweets``; the author is the authenticated user."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MAX_TEXT,
                      json_schema_extra={"pattern": NOT_ONLY_SPACE},
                      description=f"1..{MAX_TEXT} characters, not only whitespace.")

    @field_validator("text")
    @classmethod
    def _postable(cls, text: str) -> str:
        if not text.strip():  # the contract's rule (ingest.events), said before producing
            msg = "text is only whitespace"
            raise ValueError(msg)
        # JSON may carry lone surrogates (\ud800); they have no UTF-8 form downstream.
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            msg = "text must be valid Unicode (no lone surrogates)"
            raise ValueError(msg) from None
        return text


class Accepted(BaseModel):
    """The write is in the changelog; pass ``token`` as ``?after=`` to read it back."""

    token: str = Field(description="Consistency token of the write's changelog record.")


class PostAccepted(Accepted):
    """A tweet was posted."""

    tweet_id: str = Field(description="The new tweet's id (time-ordered). " + ID_NOTE)


class WriteError(BaseModel):
    """Every 4xx/5xx answer of a write."""

    error: str = Field(examples=["forbidden"])
    message: str
    field: str | None = None


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": WriteError, "description": "Bad id or body."},
    401: {"model": WriteError, "description": "Missing, invalid or expired bearer token."},
    403: {"model": WriteError, "description": "Acting for another user."},
    413: {"model": WriteError, "description": "Body too large."},
    503: {"model": WriteError, "description": "The changelog is unavailable; see Retry-After."},
    "4XX": {"model": WriteError, "description": "Client error."},  # and no FastAPI 422
}


# -- the process's producer -------------------------------------------------------------
class WriterStats(NamedTuple):
    """Errors the write path has seen; ``last_error`` is the newest, for logs and health."""

    errors: int
    last_error: str | None
    cooling_down: bool


class SharedProducer:
    """A lazily started :class:`ChangelogProducer` shared by the request threads.

    ``connect_timeout`` bounds the first connection, ``cooldown`` is how long sends
    fail fast after the broker was found unreachable, ``probe_every`` how stale the
    health probe may be. ``overrides`` go to the producer (librdkafka settings).
    """

    def __init__(self, settings: KafkaSettings, *, connect_timeout: float = 5.0,
                 cooldown: float = 2.0, probe_every: float = 5.0, **overrides: Any) -> None:
        self.settings = settings
        self._connect_timeout, self._cooldown = connect_timeout, cooldown
        self._probe_every = probe_every
        self._overrides = overrides
        self._producer: ChangelogProducer | None = None
        self._lock = threading.Lock()
        self._errors = 0
        self._last_error: str | None = None
        self._down_until = 0.0
        self._probe = _Probe(settings.bootstrap, probe_every)

    def send_sync(self, event: Event, timeout: float = 10.0) -> Position:
        """Produce and wait for the acknowledgement, failing fast while cooling down."""
        if time.monotonic() < self._down_until:
            msg = f"broker unreachable a moment ago; not retrying for {self._cooldown:g}s"
            raise BrokerUnavailable(msg)
        try:
            producer = self._get()
            producer.start(timeout=min(timeout, self._connect_timeout))
            return producer.send_sync(event, timeout)
        except IngestError as exc:
            self._failed(exc)
            raise

    def broker_reachable(self) -> bool | None:
        """Whether a broker answered a metadata request lately (None: none configured)."""
        return self._probe.reachable()

    @property
    def stats(self) -> WriterStats:
        with self._lock:
            return WriterStats(self._errors, self._last_error,
                               time.monotonic() < self._down_until)

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is in flight (bounded) and drop the producer."""
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.close(timeout)

    def _get(self) -> ChangelogProducer:
        with self._lock:
            if self._producer is None:
                self._producer = ChangelogProducer(self.settings, **self._overrides)
            return self._producer

    def _failed(self, exc: IngestError) -> None:
        log.warning("write not produced: %s", exc)
        with self._lock:
            self._errors += 1
            self._last_error = str(exc)
            broken, producer = self._producer is not None and self._producer.fatal, None
            if broken:  # it will never deliver again: the next write makes a new one
                producer, self._producer = self._producer, None
            elif not isinstance(exc, BrokerUnavailable | TopicLayoutError):
                return
            self._down_until = time.monotonic() + self._cooldown
        if producer is not None:
            log.warning("the producer hit a fatal error (%s); replacing it", exc)
            producer.close(0)
        self._probe.mark_down()


class _Probe:
    """A cached metadata request: at most one every ``every`` seconds, never concurrent.

    Each probe uses a fresh, quiet admin client: a long-lived one would keep
    reconnecting to a dead broker in the background and log every attempt.
    """

    def __init__(self, bootstrap: str, every: float, timeout: float = 1.0) -> None:
        self._bootstrap, self._every, self._timeout = bootstrap, every, timeout
        self._lock = threading.Lock()
        self._checked_at = -float("inf")
        self._ok = True

    def reachable(self) -> bool | None:
        if not self._bootstrap:
            return None
        if time.monotonic() - self._checked_at >= self._every and self._lock.acquire(False):
            try:
                self._ok = self._ask()
                self._checked_at = time.monotonic()
            finally:
                self._lock.release()
        return self._ok

    def mark_down(self) -> None:
        self._ok, self._checked_at = False, time.monotonic()

    def _ask(self) -> bool:
        admin = AdminClient({"bootstrap.servers": self._bootstrap, "log_level": 0})
        try:
            # All topics, never a named one: a broker that auto-creates topics would.
            admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            log.warning("health: broker %s unreachable: %s", self._bootstrap, exc)
            return False
        return True


# -- the routes ---------------------------------------------------------------------------
def write_router(get_producer: Callable[[], Sender], current_user: Callable[..., int], *,
                 timeout: float = 5.0, retry_after: int = 2,
                 author_of: Callable[[Request, int], int | None] | None = None,
                 ids: Snowflake | None = None,
                 clock: Callable[[], int] = now_ms) -> APIRouter:
    """The write routes; see the module docstring.

    ``timeout`` bounds each produce (seconds); ``retry_after`` is the Retry-After of
    a 503. ``author_of(request, tweet_id)`` — the author the views know, or None —
    lets a delete of someone else's tweet be refused with 403; without it (or while
    the views have not seen the tweet) a delete is produced under the caller's id.
    """
    writes = _Writes(get_producer, timeout, retry_after, ids or Snowflake(), clock)
    user_t = Annotated[int, Depends(current_user)]
    id_t = Annotated[str, Path(description=ID_NOTE, examples=["9223372036854775807"],
                               json_schema_extra=ID_PATH_SCHEMA)]
    router = APIRouter(tags=["writes"], responses=_RESPONSES, dependencies=[Depends(_no_query)])

    @router.post("/v1/tweets", status_code=202, summary="Post a tweet as the caller")
    def post_tweet(body: NewTweet, user: user_t) -> PostAccepted:
        """Append a post to the ``tweets`` changelog; the id is assigned here."""
        return writes.post(user, body.text)

    @router.delete("/v1/tweets/{tweet_id}", status_code=202,
                   summary="Delete one of the caller's tweets")
    def delete_tweet(request: Request, tweet_id: id_t, user: user_t) -> Accepted:
        """Append a delete; 403 if the views know the tweet as someone else's."""
        tweet = _id(tweet_id, "tweet_id")
        owner = author_of(request, tweet) if author_of is not None else None
        if owner is not None and owner != user:
            msg = f"tweet {tweet} belongs to another user"
            raise WriteRejected(403, "forbidden", msg, field="tweet_id")
        return writes.delete(user, tweet)

    @router.put("/v1/users/{user_id}/following/{other_id}", status_code=202,
                summary="Follow a user")
    def follow(user_id: id_t, other_id: id_t, user: user_t) -> Accepted:
        """The caller (``user_id``) starts following ``other_id`` (not themselves: 400)."""
        return writes.follow(user, user_id, other_id, active=True)

    @router.delete("/v1/users/{user_id}/following/{other_id}", status_code=202,
                   summary="Unfollow a user")
    def unfollow(user_id: id_t, other_id: id_t, user: user_t) -> Accepted:
        """The caller (``user_id``) stops following ``other_id`` (not themselves: 400)."""
        return writes.follow(user, user_id, other_id, active=False)

    return router


class _Writes:
    """Build, check and produce one event per request."""

    def __init__(self, get_producer: Callable[[], Sender], timeout: float, retry_after: int,
                 ids: Snowflake, clock: Callable[[], int]) -> None:
        self._get_producer, self._timeout = get_producer, timeout
        self._retry_after, self._ids, self._clock = retry_after, ids, clock

    def post(self, user: int, text: str) -> PostAccepted:
        tweet_id, created_at = self._ids.next()
        token = self._send(Post(tweet_id, user, created_at, text))
        return PostAccepted(tweet_id=str(tweet_id), token=token)

    def delete(self, user: int, tweet: int) -> Accepted:
        return Accepted(token=self._send(Delete(tweet, user, self._clock())))

    def follow(self, user: int, raw_user: str, raw_other: str, *, active: bool) -> Accepted:
        follower, other = _id(raw_user, "user_id"), _id(raw_other, "other_id")
        if follower != user:
            msg = f"the caller is user {user}; cannot change whom user {follower} follows"
            raise WriteRejected(403, "forbidden", msg, field="user_id")
        if follower == other:
            msg = "a user cannot follow or unfollow themselves"
            raise WriteRejected(400, "bad_request", msg, field="other_id")
        return Accepted(token=self._send(Follow(follower, other, self._clock(), active=active)))

    def _send(self, event: Event) -> str:
        _check_contract(event)
        try:
            position = self._get_producer().send_sync(event, self._timeout)
        except IngestError as exc:
            log.warning("write of %s %s refused with 503: %s", event.topic, event.op, exc)
            msg = f"the changelog cannot take writes right now; retry in {self._retry_after}s"
            raise WriteRejected(503, "unavailable", msg,
                                headers={"Retry-After": str(self._retry_after)}) from None
        return encode_token(event.topic, position.partition, position.offset)


def _no_query(request: Request) -> None:
    """Writes take no query parameters: refuse any rather than ignore a typo."""
    if request.query_params:
        name = next(iter(request.query_params))[:40]
        msg = f"unknown query parameter {name!r}: write routes take none"
        raise WriteRejected(400, "bad_request", msg, field=name)


def _check_contract(event: Event) -> None:
    """Refuse what the job would dead-letter: the contract's own decoder decides."""
    try:
        decode(event.topic, *encode(event))
    except InvalidEvent as exc:
        raise WriteRejected(400, "bad_request", str(exc)) from None


def _id(raw: str, field: str) -> int:
    """A positive 64-bit id from its decimal form (the read API's rule), or 400."""
    digits = raw.isascii() and raw.isdigit()
    value = int(raw) if digits and len(raw) <= 20 else 0
    if not 1 <= value <= MAX_ID:
        msg = f"{field} must be a decimal integer in [1, 2^63-1], got {raw[:40]!r}"
        raise WriteRejected(400, "bad_request", msg, field=field)
    return value
