"""The timeline responses' shape, declared once: what the routes document and render builds.

Each is a ``TypedDict``, so one declaration serves both sides: FastAPI builds the
OpenAPI schema from it (descriptions and examples in ``Field``), and
:mod:`serving.render`, the read path's hot loop, builds plain dicts typed by it, which
mypy holds to its keys and types and orjson serializes with no model in between.
:func:`parse_page` and :func:`parse_count` read a body back against the shape,
refusing a key it does not declare.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, TypeAdapter, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic needs these below 3.12

from serving.ids import ID_NOTE

#: The most new entries a count says (:attr:`serving.reads.Read.count`): past it,
#: "at least" (``capped``).
NEW_COUNT_CAP: Final = 100

_STRICT = ConfigDict(extra="forbid")


@with_config(_STRICT)
class Author(TypedDict):
    """A user (an entry's actor, a tweet's author); handle and name null without a profile."""

    id: Annotated[str, Field(description="User id as a decimal string. " + ID_NOTE,
                             examples=["9223372036854775807"])]
    handle: str | None
    name: str | None


@with_config(_STRICT)
class ReferencedTweet(TypedDict):
    """A tweet another refers to, and how: the kind of record that posted the other."""

    type: Annotated[str, Field(description="The op of the record that posted the referring "
                                           "tweet (ingest.events.KINDS), e.g. quote.",
                               examples=["quote"])]
    id: Annotated[str, Field(description="The tweet referred to, a decimal string. " + ID_NOTE,
                             examples=["9223372036854775805"])]


@with_config(_STRICT)
class Tweet(TypedDict):
    """The tweet an entry shows, hydrated with its author."""

    id: Annotated[str, Field(description="Tweet id as a decimal string. " + ID_NOTE,
                             examples=["9223372036854775806"])]
    created_at: Annotated[int, Field(description="When the tweet was posted, epoch "
                                                 "milliseconds.")]
    created_at_iso: Annotated[str, Field(description="created_at as ISO 8601 UTC.")]
    text: str
    author: Author
    in_reply_to_user_id: Annotated[str | None, Field(
        description="For a reply, the user it answers (decimal string); else null.")]
    referenced_tweets: NotRequired[Annotated[list[ReferencedTweet], Field(
        description="The tweet this one refers to, for a kind of post that names one; "
                    "absent otherwise.")]]


@with_config(_STRICT)
class TimelineEntry(TypedDict):
    """One entry: a post, a reply, or a repost of someone's tweet (DESIGN §4b)."""

    tweet_id: Annotated[str, Field(description="The entry's own id: the post's, or the "
                                               "repost's (not the original's). " + ID_NOTE,
                                   examples=["9223372036854775806"])]
    kind: Annotated[Literal["post", "reply", "repost"], Field(
        description="post: the actor's tweet; reply: the actor's tweet answering "
                    "in_reply_to_user_id; repost: the actor shares tweet (another's).")]
    created_at: Annotated[int, Field(description="When the entry was made (posted or "
                                                 "reposted), epoch milliseconds; the "
                                                 "timeline's order.")]
    created_at_iso: Annotated[str, Field(description="created_at as ISO 8601 UTC, e.g. "
                                                     "2024-05-01T12:00:00.000Z.")]
    actor: Annotated[Author, Field(description="Who made the entry: the author, or the "
                                               "reposter.")]
    tweet: Annotated[Tweet, Field(description="The tweet shown: for a post or reply the "
                                              "entry itself, for a repost the original.")]


@with_config(_STRICT)
class TimelinePage(TypedDict):
    """A page of a timeline, newest first."""

    user_id: Annotated[str, Field(description="The user (or author) whose timeline this "
                                              "is. " + ID_NOTE)]
    entries: list[TimelineEntry]
    next_cursor: Annotated[str | None, Field(
        description="Pass as ?cursor= for the next (older) page; null when there is none "
                    "(always on a page read with ?since=).")]
    top_cursor: NotRequired[Annotated[str, Field(
        description="The first entry's position: pass it as ?since= to read what is "
                    "newer. Absent from an empty page.")]]
    gap: NotRequired[Annotated[bool, Field(
        description="Only with ?since=: true if more entries are new than the page "
                    "holds; gap_cursor then names the ones left out.")]]
    gap_cursor: NotRequired[Annotated[str | None, Field(
        description="Only with ?since=: pass as ?since= to read the new entries the page "
                    "left out, from the bottom up (the oldest first, just above the "
                    "position the since read started from); null when gap is false.")]]
    gap_above: NotRequired[Annotated[bool, Field(
        description="Only with ?since=: true if the entries left out are newer than this "
                    "page's (a gap filled from the bottom up), false if older (the first "
                    "page of what is new, or a gap too large to fill from the bottom, "
                    "answered from its top) or if none are.")]]
    consistent: NotRequired[Annotated[bool, Field(
        description="Only with ?after=TOKEN: true if the view had applied that write "
                    "when the page was read, false if the wait timed out.")]]


@with_config(_STRICT)
class NewCount(TypedDict):
    """How many home entries are newer than a position: what a "12 new posts" pill shows."""

    user_id: Annotated[str, Field(description="The user whose home timeline this is. "
                                              + ID_NOTE)]
    count: Annotated[int, Field(description=f"How many entries ?since= would read, at "
                                            f"most {NEW_COUNT_CAP}.")]
    capped: Annotated[bool, Field(description=f"true: more than {NEW_COUNT_CAP} are new "
                                              f"(count is the cap).")]
    consistent: NotRequired[Annotated[bool, Field(
        description="Only with ?after=TOKEN: true if the view had applied that write "
                    "when the count was read, false if the wait timed out.")]]


_PAGE: Final = TypeAdapter(TimelinePage)
_COUNT: Final = TypeAdapter(NewCount)
_ENTRY: Final = TypeAdapter(TimelineEntry)


def parse_page(body: bytes | str) -> TimelinePage:
    """A page's JSON read against :class:`TimelinePage` (ValidationError if it is not one)."""
    return _PAGE.validate_json(body)


def parse_count(body: bytes | str) -> NewCount:
    """A new-count's JSON read against :class:`NewCount`."""
    return _COUNT.validate_json(body)


def parse_entry(entry: object) -> TimelineEntry:
    """An entry (as a stream event carries it) read against :class:`TimelineEntry`."""
    return _ENTRY.validate_python(entry)
