"""What is new since my top: ``GET …/home?since=`` and ``…/home/new_count`` (DESIGN §7).

A client holds a page and remembers its ``top_cursor``; more entries arrive (posts,
reposts that move an original up, celebrities' posts merged at read time, deletes,
undone reposts, blocks and mutes that take entries away); the client reads what is
new with ``?since=`` and fills every gap with the ``gap_cursor`` it is given, from the
bottom up (or from the top, for a gap too large to read whole, as ``gap_above`` says).
What it ends with must be exactly the entries above its old top that ``/home`` serves
now — none missing, none twice, in order — and the new first page must begin with
them; the count must be their number, capped. The property runs on random §4b
histories through :class:`serving.reads.Pages` (the code every door of the API answers
with) on each way a home page is assembled: the fan-out cache, with the in-process
celebrity cache, and fan-out on read.

Over real HTTP: the fast path and the FastAPI route give the same bytes; bad input is a 400 in the JSON shape, counted in ``/metrics``;
the owner's token, 404 for a deleted account, ETag/304 and ``?after=`` hold as for
``/home``. With nothing new above the horizon, a since read costs what an empty page
does.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from infra import webclient
from ingest.consistency import encode_token
from ingest.events import (
    AccountDelete,
    Delete,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
    UserUpsert,
)
from serving import timeline
from serving.app import create_app
from serving.celebrities import CelebrityCache
from serving.cursor import decode_cursor, decode_since, encode_cursor, encode_gap
from serving.pagecache import PageCache
from serving.pageversions import page_versions
from serving.reads import Pages, Read
from serving.settings import ServingSettings
from serving.shapes import NEW_COUNT_CAP, parse_count, parse_page
from serving.timeline import AccountGone, home_since
from tests.support.api import (
    SECRET,
    CountingFastPath,
    assert_error,
    bearer,
    counting_fast_path,
    running,
)
from tests.support.histories import ALL, POSTS, USERS, author_of, scenarios
from tests.support.join import Harness
from tests.support.metrics import HOME, scrape, value
from views.delta import Delta, Key
from views.join import JoinConfig
from views.local import LocalJoin
from views.reference import Reference
from views.stores.contract import ReaderProxy
from views.stores.sqlite import SQLiteStore

MODES = ("cache", "celebrity cache", "on read")


# -- the client ---------------------------------------------------------------------------

class Reads:
    """The API's answers (:class:`Pages`) over one store, as JSON, for one way of reading."""

    def __init__(self, store: SQLiteStore, mode: str, depth: int) -> None:
        self.store = store
        cache = CelebrityCache(store, depth=depth) if mode == "celebrity cache" else None
        self.state = types.SimpleNamespace(store=store, versions=page_versions(store),
                                           celebrities=cache)
        self.pages = Pages(PageCache(1 << 22), freshness=None, fan_out=mode != "on read")

    def refresh(self) -> None:
        if self.state.celebrities is not None:
            self.state.celebrities.refresh()

    def get(self, user: int, limit: int = 20, cursor: str | None = None,
            since: str | None = None, count: bool = False) -> dict[str, Any] | None:
        """The body, or None for a deleted account (404); read twice, the second
        answer (from the page cache) must be the first's."""
        bodies = []
        for _ in range(2):
            read = Read(self.store, user, cursor, limit, None, since=since, count=count)
            try:
                status, _, body = self.pages.answer_now(self.state, read, "home", None)
            except AccountGone:
                return None
            assert status == 200
            bodies.append(body)
        assert bodies[0] == bodies[1]
        return orjson.loads(bodies[0])


def fill(get: Any, since: str, limit: int) -> tuple[list[dict[str, Any]], list[str]]:
    """What a client reads with ``?since=``: the first page, then the gap's pages until
    one says there is none left, each put where ``gap_above`` says the rest of the gap
    is. The new entries, newest first, and where each page left the rest of the gap
    (``above``, ``below``, or ``none``). ``get(since, limit)`` gives a page's JSON."""
    page = get(since, limit)
    upper, lower, left = [], [], []  # the entries above the gap, and below it
    for _ in range(1000):
        _a_since_page(page, limit)
        if page["gap_above"]:
            lower = page["entries"] + lower  # filled from the bottom: just above the old top
        else:
            upper += page["entries"]  # the gap, if any, is below them
        left.append("none" if not page["gap"] else "above" if page["gap_above"] else "below")
        if not page["gap"]:
            return upper + lower, left
        page = get(page["gap_cursor"], limit)
    pytest.fail("still a gap after 1000 requests")


