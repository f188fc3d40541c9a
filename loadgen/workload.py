"""The workload model: who acts, how often, and in which mix of reads and writes.

A :class:`Workload` ranks users twice — readers by activity (how many accounts they
follow) and authors by popularity (followers) — and draws from each ranking with
Zipf-like weights ``1 / rank**exponent``, so a few users read and are followed far
more than the rest, as on Twitter. It comes from a JSON file that ``fanout load``
writes from the store (:func:`Workload.load`), or, for a plain ``locust`` run, from an
id range ranked by a seeded shuffle (:func:`Workload.from_range`).

A :class:`Mix` weighs the actions. Named profiles cover the usual cases; the default,
``social``, has about 65 timeline reads per write, Twitter's published ratio (300k
read QPS against 4.6k write QPS in 2012), like ``read-heavy``; where ``read-heavy``
posts, it splits the same weight into posts, replies and reposts and adds the undos,
blocks, mutes and account deletions of DESIGN §4b, in the proportions of the
synthetic histories (:data:`ingest.social.SOCIAL`, where their sources are given).
Nothing here touches the network or Locust, so it is tested as plain code.
"""

from __future__ import annotations

import bisect
import itertools
import json
import random
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from ingest.social import SOCIAL, RecordMix
from loadgen.errors import WorkloadError

WORKLOAD_VERSION: Final = 1
DEFAULT_PROFILE: Final = "social"
#: The weight of tweet-like writes (posts, replies, reposts): ``read-heavy``'s posts.
TWEET_WEIGHT: Final = 0.6
#: Users per post in ``fanout generate``'s and the demo's default histories (10,000 users
#: and 100,000 posts; 2,000 and 20,000): turns the share of users whose account is
#: deleted over a history into a rate per post.
USERS_PER_POST: Final = 0.1
#: The share of ``social``'s simulated users that hold a live home stream rather than
#: act: one in ten, a few streams in a default ``fanout load`` (32 users) beside the
#: readers and writers, enough to time the push of their posts to followers.
STREAM_SHARE: Final = 0.1


@dataclass(frozen=True)
class Mix:
    """Relative weights of the actions; ``page`` is the chance a home read pages on.

    Reads: ``home`` (a home timeline, first page) and ``tweets`` (an author's own
    tweets). Writes: ``post``; ``reply`` and ``repost`` (to or of a tweet the actor's
    home timeline shows: the actor reads it first); ``unrepost`` (one of the reposts
    this run made); ``delete`` (one of the tweets this run posted); ``follow``,
    ``block`` and ``mute`` and their undos ``unfollow``, ``unblock`` and ``unmute`` (an
    edge this run created); ``delete_account``. The defaults are ``read-heavy``. A home
    read continues to the next page with probability ``page``, up to ``max_pages``.
    ``streams`` is not an action: the share of the simulated users that hold a live
    home stream instead of acting (``loadgen.streamer``; ``social`` has 0.1).
    """

    home: float = 62.0
    tweets: float = 3.0
    post: float = 0.6
    reply: float = 0.0
    repost: float = 0.0
    unrepost: float = 0.0
    delete: float = 0.1
    follow: float = 0.2
    unfollow: float = 0.1
    block: float = 0.0
    unblock: float = 0.0
    mute: float = 0.0
    unmute: float = 0.0
    delete_account: float = 0.0
    page: float = 0.2
    max_pages: int = 3
    streams: float = 0.0

    def __post_init__(self) -> None:
        weights = self.weights()
        if any(w < 0 for w in weights.values()) or not sum(weights.values()) > 0:
            msg = f"mix weights must be >= 0 and not all 0, got {weights}"
            raise WorkloadError(msg)
        if not 0 <= self.page <= 1 or self.max_pages < 1:
            msg = f"page must be in [0, 1] and max_pages >= 1, got {self.page}, {self.max_pages}"
            raise WorkloadError(msg)
        if not 0 <= self.streams < 1:
            msg = f"streams (a share of the users) must be in [0, 1), got {self.streams}"
            raise WorkloadError(msg)

    def weights(self) -> dict[str, float]:
        """Action name → weight, in a fixed order."""
        return {name: float(getattr(self, name)) for name in ACTIONS}

    def stream_users(self, users: int) -> int:
        """How many of ``users`` simulated users hold a stream: the share, rounded."""
        return round(users * self.streams)

    def reads_per_write(self) -> float:
        """First-page reads per write (inf for a read-only mix)."""
        w = self.weights()
        writes = sum(w[a] for a in WRITES)
        return float("inf") if writes == 0 else (w["home"] + w["tweets"]) / writes

    def describe(self) -> str:
        """``home=62,tweets=3,...`` — the form :func:`parse_mix` reads back."""
        return ",".join(f"{f.name}={getattr(self, f.name):g}" for f in fields(self))


