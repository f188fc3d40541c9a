"""Home pages on Cassandra cost a few requests, whatever their length (DESIGN §6, §7).

On the session's Cassandra node (``cassandra_hosts`` in
``tests/plugins/cassandra.py``), in a keyspace of this module's own, one history goes
through the join (:class:`views.local.LocalJoin`) into a :class:`CassandraStore` whose
cap it overflows: readers following dozens of users, posts, replies (to the reader, to
followees, to strangers), reposts, blocks both ways, a mute, a deleted account and one
celebrity. Every page read through :mod:`serving.timeline` must equal
:class:`views.reference.Reference`'s §4b query, and the requests the driver sends for
one page — counted on the store's session by a request listener, further result pages
included — must stay within the bounds below, which one request per tweet, profile and
original (what the store once sent: 88 for the first 20-entry page here) is far above.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from ingest.events import (
    BLOCK,
    MUTE,
    AccountDelete,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
    UserUpsert,
)
from serving.timeline import PageFn, home_page, home_top, read_time_page
from tests.support.cassandra import fresh_keyspace, writing_store
from views.join import JoinConfig
from views.local import LocalJoin
from views.reference import Reference
from views.stores.cassandra import rows as reads
from views.stores.cassandra.store import CassandraStore

T = TypeVar("T")

CAP = 300
#: A 20-entry page with no repost and no reply to a third user on it: the reader's
#: three partitions (horizon; relations, which hold the celebrity edges too; the first
#: cached entries) in one concurrent run, then one IN read each of tweets, profiles
#: and reposts.
PLAIN_20 = 6
#: With reposts: their originals' rows are a second read of tweets, the followee list
#: is read (replies to third users, older appearances of a reposted tweet), and the
#: profiles the originals name that the candidates did not are a second read of users.
MIXED_20 = PLAIN_20 + 3
#: Round trips (requests that wait on each other) for a 20-entry page: the reader's
#: partitions; the candidates' rows; their originals, profiles, newer reposts and the
#: followee list together (``TimelineReader.hydrate``); the originals' profiles.
ROUNDS_20 = 4
#: A 200-entry page: its 301 candidates take four IN reads (100 keys each) of tweets
#: and four of reposts; with the reads above, those of the originals and, below the
#: horizon, of the followees' author_tweets: 15 here, not hundreds.
PAGE_200 = 20


@dataclass
class Readers:
    """Whose pages are read, and the celebrity.

    ``plain`` sees posts only, ``mixed`` every kind of entry, ``fan`` ``star``'s too.
    """

    plain: int
    mixed: int
    fan: int
    star: int


def history(rng: random.Random, base: int = 10**12) -> tuple[list[Event], Readers]:
    """A history of the kinds §4b names, over ids no other module uses."""
    readers = Readers(base + 1, base + 2, base + 3, base + 700)
    authors = [base + 100 + i for i in range(60)]
    plain = [base + 300 + i for i in range(30)]
    strangers = [base + 500 + i for i in range(15)]
    star, fans = readers.star, [base + 800 + i for i in range(30)]
    events: list[Event] = [Follow(readers.mixed, a, 1) for a in authors]
    events += [Follow(readers.plain, p, 1) for p in plain]
    events += [Follow(f, star, 1) for f in [*fans, readers.fan]]
    events += [Follow(readers.fan, a, 1) for a in authors[:10]]
    events += [UserUpsert(u, f"h{u}", f"n{u}", 2)
               for u in [*vars(readers).values(), *authors, *plain, *strangers]]
    posted: list[tuple[int, int]] = []
    for n in range(1600):
        tweet, at = base * 10 + n, 1000 + 3 * n
        if n % 3 == 0:
            events.append(Post(tweet, rng.choice(plain), at, f"p{tweet}"))
            continue
        who = rng.choice([*authors, *strangers, star])
        original = rng.choice(posted) if posted and rng.random() < 0.25 else None
        if original is not None and original[1] != who:
            events.append(Repost(tweet, who, *original, at))
            continue
        to = rng.choice([readers.mixed, *authors[:10], *strangers]) if rng.random() < .25 else 0
        events.append(Post(tweet, who, at, f"t{tweet}", 0 if to == who else to))
        posted.append((tweet, who))
    events += [Relation(readers.mixed, authors[0], 5, BLOCK),
               Relation(strangers[0], readers.mixed, 5, BLOCK),
               Relation(readers.mixed, authors[1], 5, MUTE),
               AccountDelete(authors[2], 10**6)]
    return events, readers


class Requests:
    """The requests the driver sends on a session, by table.

    One per statement sent (the driver calls request listeners once per statement)
    and one per further page of its result fetched.
    """

    def __init__(self, session: Any) -> None:
        self.session, self.sent = session, list[str]()
        session.add_request_init_listener(self._sent)

    def _sent(self, future: Any) -> None:
        text = getattr(getattr(future.query, "prepared_statement", None), "query_string", "")
        table = (re.findall(r"\bFROM (?:\w+\.)?(\w+)", text) or ["?"])[0]  # keyspace.table
        self.sent.append(table)
        fetch = future.start_fetching_next_page

        def next_page() -> None:
            self.sent.append(table)
            fetch()

        future.start_fetching_next_page = next_page

    def during(self, read: Callable[[], T]) -> tuple[T, Counter[str]]:
        """What ``read`` returns, and the requests it sent by table."""
        self.sent.clear()
        out = read()
        return out, Counter(self.sent)

    def close(self) -> None:
        self.session.remove_request_init_listener(self._sent)


@contextlib.contextmanager
def rounds(store: CassandraStore) -> Iterator[list[str]]:
    """The store's runs of statements while inside, each a round trip, by first statement.

    ``_run`` sends its statements concurrently and waits for them all; ``_rows`` sends one.
    """
    seen: list[str] = []
    run, rows = store._run, store._rows

    def counted_run(ops: list[Any], *args: Any, **kwargs: Any) -> Any:
        if ops:
            seen.append(ops[0][0])
        return run(ops, *args, **kwargs)

    def counted_rows(name: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(name)
        return rows(name, *args, **kwargs)

    store._run, store._rows = counted_run, counted_rows  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del store._run, store._rows


@dataclass
class Built:
    """The module's store, the history in it and the reference that history gives."""

    store: CassandraStore
    ref: Reference
    readers: Readers
    events: list[Event]
    requests: Requests


