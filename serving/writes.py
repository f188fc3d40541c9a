"""HTTP write routes: every write of the API becomes one changelog record (DESIGN §2, §7, §4b).

``POST /v1/tweets`` (a reply with ``in_reply_to``), ``DELETE /v1/tweets/{tweet_id}``,
``POST /v1/tweets/{tweet_id}/reposts``, ``DELETE /v1/reposts/{repost_id}``,
``PUT|DELETE /v1/users/{user_id}/following|blocks|mutes/{other_id}`` and
``DELETE /v1/users/{user_id}`` (the account) build an event, check it
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

**What the views are asked.** A repost names its original's author and a reply its
addressee, so those routes look the tweet up in the store (``store_of``): a repost of
a repost reposts its original, a reply to a repost answers the original's author, and
a tweet the views do not know (or know deleted) is a 404 — the record could not be
written right. A repost of a tweet the caller already shows a repost of is a 409 (the
join would make it a no-op). A delete or an unrepost the views have not seen yet is
produced under the caller's id (right after the write, the view may lag); one they
know as another user's is a 403.
"""

# No ``from __future__ import annotations``: FastAPI resolves the route signatures.

import logging
from collections.abc import Callable
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ingest.consistency import encode_token
from ingest.errors import IngestError, InvalidEvent
from ingest.events import (
    BLOCK,
    FOLLOW,
    FOLLOWS,
    MAX_TEXT,
    MUTE,
    OPS,
    AccountDelete,
    Delete,
    Event,
    Post,
    Repost,
    Unrepost,
    decode,
    edge_op,
    encode,
)
from ingest.producer import Position
from ingest.snowflake import Snowflake, now_ms
from serving.errors import BadRequest, Conflict, Forbidden, NotFound, Unavailable
from serving.handlers import ErrorBody
from serving.ids import ID_NOTE, ID_PATH_SCHEMA, parse_id
from serving.query import only_query
from views.stores.contract import TimelineReader
from views.stores.rows import TweetRow

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
    in_reply_to: str | None = Field(
        None, pattern="^[0-9]{1,20}$", examples=["9223372036854775806"],
        description="The id of the tweet this one answers (decimal string): the reply is "
                    "addressed to its author, and shown to followers who also follow them. "
                    "A reply to a repost answers the original. " + ID_NOTE)

    @field_validator("in_reply_to", mode="before")
    @classmethod
    def _id_text(cls, value: object) -> object:
        # A JSON number is accepted too (exact here, though not in JavaScript).
        return str(value) if type(value) is int else value

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
    in_reply_to_user_id: str | None = Field(
        None, description="For a reply to another user's tweet: the user it answers "
                          "(absent otherwise, and for a reply to oneself).")


class RepostAccepted(Accepted):
    """A repost was made."""

    repost_id: str = Field(description="The repost's own id (its timeline entry). " + ID_NOTE)
    original_id: str = Field(description="The tweet reposted (a repost of a repost "
                                         "reposts the original). " + ID_NOTE)


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Bad id or body."},
    401: {"model": ErrorBody, "description": "Missing, invalid or expired bearer token."},
    403: {"model": ErrorBody, "description": "Acting for another user."},
    413: {"model": ErrorBody, "description": "Body too large."},
    503: {"model": ErrorBody, "description": "The changelog is unavailable; see Retry-After."},
    "4XX": {"model": ErrorBody, "description": "Client error."},  # and no FastAPI 422
}


_UNKNOWN: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "The tweet named is not known, or deleted."}}