ACTIONS: Final = ("home", "tweets", "post", "reply", "repost", "unrepost", "delete", "follow",
                  "unfollow", "block", "unblock", "mute", "unmute", "delete_account")
WRITES: Final = ACTIONS[2:]


def social_mix(records: RecordMix = SOCIAL, tweets: float = TWEET_WEIGHT) -> Mix:
    """The read-heavy mix with its ``tweets`` weight of writes split as ``records`` says.

    ``records`` gives replies as a share of posts and reposts per post, so posts
    (replies included) are ``tweets / (1 + reposts)``; blocks and mutes are per post,
    their undos and unreposts a share of them, and account deletions a share of the
    users (:data:`USERS_PER_POST` per post). Reads, deletes, follows and unfollows stay
    as in ``read-heavy``; :data:`STREAM_SHARE` of the users hold a live stream.
    Weights keep four significant digits, so that
    :meth:`Mix.describe` reads back as the same mix.
    """
    posts = tweets / (1 + records.reposts)
    blocks, mutes = posts * records.blocks, posts * records.mutes
    reposts = posts * records.reposts
    weights = {"post": posts * (1 - records.replies), "reply": posts * records.replies,
               "repost": reposts, "unrepost": reposts * records.unrepost_ratio,
               "block": blocks, "unblock": blocks * records.unblock_ratio,
               "mute": mutes, "unmute": mutes * records.unmute_ratio,
               "delete_account": posts * USERS_PER_POST * records.account_deletes}
    rounded: dict[str, Any] = {name: float(f"{w:.4g}") for name, w in weights.items()}
    return Mix(**rounded, streams=STREAM_SHARE)


PROFILES: Final[dict[str, Mix]] = {
    "social": social_mix(),
    "read-heavy": Mix(),
    "read-only": Mix(home=95, tweets=5, post=0, delete=0, follow=0, unfollow=0),
    "mixed": Mix(home=9, tweets=1, post=0.6, delete=0.1, follow=0.2, unfollow=0.1),
    "write-heavy": Mix(home=2, tweets=0, post=5, delete=1, follow=1.5, unfollow=0.5),
    "post-only": Mix(home=0, tweets=0, post=1, delete=0, follow=0, unfollow=0),
}


def parse_mix(text: str) -> Mix:
    """A profile name, or ``profile:key=value,...`` / ``key=value,...`` over the default."""
    if ":" in text:
        name, _, rest = text.partition(":")
    elif "=" in text:
        name, rest = "", text
    else:
        name, rest = text, ""
    base = PROFILES.get(name or DEFAULT_PROFILE)
    if base is None:
        msg = f"unknown profile {name!r}; known: {', '.join(PROFILES)}"
        raise WorkloadError(msg)
    values = asdict(base)
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key.strip() not in values:
            msg = f"mix item {item!r} is not key=value with key one of {', '.join(values)}"
            raise WorkloadError(msg)
        values[key.strip()] = _number(value, key)
    return Mix(**values)