@pytest.fixture(scope="module")
def built(cassandra_hosts: str) -> Iterator[Built]:
    with fresh_keyspace(cassandra_hosts) as url:
        store = writing_store(url, cap=CAP).open()
        try:
            events, readers = history(random.Random(36))
            join = LocalJoin(JoinConfig(CAP, promote_at=25, demote_below=20), store)
            for i in range(0, len(events), 500):
                join.run(events[i:i + 500])
            assert store.celebrities() == [readers.star]
            requests = Requests(store._session)
            yield Built(store, Reference().add(events), readers, events, requests)
            requests.close()
        finally:
            store.close()


def _rows(entries: list[Any]) -> list[tuple[int, ...]]:
    return [(e.tweet_id, e.created_at, e.author_id, e.original_id, e.original_author)
            for e in entries]


@pytest.mark.parametrize(("reader", "n", "bound"), [
    ("plain", 20, PLAIN_20), ("mixed", 20, MIXED_20),
    ("plain", 200, PAGE_200), ("mixed", 200, PAGE_200)])
def test_a_home_page_costs_a_few_requests(built: Built, reader: str, n: int,
                                          bound: int) -> None:
    user = getattr(built.readers, reader)
    with rounds(built.store) as runs:
        page, sent = built.requests.during(lambda: home_page(built.store, user, None, n))
    assert _rows(page.entries) == built.ref.home(user, n)
    reposts = sum(e.kind == "repost" for e in page.entries)
    assert (reposts > 0) == (reader == "mixed")  # the history gives each page its kind
    assert sum(sent.values()) <= bound, sent
    if n == 20:
        assert len(runs) <= ROUNDS_20, runs


@pytest.mark.parametrize("page_fn", [home_page, read_time_page], ids=["cache", "on read"])
@pytest.mark.parametrize("reader", ["plain", "mixed", "fan"])
def test_every_page_equals_the_query(built: Built, reader: str, page_fn: PageFn) -> None:
    """Every page to the end: the cache above the horizon, author_tweets below it."""
    user = getattr(built.readers, reader)
    want = built.ref.home(user, 10_000)
    assert len(want) > CAP or reader != "mixed"  # the mixed reader's pages cross the horizon
    got = home_top(built.store, user, 10_000, page_size=97, page_fn=page_fn)
    assert _rows(got) == want


def test_long_id_lists_are_read_in_chunks(built: Built) -> None:
    posts = {e.tweet_id: e for e in built.events if isinstance(e, Post)}
    ids = sorted(posts)[:250]
    rows, sent = built.requests.during(lambda: built.store.tweets([*ids, *ids[:10]]))
    assert sent == Counter(tweets=3)
    assert {t: (r.author_id, r.created_at, r.text) for t, r in rows.items()} == {
        t: (posts[t].author_id, posts[t].created_at, posts[t].text) for t in ids}
    users = sorted({p.author_id for p in posts.values()})
    profiles, sent = built.requests.during(lambda: built.store.users(users))
    assert sent == Counter(users=math.ceil(len(users) / reads.IN_MAX))
    assert sorted(profiles) == users


def test_reads_cut_short_by_their_limit_are_read_again(built: Built,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A LIMIT that a chunk's rows reach (a much-reposted tweet) loses no row."""
    reposted = Counter(e.original_tweet_id for e in built.events if isinstance(e, Repost))
    originals = sorted(reposted)
    authors = sorted({e.author_id for e in built.events if isinstance(e, Post)})
    want = (built.store.reposts_of(originals), built.store.author_tweets(authors, None, 50),
            built.store.recent_by_author(authors, 7))
    assert max(len(r) for r in want[0].values()) > 2
    monkeypatch.setattr(reads, "ROWS_MAX", 2)
    (got, sent) = built.requests.during(lambda: built.store.reposts_of(originals))
    assert got == want[0]
    assert sent["reposts_by_original"] > math.ceil(len(originals) / reads.IN_MAX)  # again
    assert built.store.author_tweets(authors, None, 50) == want[1]
    assert built.store.recent_by_author(authors, 7) == want[2]