def _a_since_page(page: dict[str, Any], limit: int) -> None:
    entries = page["entries"]
    assert len(entries) <= limit and page["next_cursor"] is None
    assert page.get("top_cursor") == (encode_cursor(_key(entries[0])) if entries else None)
    if page["gap"]:
        assert len(entries) == limit, "a page that leaves a gap is full"
        assert page["gap_cursor"].startswith("g1.")
        assert isinstance(page["gap_above"], bool)
    else:
        assert page["gap_cursor"] is None and page["gap_above"] is False


def _key(entry: dict[str, Any]) -> Key:
    return (entry["created_at"], int(entry["tweet_id"]))


def _row(entry: dict[str, Any]) -> tuple[int, int, int, int, int]:
    return (int(entry["tweet_id"]), entry["created_at"], int(entry["actor"]["id"]),
            int(entry["tweet"]["id"]), int(entry["tweet"]["author"]["id"]))


# -- the property -------------------------------------------------------------------------

@st.composite
def arrivals(draw: st.DrawFn, during: list[list[Event]], user: int) -> list[list[Event]]:
    """``during``'s events mixed with entries newer than any before (times 10-16, fresh
    ids): posts and replies, reposts of old and new tweets, and deletes and undos of some
    of them, and new follows by ``user`` (which bring older entries too); shuffled and
    cut into micro-batches."""
    others = [u for u in USERS if u != user]
    new: list[Event] = [Follow(user, u, 9) for u in draw(st.lists(st.sampled_from(others),
                                                                   max_size=3))]
    posts = [(p, author_of(p)) for p in POSTS]
    for i in range(draw(st.integers(0, 24))):
        tweet, author, when = 100 + i, draw(st.sampled_from(USERS)), 10 + draw(st.integers(0, 6))
        if draw(st.booleans()):
            reply = draw(st.sampled_from([0, 0, *USERS]))
            new.append(Post(tweet, author, when, f"n{i}", 0 if reply == author else reply))
            posts.append((tweet, author))
        else:
            original, by = draw(st.sampled_from(posts))
            new.append(Repost(tweet, author, original, by, when))
        if draw(st.integers(0, 5)) == 0:  # taken back
            undo = Unrepost if isinstance(new[-1], Repost) else Delete
            new.append(undo(tweet, author, when + 1))
    events = draw(st.permutations([e for batch in during for e in batch] + new))
    cuts = sorted(draw(st.lists(st.integers(0, len(events)), max_size=3)))
    return [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), data=st.data(), cap=st.integers(1, 4),
       promote_at=st.integers(1, 4), depth=st.integers(1, 4), held=st.integers(1, 4),
       limit=st.integers(1, 3), user=st.sampled_from(USERS), mode=st.sampled_from(MODES),
       scan=st.sampled_from([timeline.MAX_GAP_SCAN, 3, 6]))
def test_filling_since_ends_with_exactly_the_new_first_page(scenario, data, cap, promote_at,
                                                            depth, held, limit, user, mode,
                                                            scan):
    """``scan``: gaps of more candidates are filled from their top down."""
    with mock.patch.object(timeline, "MAX_GAP_SCAN", scan):
        _fill_since(scenario, data, cap, promote_at, depth, held, limit, user, mode)


