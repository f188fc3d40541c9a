"""Timeline pages as JSON bytes: entries hydrated from their page's rows, serialized by orjson.

This is the read path's hot loop, so it builds plain dicts and serializes them with
orjson: no per-entry model is built or validated. The dicts are typed by the shapes
of :mod:`serving.shapes`, which the routes' OpenAPI schema is built from too, so mypy
holds them to the one declaration; ``tests/serving/test_api.py`` reads pages back
against it and checks them against the SQL.

Each entry says what it is: ``kind`` (post, reply or repost), the ``actor`` (the
author, or the reposter) and the ``tweet`` shown, hydrated with its author, with
``referenced_tweets`` when the kind of record that posted it names another tweet. A page
from :mod:`serving.timeline` carries the rows it was decided on, so rendering reads
nothing; for bare entries (:func:`hydrated` without rows) the rows are read in two
bulk reads, and entries whose tweet is gone by then are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

import orjson

from ingest.events import BY_CODE
from serving.cursor import Since, encode_cursor, encode_gap
from serving.shapes import Author, NewCount, TimelineEntry, TimelinePage, Tweet
from serving.visibility import HomeEntry
from views.delta import Key
from views.stores.contract import TimelineReader
from views.stores.rows import TweetRow, UserRow

_EPOCH = datetime(1970, 1, 1)  # naive UTC, rendered with a "Z" suffix


def iso_millis(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC with milliseconds and a ``Z``."""
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds") + "Z"


def hydrated(store: TimelineReader, entries: Sequence[HomeEntry],
             tweets: Mapping[int, TweetRow] | None = None,
             users: Mapping[int, UserRow] | None = None) -> list[TimelineEntry]:
    """Entries as :class:`~serving.shapes.TimelineEntry`, page order.

    ``tweets``/``users``: the rows the page was decided on (a user without a profile
    is simply not there); without them, they are read (one bulk read each). An entry
    whose original is not a live tweet in the rows is left out.
    """
    if tweets is None:
        tweets = store.tweets(list({e.original_id for e in entries})) if entries else {}
    if users is None:
        people = {e.author_id for e in entries} | {e.original_author for e in entries}
        users = store.users(list(people)) if people else {}
    out = []
    render = _Render(users)
    for entry in entries:
        tweet = tweets.get(entry.original_id)
        if tweet is not None and not tweet.deleted:
            out.append(render.entry(entry, tweet))
    return out


class _Render:
    """Builds entry dicts, each user's and each time's part once per page."""

    def __init__(self, users: Mapping[int, UserRow]) -> None:
        self.users = users
        self.people: dict[int, Author] = {}
        self.times: dict[int, str] = {}

    def entry(self, entry: HomeEntry, tweet: TweetRow) -> TimelineEntry:
        return entry_dict(entry, tweet, self.person(entry.author_id),
                          self.person(tweet.author_id), self.iso)

    def person(self, user: int) -> Author:
        found = self.people.get(user)
        if found is None:
            row = self.users.get(user)
            known = row is not None and bool(row.handle)
            found = self.people[user] = {"id": str(user),
                                         "handle": row.handle if known and row else None,
                                         "name": row.name if known and row else None}
        return found

    def iso(self, ms: int) -> str:
        found = self.times.get(ms)
        if found is None:
            found = self.times[ms] = iso_millis(ms)
        return found


def entry_dict(entry: HomeEntry, tweet: TweetRow, actor: Author, author: Author,
               iso: Callable[[int], str] = iso_millis) -> TimelineEntry:
    """One :class:`~serving.shapes.TimelineEntry`."""
    shown: Tweet = {"id": str(tweet.tweet_id), "created_at": tweet.created_at,
                    "created_at_iso": iso(tweet.created_at), "text": tweet.text,
                    "author": author,
                    "in_reply_to_user_id": str(tweet.reply_to) if tweet.reply_to else None}
    if tweet.ref_id:
        shown["referenced_tweets"] = [{"type": reference_type(tweet.record),
                                       "id": str(tweet.ref_id)}]
    return {"tweet_id": str(entry.tweet_id), "kind": entry.kind,
            "created_at": entry.created_at, "created_at_iso": iso(entry.created_at),
            "actor": actor, "tweet": shown}


def reference_type(record: int) -> str:
    """How a tweet posted by a record of kind ``record`` refers to its ``ref_id``: the op.

    From the table of kinds (``ingest.events.KINDS``), so a new kind that posts names
    its reference without a line here; a code no kind declares says only ``tweet``.
    """
    kind = BY_CODE.get(record)
    return kind.op if kind is not None else "tweet"


def page_body(user: int, entries: list[TimelineEntry], next_key: Key | None,
              consistent: bool | None = None, *, since: bool = False,
              gap: Since | None = None, gap_above: bool = False) -> bytes:
    """A :class:`~serving.shapes.TimelinePage` as JSON; ``consistent`` only when given.

    ``top_cursor`` is the position of the first entry (absent from an empty page).
    ``since``: a page of what is new, with ``gap``, ``gap_cursor`` (``gap``'s span,
    when there is one) and ``gap_above`` (whether that span is above the entries).
    """
    body: TimelinePage = {
        "user_id": str(user), "entries": entries,
        "next_cursor": encode_cursor(next_key) if next_key is not None else None}
    if entries:
        first = entries[0]
        body["top_cursor"] = encode_cursor((first["created_at"], int(first["tweet_id"])))
    if since:
        body["gap"] = gap is not None
        body["gap_cursor"] = _gap_cursor(gap) if gap is not None else None
        body["gap_above"] = gap_above
    if consistent is not None:
        body["consistent"] = consistent
    return orjson.dumps(body)


def _gap_cursor(gap: Since) -> str:
    if gap.ceiling is None:
        return encode_cursor(gap.floor)
    return encode_gap(gap.floor, gap.ceiling)


def count_body(user: int, count: int, capped: bool, consistent: bool | None = None) -> bytes:
    """A :class:`~serving.shapes.NewCount` as JSON; ``consistent`` only when given."""
    body: NewCount = {"user_id": str(user), "count": count, "capped": capped}
    if consistent is not None:
        body["consistent"] = consistent
    return orjson.dumps(body)
