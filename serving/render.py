"""Timeline pages as JSON bytes: hydrated from the store, serialized once with orjson.

This is the read path's hot loop, so it builds plain dicts and serializes them with
orjson: no per-entry pydantic model is built or validated. The bytes are what
:class:`serving.app.TimelinePage` describes (the OpenAPI schema stays that model);
``tests/test_api.py`` checks a page against the model and the SQL.

Hydration is two bulk reads per page (tweets, then their authors); tweets deleted
since the page was assembled are dropped, because the tweet rows carry the delete
marker and are read after the page's keys.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import orjson

from serving.cursor import encode_cursor
from views.delta import Key
from views.stores.base import Entry, Store, TweetRow, UserRow

_EPOCH = datetime(1970, 1, 1)  # naive UTC, rendered with a "Z" suffix


def iso_millis(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC with milliseconds and a ``Z``."""
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds") + "Z"


def live_rows(store: Store, entries: list[Entry]) -> list[tuple[TweetRow, UserRow | None]]:
    """The live tweets of ``entries`` (page order) with their authors' profiles."""
    if not entries:
        return []
    found = store.tweets([e.tweet_id for e in entries])
    live = [t for e in entries if (t := found.get(e.tweet_id)) is not None and not t.deleted]
    users = store.users(list(dict.fromkeys(t.author_id for t in live))) if live else {}
    return [(t, users.get(t.author_id)) for t in live]


def entry_dict(tweet: TweetRow, user: UserRow | None) -> dict[str, Any]:
    """One entry in the shape of :class:`serving.app.TimelineEntry`."""
    return {"tweet_id": str(tweet.tweet_id), "created_at": tweet.created_at,
            "created_at_iso": iso_millis(tweet.created_at), "text": tweet.text,
            "author": {"id": str(tweet.author_id), "handle": user.handle if user else None,
                       "name": user.name if user else None}}


def page_body(user: int, entries: list[dict[str, Any]], next_key: Key | None,
              consistent: bool | None = None) -> bytes:
    """A :class:`serving.app.TimelinePage` as JSON; ``consistent`` only when given."""
    body: dict[str, Any] = {
        "user_id": str(user), "entries": entries,
        "next_cursor": encode_cursor(next_key) if next_key is not None else None}
    if consistent is not None:
        body["consistent"] = consistent
    return orjson.dumps(body)