def _fill_since(scenario, data, cap, promote_at, depth, held, limit, user, mode):  # noqa: ANN001, ANN202
    before, during = scenario
    during = data.draw(arrivals(during, user))
    store = SQLiteStore(":memory:", cap=cap, trim_slack=0).open()
    join = LocalJoin(JoinConfig(cap, promote_at, max(1, promote_at - 1)), store)
    join.run(before)
    reads = Reads(store, mode, depth)
    reads.refresh()
    history = list(before)
    first = reads.get(user, held)
    if first is None:
        return  # a deleted account: its home is not served (test_api)
    # The client's top; a client that held nothing asks from the bottom of everything.
    top = first.get("top_cursor") or encode_cursor((0, 0))
    for batch in during:
        join.run(batch)
        history += batch
    reads.refresh()
    note(f"{mode}, held {held}, limit {limit}, top {decode_cursor(top)}")
    ref = Reference().add(history)
    if ref.is_deleted(user):
        assert reads.get(user, since=top) is None and reads.get(user, since=top, count=True) \
            is None
        return

    def get(since: str, n: int) -> dict[str, Any]:
        page = reads.get(user, n, since=since)
        assert page is not None
        return page

    new, left = fill(get, top, limit)
    requests = len(left)
    event(f"since pages: {min(requests, 4)}{'+' if requests >= 4 else ''}")
    event(f"a gap filled from its top down: {'below' in left[1:]}")
    event(f"new entries: {min(len(new), 8)}{'+' if len(new) >= 8 else ''}")
    event(f"celebrities: {min(len(store.celebrities()), 2)}")
    floor = decode_cursor(top)
    want = [tuple(r) for r in ref.home(user, ALL) if (r.created_at, r.entry_id) > floor]
    assert [_row(e) for e in new] == want  # none missing, none twice, newest first
    # ... so that above what the client held, they are the new first page as served
    size = len(new) + held
    page = reads.get(user, size)
    assert page is not None
    above = [e for e in page["entries"] if _key(e) > floor]
    assert above == new and page["entries"][:len(new)] == new
    counted = reads.get(user, since=top, count=True)
    assert counted == {"user_id": str(user), "count": min(len(new), NEW_COUNT_CAP),
                       "capped": len(new) > NEW_COUNT_CAP}
    opening = get(top, limit)
    if opening["gap"]:  # the gap's count is what filling it reads
        gap = reads.get(user, since=opening["gap_cursor"], count=True)
        assert gap is not None and gap["count"] == len(new) - limit


# -- over HTTP ----------------------------------------------------------------------------

T0 = 1_700_000_000_000
READER, AUTHOR, CELEB, FAN, STRANGER = 2, 3, 4, 5, 6
HOME_PATH = f"/v1/users/{READER}/home"
COUNT_PATH = f"{HOME_PATH}/new_count"
COUNT_ROUTE = "/v1/users/{user_id}/home/new_count"
CONFIG = JoinConfig(cap=4, promote_at=2, demote_below=1)  # CELEB has two followers




class World:
    """A SQLite store the API serves with its fast path (as ``fanout serve`` runs it) and
    with its routes alone (``fast_reads="off"``), the join that fills it, and the
    reader's clients of each."""

    def __init__(self, harness: Harness, fast: CountingFastPath,
                 clients: tuple[httpx.Client, httpx.Client], anon: httpx.Client) -> None:
        self.harness, self.fast, self.anon = harness, fast, anon
        self.client, self.routes = clients

    def run(self, *events: Any) -> None:
        self.harness.run(list(events))


def _settings(path: Path, **overrides: Any) -> ServingSettings:
    return ServingSettings(**{"store_url": f"sqlite:///{path}", "timeline_cap": CONFIG.cap,
                              "auth": True, "auth_secret": SECRET, "max_page": 200,
                              "celebrity_refresh_s": 0, "after_timeout_ms": 300} | overrides)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    path = tmp_path / "since.sqlite"
    harness = Harness(CONFIG, SQLiteStore(path, cap=CONFIG.cap).open())
    harness.run([UserUpsert(u, f"u{u}", f"User {u}", T0) for u in (READER, AUTHOR, CELEB, FAN)]
                + [Follow(READER, AUTHOR, T0), Follow(READER, CELEB, T0), Follow(FAN, CELEB, T0)]
                + [Post(100 + i, AUTHOR, T0 + 10 * i, f"a{i}") for i in range(3)]
                + [Post(200 + i, CELEB, T0 + 10 * i + 5, f"c{i}") for i in range(3)])
    assert CELEB in harness.store.celebrities()
    app, routes_app = create_app(_settings(path)), create_app(_settings(path, fast_reads="off"))
    fast = counting_fast_path(app)
    auth = bearer(READER)
    with running(app) as base, running(routes_app) as routes_base, \
            webclient.client(base_url=base, timeout=10, headers=auth) as client, \
            webclient.client(base_url=routes_base, timeout=10, headers=auth) as routes, \
            webclient.client(base_url=base, timeout=10) as anon:
        yield World(harness, fast, (client, routes), anon)
    harness.store.close()