def _number(text: str, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        msg = f"mix value of {key!r} is not a number: {text!r}"
        raise WorkloadError(msg) from None
    return int(value) if key == "max_pages" else value


class ZipfPicker:
    """Draws items with weight ``1 / rank**exponent`` (rank 1 = first item)."""

    def __init__(self, items: list[int], exponent: float = 1.0) -> None:
        if not items:
            msg = "cannot pick from an empty list of users"
            raise WorkloadError(msg)
        self.items = items
        self._cum = list(itertools.accumulate(1.0 / (r ** exponent)
                                              for r in range(1, len(items) + 1)))

    def pick(self, rng: random.Random) -> int:
        """One item, by rank weight."""
        i = bisect.bisect_left(self._cum, rng.random() * self._cum[-1])
        return self.items[min(i, len(self.items) - 1)]


@dataclass
class Workload:
    """Users ranked by activity and by popularity, plus who may act and who is reserved.

    ``actors``: users the load may write as (those holding a token when auth is on);
    empty means anyone in ``readers``. ``reserved``: users the fan-out probe posts as
    or watches; the load never follows, unfollows, blocks or mutes as them, never
    blocks or mutes them and never deletes their accounts, so it cannot break the
    probe's edges. ``celebrities``: the authors on the celebrity path, when the
    file's writer knew them (the load report splits push latency by them).
    """

    readers: list[int]
    authors: list[int]
    actors: list[int] = field(default_factory=list)
    reserved: list[int] = field(default_factory=list)
    exponent: float = 1.0
    source: str = ""
    celebrities: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.readers or not self.authors:
            msg = "a workload needs at least one reader and one author"
            raise WorkloadError(msg)

    @classmethod
    def from_range(cls, lo: int, hi: int, seed: int = 0, exponent: float = 1.0) -> Workload:
        """Users ``lo..hi`` (inclusive), ranked by a seeded shuffle (one for each role)."""
        if not 1 <= lo <= hi:
            msg = f"user range must be 1 <= lo <= hi, got {lo}-{hi}"
            raise WorkloadError(msg)
        rng = random.Random(seed)
        readers, authors = list(range(lo, hi + 1)), list(range(lo, hi + 1))
        rng.shuffle(readers)
        rng.shuffle(authors)
        return cls(readers, authors, exponent=exponent, source=f"range {lo}-{hi}")

    @classmethod
    def load(cls, path: Path) -> Workload:
        """Read a workload file written by :meth:`dump`."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            msg = f"cannot read workload file {path}: {exc}"
            raise WorkloadError(msg) from exc
        if data.get("version") != WORKLOAD_VERSION:
            msg = f"{path}: workload version {data.get('version')!r}, expected {WORKLOAD_VERSION}"
            raise WorkloadError(msg)
        keys = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in keys} | {"source": str(path)})

    def dump(self, path: Path) -> Path:
        """Write this workload as JSON (ids as numbers)."""
        body = {"version": WORKLOAD_VERSION, **asdict(self)}
        path.write_text(json.dumps(body))
        return path

    def with_tokens(self, tokens: dict[int, str]) -> Workload:
        """Only users holding a token read their home timeline or write (auth on)."""
        if not tokens:
            return self
        readers = [u for u in self.readers if u in tokens]
        if not readers:
            msg = "no user of the workload holds a token: mint tokens for its users"
            raise WorkloadError(msg)
        return Workload(readers, self.authors, sorted(tokens), self.reserved,
                        self.exponent, self.source, self.celebrities)


def parse_user_range(text: str) -> tuple[int, int]:
    """``"1-2000"`` → ``(1, 2000)``."""
    lo, dash, hi = text.partition("-")
    if not dash or not lo.strip().isdigit() or not hi.strip().isdigit():
        msg = f"a user range looks like 1-2000, got {text!r}"
        raise WorkloadError(msg)
    return int(lo), int(hi)


def load_tokens(path: Path) -> dict[int, str]:
    """Bearer tokens by user id from ``{"tokens": {"<id>": "<token>"}}``."""
    try:
        raw = json.loads(path.read_text())["tokens"]
        return {int(uid): str(tok) for uid, tok in raw.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        msg = f"cannot read tokens file {path} (expected {{\"tokens\": {{id: token}}}}): {exc}"
        raise WorkloadError(msg) from exc


def dump_tokens(tokens: dict[int, str], path: Path) -> Path:
    """Write a tokens file readable only by its owner (the tokens are credentials)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(json.dumps({"tokens": {str(u): t for u, t in tokens.items()}}))
    return path