# -- the routes ---------------------------------------------------------------------------
def write_router(get_producer: Callable[[], Sender], current_user: Callable[..., int], *,
                 store_of: Callable[[Request], TimelineReader], timeout: float = 5.0,
                 retry_after: int = 2, ids: Snowflake | None = None,
                 clock: Callable[[], int] = now_ms) -> APIRouter:
    """The write routes; see the module docstring.

    ``timeout`` bounds each produce (seconds); ``retry_after`` is the Retry-After of
    a 503. ``store_of(request)`` is the views' store, asked what the module docstring
    says (and nothing else: every write still goes to the changelog only).
    """
    writes = _Writes(get_producer, timeout, retry_after, ids or Snowflake(), clock)
    user_t = Annotated[int, Depends(current_user)]
    id_t = Annotated[str, Path(description="Decimal, in [1, 2^63-1]. " + ID_NOTE,
                               examples=["9223372036854775807"],
                               json_schema_extra=ID_PATH_SCHEMA)]
    router = APIRouter(tags=["writes"], responses=_RESPONSES,
                       dependencies=[Depends(only_query())])

    @router.post("/v1/tweets", status_code=202, summary="Post a tweet or a reply as the caller",
                 response_model_exclude_none=True, responses=_UNKNOWN)
    def post_tweet(request: Request, body: NewTweet, user: user_t) -> PostAccepted:
        """Append a post to the ``tweets`` changelog; the id is assigned here.

        With ``in_reply_to``, a reply addressed to that tweet's author (404 if the views
        do not know the tweet, or it is deleted).
        """
        reply_to = 0
        if body.in_reply_to is not None:
            target = _shown_tweet(store_of(request), parse_id(body.in_reply_to, "in_reply_to"),
                                  "in_reply_to")
            reply_to = target.author_id if target.author_id != user else 0
        return writes.post(user, body.text, reply_to)

    @router.delete("/v1/tweets/{tweet_id}", status_code=202,
                   summary="Delete one of the caller's tweets")
    def delete_tweet(request: Request, tweet_id: id_t, user: user_t) -> Accepted:
        """Append a delete; 403 if the views know the tweet as someone else's."""
        tweet = parse_id(tweet_id, "tweet_id")
        _owned(store_of(request), tweet, user, "tweet_id")
        return writes.send(Delete(tweet, user, writes.now()))

    @router.post("/v1/tweets/{tweet_id}/reposts", status_code=202, responses={
        **_UNKNOWN, 409: {"model": ErrorBody, "description": "The caller already shows a "
                                                             "repost of this tweet."}},
                 summary="Repost a tweet as the caller")
    def repost(request: Request, tweet_id: id_t, user: user_t) -> RepostAccepted:
        """Append a repost of the tweet (of its original, if it is itself a repost)."""
        store = store_of(request)
        original = _shown_tweet(store, parse_id(tweet_id, "tweet_id"), "tweet_id")
        mine = [r for r in store.reposts_of([original.tweet_id]).get(original.tweet_id, ())
                if r.author_id == user]
        if mine:
            msg = (f"user {user} already reposted tweet {original.tweet_id} "
                   f"(repost {mine[0].tweet_id}); DELETE /v1/reposts/{mine[0].tweet_id} first")
            raise Conflict(msg, field="tweet_id")
        return writes.repost(user, original)

    @router.delete("/v1/reposts/{repost_id}", status_code=202,
                   summary="Undo one of the caller's reposts", responses={
                       404: {"model": ErrorBody, "description": "The id is a post's."}})
    def unrepost(request: Request, repost_id: id_t, user: user_t) -> Accepted:
        """Append an unrepost; 403 if the views know the repost as someone else's."""
        repost_id_ = parse_id(repost_id, "repost_id")
        known = _owned(store_of(request), repost_id_, user, "repost_id")
        if known is not None and not known.is_repost:
            msg = f"{repost_id_} is a post, not a repost: DELETE /v1/tweets/{repost_id_}"
            raise NotFound(msg, field="repost_id")
        return writes.send(Unrepost(repost_id_, user, writes.now()))

    def edge_routes(path: str, edge: str) -> None:
        """PUT and DELETE ``/v1/users/{user_id}/<path>/{other_id}`` for one kind of edge."""
        on, off = edge_op(edge, True), edge_op(edge, False)

        def put(user_id: id_t, other_id: id_t, user: user_t) -> Accepted:
            return writes.edge(user, user_id, other_id, edge, active=True)

        def delete(user_id: id_t, other_id: id_t, user: user_t) -> Accepted:
            return writes.edge(user, user_id, other_id, edge, active=False)

        for method, verb, handler in (("PUT", on, put), ("DELETE", off, delete)):
            router.add_api_route(
                f"/v1/users/{{user_id}}/{path}/{{other_id}}", handler, methods=[method],
                status_code=202, summary=f"{verb.capitalize()} a user", name=f"{verb}_user",
                description=f"The caller (``user_id``) {verb}s ``other_id`` (not "
                            "themselves: 400).", response_model=Accepted)

    for path, edge in (("following", FOLLOW), ("blocks", BLOCK), ("mutes", MUTE)):
        edge_routes(path, edge)

    @router.delete("/v1/users/{user_id}", status_code=202, summary="Delete the caller's account")
    def delete_account(user_id: id_t, user: user_t) -> Accepted:
        """The account is gone for good: its tweets, reposts and home leave every view."""
        writes.acting(user, parse_id(user_id, "user_id"), "delete the account of")
        return writes.send(AccountDelete(user, writes.now()))

    return router