def _ids(body: dict[str, Any]) -> list[int]:
    return [int(e["tweet_id"]) for e in body["entries"]]


def _arrive(world: World) -> None:
    """What happens while the client is away: new posts (one deleted again), a
    celebrity's posts, a repost moving an old tweet up, and an undone repost."""
    world.run(Post(110, AUTHOR, T0 + 100, "a new"), Post(111, AUTHOR, T0 + 110, "gone soon"),
              Post(210, CELEB, T0 + 105, "c new"), Post(211, CELEB, T0 + 115, "c newer"),
              Repost(300, AUTHOR, 200, CELEB, T0 + 120), Repost(301, AUTHOR, 101, AUTHOR, T0 + 125),
              Post(112, AUTHOR, T0 + 130, "newest"))
    world.run(Delete(111, AUTHOR, T0 + 140), Unrepost(301, AUTHOR, T0 + 141))


def test_a_client_reads_what_is_new_and_fills_the_gap_from_the_bottom_up(world: World):
    first = world.client.get(HOME_PATH, params={"limit": 2})
    assert _ids(first.json()) == [202, 102]
    top = parse_page(first.content).get("top_cursor")
    assert top is not None
    nothing = world.client.get(HOME_PATH, params={"since": top})
    assert nothing.json() == {"user_id": str(READER), "entries": [], "next_cursor": None,
                              "gap": False, "gap_cursor": None, "gap_above": False}
    _arrive(world)
    new = [112, 300, 211, 210, 110]  # 111 deleted, 301 undone; 300 shows 200 (moved up)
    pages = []

    def get(since: str, limit: int) -> dict[str, Any]:
        response = world.client.get(HOME_PATH, params={"since": since, "limit": limit})
        assert response.status_code == 200, response.text
        parse_page(response.content)
        pages.append(_ids(response.json()))
        return response.json()

    got, left = fill(get, top, 2)
    assert pages == [[112, 300], [210, 110], [211]]  # the newest, then the gap bottom-up
    assert left == ["below", "above", "none"]
    assert [int(e["tweet_id"]) for e in got] == new
    whole = world.client.get(HOME_PATH, params={"limit": 7}).json()
    assert _ids(whole) == [*new, 202, 102]  # 200 left its old place for the repost
    count = world.client.get(COUNT_PATH, params={"since": top})
    assert parse_count(count.content) == {
        "user_id": str(READER), "count": 5, "capped": False}


def test_the_count_is_capped_and_a_large_gap_fills_exactly(world: World):
    """110 new entries, most of them below the capped cache (read at read time)."""
    top = world.client.get(HOME_PATH).json()["top_cursor"]
    world.run(*[Post(1000 + i, AUTHOR if i % 3 else CELEB, T0 + 1000 + i, f"n{i}")
                for i in range(110)])
    count = world.client.get(COUNT_PATH, params={"since": top}).json()
    assert count == {"user_id": str(READER), "count": NEW_COUNT_CAP, "capped": True}

    def get(since: str, limit: int) -> dict[str, Any]:
        return world.client.get(HOME_PATH, params={"since": since, "limit": limit}).json()

    got, left = fill(get, top, 50)
    assert left == ["below", "above", "none"]
    assert [int(e["tweet_id"]) for e in got] == list(range(1109, 999, -1))
    with mock.patch.object(timeline, "MAX_GAP_SCAN", 30):  # too large a gap: from its top
        got, left = fill(get, top, 40)  # (40: pages the page cache does not hold)
    assert left == ["below", "below", "none"]
    assert [int(e["tweet_id"]) for e in got] == list(range(1109, 999, -1))


def _door_requests(top: str, gap: str) -> list[tuple[str, dict[str, Any]]]:
    return [(HOME_PATH, {"since": top, "limit": 2}), (HOME_PATH, {"since": gap, "limit": 2}),
            (HOME_PATH, {"since": top}), (COUNT_PATH, {"since": top}),
            (COUNT_PATH, {"since": gap})]


