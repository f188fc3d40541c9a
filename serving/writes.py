"""HTTP write routes: every write of the API becomes one changelog record (DESIGN §2, §7).

``POST /v1/tweets``, ``DELETE /v1/tweets/{tweet_id}`` and
``PUT|DELETE /v1/users/{user_id}/following/{other_id}`` build an event, check it
against the changelog contract (the same :func:`ingest.events.decode` the job runs,
so nothing the API accepts is dead-lettered later), produce it with acks=all through
ingest's producer (:class:`~ingest.writer.SharedProducer` in the app) and answer 202
with a consistency token naming where it landed (:mod:`ingest.consistency`). There
are no dual writes: the views learn of the write from the changelog only.

The routes share the read routes' conventions: ids parsed by
:func:`serving.ids.parse_id`, unknown query parameters refused by
:func:`serving.query.only_query`, failures raised as :mod:`serving.errors` and
answered in the one JSON error shape (:class:`serving.handlers.ErrorBody`). Who the
caller is comes from ``current_user``, a dependency the app supplies (its auth) that
returns the acting user's id or raises.
"""

# No ``from __future__ import annotations``: FastAPI resolves the route signatures.

import logging
from collections.abc import Callable
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ingest.consistency import encode_token
from ingest.errors import IngestError, InvalidEvent
from ingest.events import MAX_TEXT, Delete, Event, Follow, Post, decode, encode
from ingest.producer import Position
from ingest.snowflake import Snowflake, now_ms
from serving.errors import BadRequest, Forbidden, Unavailable
from serving.handlers import ErrorBody
from serving.ids import ID_NOTE, ID_PATH_SCHEMA, parse_id
from serving.query import only_query

log = logging.getLogger(__name__)


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
    """What the routes need of a producer (:class:`~ingest.writer.SharedProducer` has it)."""

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


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Bad id or body."},
    401: {"model": ErrorBody, "description": "Missing, invalid or expired bearer token."},
    403: {"model": ErrorBody, "description": "Acting for another user."},
    413: {"model": ErrorBody, "description": "Body too large."},
    503: {"model": ErrorBody, "description": "The changelog is unavailable; see Retry-After."},
    "4XX": {"model": ErrorBody, "description": "Client error."},  # and no FastAPI 422
}


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
    id_t = Annotated[str, Path(description="Decimal, in [1, 2^63-1]. " + ID_NOTE,
                               examples=["9223372036854775807"],
                               json_schema_extra=ID_PATH_SCHEMA)]
    router = APIRouter(tags=["writes"], responses=_RESPONSES,
                       dependencies=[Depends(only_query())])

    @router.post("/v1/tweets", status_code=202, summary="Post a tweet as the caller")
    def post_tweet(body: NewTweet, user: user_t) -> PostAccepted:
        """Append a post to the ``tweets`` changelog; the id is assigned here."""
        return writes.post(user, body.text)

    @router.delete("/v1/tweets/{tweet_id}", status_code=202,
                   summary="Delete one of the caller's tweets")
    def delete_tweet(request: Request, tweet_id: id_t, user: user_t) -> Accepted:
        """Append a delete; 403 if the views know the tweet as someone else's."""
        tweet = parse_id(tweet_id, "tweet_id")
        owner = author_of(request, tweet) if author_of is not None else None
        if owner is not None and owner != user:
            msg = f"tweet {tweet} belongs to another user"
            raise Forbidden(msg, field="tweet_id")
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
        follower, other = parse_id(raw_user, "user_id"), parse_id(raw_other, "other_id")
        if follower != user:
            msg = f"the caller is user {user}; cannot change whom user {follower} follows"
            raise Forbidden(msg, field="user_id")
        if follower == other:
            msg = "a user cannot follow or unfollow themselves"
            raise BadRequest(msg, field="other_id")
        return Accepted(token=self._send(Follow(follower, other, self._clock(), active=active)))

    def _send(self, event: Event) -> str:
        _check_contract(event)
        try:
            position = self._get_producer().send_sync(event, self._timeout)
        except IngestError as exc:
            log.warning("write of %s %s refused with 503: %s", event.topic, event.op, exc)
            msg = f"the changelog cannot take writes right now; retry in {self._retry_after}s"
            raise Unavailable(msg, headers={"Retry-After": str(self._retry_after)}) from None
        return encode_token(event.topic, position.partition, position.offset)


def _check_contract(event: Event) -> None:
    """Refuse what the job would dead-letter: the contract's own decoder decides."""
    try:
        decode(event.topic, *encode(event))
    except InvalidEvent as exc:
        raise BadRequest(str(exc)) from None