def _shown_tweet(store: TimelineReader, tweet_id: int, field: str) -> TweetRow:
    """The live post ``tweet_id`` names (its original, for a repost), or 404."""
    row = store.tweets([tweet_id]).get(tweet_id)
    if row is not None and row.is_repost and not row.deleted:
        row = store.tweets([row.original_id]).get(row.original_id)
    if row is None or row.deleted or row.is_repost:
        msg = f"tweet {tweet_id} is not known to the views, or is deleted"
        raise NotFound(msg, field=field)
    return row


def _owned(store: TimelineReader, tweet_id: int, user: int, field: str) -> TweetRow | None:
    """The row the views know for ``tweet_id`` (None if none); 403 if another user's."""
    row = store.tweets([tweet_id]).get(tweet_id)
    if row is not None and row.author_id != user:
        msg = f"{field.removesuffix('_id')} {tweet_id} belongs to another user"
        raise Forbidden(msg, field=field)
    return row


class _Writes:
    """Build, check and produce one event per request."""

    def __init__(self, get_producer: Callable[[], Sender], timeout: float, retry_after: int,
                 ids: Snowflake, clock: Callable[[], int]) -> None:
        self._get_producer, self._timeout = get_producer, timeout
        self._retry_after, self._ids, self.now = retry_after, ids, clock

    def post(self, user: int, text: str, reply_to: int = 0) -> PostAccepted:
        tweet_id, created_at = self._ids.next()
        token = self._send(Post(tweet_id, user, created_at, text, reply_to))
        return PostAccepted(tweet_id=str(tweet_id), token=token,
                            in_reply_to_user_id=str(reply_to) if reply_to else None)

    def repost(self, user: int, original: TweetRow) -> RepostAccepted:
        repost_id, created_at = self._ids.next()
        token = self._send(Repost(repost_id, user, original.tweet_id, original.author_id,
                                  created_at))
        return RepostAccepted(repost_id=str(repost_id), original_id=str(original.tweet_id),
                              token=token)

    def send(self, event: Event) -> Accepted:
        return Accepted(token=self._send(event))

    @staticmethod
    def acting(user: int, named: int, what: str) -> None:
        """403 unless the path's user is the caller."""
        if named != user:
            msg = f"the caller is user {user}; cannot {what} user {named}"
            raise Forbidden(msg, field="user_id")

    def edge(self, user: int, raw_user: str, raw_other: str, edge: str, *,
             active: bool) -> Accepted:
        actor, other = parse_id(raw_user, "user_id"), parse_id(raw_other, "other_id")
        verb = edge_op(edge, active)
        self.acting(user, actor, f"{verb} on behalf of")
        if actor == other:
            msg = f"a user cannot {verb} themselves"
            raise BadRequest(msg, field="other_id")
        kind = OPS[FOLLOWS][verb]  # the contract's kind of that op: a Follow or a Relation
        return self.send(kind.make(actor, other, self.now(), **kind.implied))

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