def test_every_door_gives_the_routes_answer(world: World):
    """The fast path, the route, and the route alone: the same bytes."""
    top = world.client.get(HOME_PATH, params={"limit": 1}).json()["top_cursor"]
    _arrive(world)
    gap = world.client.get(HOME_PATH, params={"since": top, "limit": 2}).json()["gap_cursor"]
    answered = world.fast.in_stack
    for path, params in _door_requests(top, gap):
        counted = world.fast.in_stack
        fast = world.client.get(path, params=params)
        home = path == HOME_PATH  # the count has one door: its route
        assert world.fast.in_stack == counted + home, path
        # A body on a GET (even an empty one) takes the fast path out of the way.
        routed = world.client.get(path, params=params, headers={"Content-Length": "0"})
        assert world.fast.in_stack == counted + home, path
        alone = world.routes.get(path, params=params)
        assert fast.status_code == routed.status_code == alone.status_code == 200
        assert fast.content == routed.content == alone.content, (path, params)
        assert fast.headers["etag"] == routed.headers["etag"] == alone.headers["etag"]
    # The fast path answered the three home reads; the count went to the route.
    assert world.fast.in_stack - answered == 3


def test_etag_and_304_until_something_new_arrives(world: World):
    top = world.client.get(HOME_PATH).json()["top_cursor"]
    for path in (HOME_PATH, COUNT_PATH):
        first = world.client.get(path, params={"since": top})
        etag = first.headers["etag"]
        again = world.client.get(path, params={"since": top}, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
    bodies = {p: world.client.get(p, params={"since": top}) for p in (HOME_PATH, COUNT_PATH)}
    world.run(Post(130, STRANGER, T0 + 400, "not followed"))  # a commit the pages do not show
    for path, before in bodies.items():
        same = world.client.get(path, params={"since": top},
                                headers={"If-None-Match": before.headers["etag"]})
        assert same.status_code == 304, path
    world.run(Post(120, AUTHOR, T0 + 500, "news"))
    for path, before in bodies.items():
        fresh = world.client.get(path, params={"since": top},
                                 headers={"If-None-Match": before.headers["etag"]})
        assert fresh.status_code == 200 and fresh.headers["etag"] != before.headers["etag"]
    assert _ids(world.client.get(HOME_PATH, params={"since": top}).json()) == [120]
    assert world.client.get(COUNT_PATH, params={"since": top}).json()["count"] == 1


def test_the_owners_token_only(world: World):
    top = encode_cursor((0, 0))
    for path in (HOME_PATH, COUNT_PATH):
        assert_error(world.anon.get(path, params={"since": top}), 401)
        other = world.anon.get(path, params={"since": top}, headers=bearer(FAN))
        assert assert_error(other, 403)["field"] == "user_id"
        assert world.client.get(path, params={"since": top}).status_code == 200


def test_a_deleted_account_is_404(world: World):
    top = encode_cursor((0, 0))
    world.run(AccountDelete(READER, T0 + 600))
    for path in (HOME_PATH, COUNT_PATH):
        assert assert_error(world.client.get(path, params={"since": top}), 404)["error"] \
            == "not_found"


def test_after_with_since(world: World):
    """Read-your-writes: the page (or count) waits for the write, then says whether it
    was applied, with the same entries as without ``after``."""
    top = encode_cursor((0, 0))
    token = encode_token("tweets", 0, 7)
    for path in (HOME_PATH, COUNT_PATH):
        stale = world.client.get(path, params={"since": top, "after": token}).json()
        assert stale.pop("consistent") is False
        assert stale == world.client.get(path, params={"since": top}).json()
    world.harness.store.apply([Delta.source_offset("tweets", 0, 7, T0)])
    for path in (HOME_PATH, COUNT_PATH):
        fresh = world.client.get(path, params={"since": top, "after": token}).json()
        assert fresh.pop("consistent") is True
        assert fresh == world.client.get(path, params={"since": top}).json()


def test_a_block_takes_its_entries_out_of_the_page_and_the_count(world: World):
    top = world.client.get(HOME_PATH).json()["top_cursor"]
    world.run(Post(120, AUTHOR, T0 + 500, "a"), Post(220, CELEB, T0 + 510, "c"))
    assert _ids(world.client.get(HOME_PATH, params={"since": top}).json()) == [220, 120]
    world.run(Relation(READER, CELEB, T0 + 520))  # a block
    assert _ids(world.client.get(HOME_PATH, params={"since": top}).json()) == [120]
    assert world.client.get(COUNT_PATH, params={"since": top}).json()["count"] == 1


_TOP = encode_cursor((T0, 100))
_GAP = encode_gap((T0, 100), (T0 + 50, 1))

BAD: list[tuple[str, dict[str, str], str]] = [
    (HOME_PATH, {"since": "nope"}, "since"),
    (HOME_PATH, {"since": ""}, "since"),
    (HOME_PATH, {"since": "c1.!!!"}, "since"),
    (HOME_PATH, {"since": encode_cursor((-1, 5))}, "since"),
    (HOME_PATH, {"since": encode_cursor((1, 2**63))}, "since"),
    (HOME_PATH, {"since": "g1.MTox"}, "since"),
    (HOME_PATH, {"since": encode_gap((5, 5), (5, 5))}, "since"),
    (HOME_PATH, {"since": encode_gap((6, 1), (5, 9))}, "since"),
    (HOME_PATH, {"since": _TOP, "cursor": _TOP}, "since"),
    (HOME_PATH, {"since": _GAP, "cursor": _TOP}, "since"),
    (HOME_PATH, {"cursor": _GAP}, "cursor"),
    (HOME_PATH, {"since": _TOP, "limit": "0"}, "limit"),
    (f"/v1/users/{READER}/tweets", {"since": _TOP}, "since"),
    (COUNT_PATH, {}, "since"),
    (COUNT_PATH, {"since": "c1.x"}, "since"),
    (COUNT_PATH, {"since": _TOP, "limit": "3"}, "limit"),
    (COUNT_PATH, {"since": _TOP, "cursor": _TOP}, "cursor"),
]


def test_bad_input_is_a_400_with_a_reason_counted_in_metrics(world: World):
    for path, params, field in BAD:
        body = assert_error(world.client.get(path, params=params), 400)
        assert body["field"] == field, (path, params, body)
        assert body["error"] == "bad_request"
    latency = scrape(world.client)["fanout_http_request_duration_seconds"]
    count = "fanout_http_request_duration_seconds_count"
    routes = {"home": HOME, "tweets": "/v1/users/{user_id}/tweets", "new_count": COUNT_ROUTE}
    want = {r: sum(p.rsplit("/", 1)[1] == name for p, _, _ in BAD) for name, r in routes.items()}
    for route, n in want.items():
        assert value(latency, count, method="GET", route=route, status="400") == n, route


class _Counted(ReaderProxy):
    """A store that counts the reads a page makes besides its ``home_start`` round."""

    def __init__(self, inner: SQLiteStore) -> None:
        super().__init__(inner)
        self.reads: list[str] = []

    def author_tweets(self, authors, below, limit):  # noqa: ANN001, ANN201
        self.reads.append("author_tweets")
        return super().author_tweets(authors, below, limit)

    def cached(self, user, below, limit):  # noqa: ANN001, ANN201
        self.reads.append("cached")
        return super().cached(user, below, limit)

    def hydrate(self, tweets, users, reposts, reader=None, followees=False):  # noqa: ANN001, ANN201
        self.reads.append(f"hydrate {len(tweets)} tweets, {len(users)} users")
        return super().hydrate(tweets, users, reposts, reader, followees)


def test_with_nothing_new_a_since_read_costs_what_an_empty_page_does():
    """Above the horizon: no read-time lists, no tweet rows; the reader's profile only."""
    harness = Harness(JoinConfig(cap=3, promote_at=100, demote_below=80))
    harness.run([Follow(READER, AUTHOR, T0)]
                + [Post(100 + i, AUTHOR, T0 + i, f"t{i}") for i in range(10)])
    store = _Counted(harness.store)
    assert harness.store.horizon(READER) is not None  # trimmed: the rest is read at read time
    top = encode_cursor((T0 + 9, 109))
    page = home_since(store, READER, decode_since(top), 20)
    assert page.entries == [] and page.gap is None
    assert store.reads == ["hydrate 0 tweets, 1 users"]
    store.reads.clear()
    below = home_since(store, READER, decode_since(encode_cursor((T0 + 2, 102))), 20)
    assert [e.tweet_id for e in below.entries] == list(range(109, 102, -1))
    assert "author_tweets" in store.reads  # below the horizon: the query at read time
