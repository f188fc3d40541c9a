"""The read API over real HTTP: uvicorn on a random loopback port, httpx as the client.

A module fixture fills a store through the pure join (the ``Harness`` of
``tests/support/join.py``, no Spark): a celebrity author, timelines trimmed by a small
cap (so deep pages take the read-time fallback), deleted tweets, ids at 2^63-1, users
with and without profiles, and every record of DESIGN §4b — reposts (the
celebrity's too, two of one tweet, of deleted tweets, undone), replies, blocks, mutes
and a deleted account. Paging through the API must concatenate to
``views.reference`` — the DESIGN's SQL — and every failure must be the JSON error
shape. The API runs on each store: a temporary SQLite file, and a fresh keyspace on
the session's Cassandra node (``cassandra_hosts`` in ``tests/plugins/cassandra.py``); the
tests of hydration races and of a failing store subclass the SQLite store.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from infra import webclient
from ingest.events import (
    MUTE,
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
from serving.app import create_app, iso_millis
from serving.cursor import encode_cursor
from serving.render import hydrated
from serving.settings import ServingSettings
from serving.shapes import parse_page
from serving.timeline import home_page
from tests.support.api import running
from tests.support.cassandra import fresh_keyspace, writer_from_url
from tests.support.join import Harness
from views.delta import Delta, Key
from views.errors import StoreError
from views.join import JoinConfig
from views.reference import HomeRow, Reference
from views.stores.rows import Entry, TweetRow, UserRow
from views.stores.sqlite import SQLiteStore

BIG = 2**63 - 1
T0 = 1_700_000_000_000  # epoch ms
CELEB = 1
NO_PROFILE = 7
GONE = 11  # a deleted account, with followers, posts, reposts and replies
CONFIG = JoinConfig(cap=4, promote_at=3, demote_below=2)
MAX_PAGE = 50
DEFAULT_PAGE = 3


def _history() -> list[Event]:
    """Hand-made edge cases plus a seeded random crowd (ids 1..12)."""
    rng = random.Random(7)
    users = list(range(1, 13))
    events: list[Event] = [UserUpsert(u, f"user{u}", f"User {u}", T0)
                           for u in users if u != NO_PROFILE]
    events += [UserUpsert(BIG - 5, "big", "Big Author", T0), UserUpsert(BIG, "max", "Max", T0)]
    events += [Follow(f, CELEB, T0 + f) for f in range(2, 9)]  # a celebrity
    events += [Follow(2, a, T0) for a in (6, NO_PROFILE, 3)]
    events += [Follow(BIG, BIG - 5, T0), Follow(BIG, 6, T0)]
    for i in range(160):
        author = rng.choice(users)
        reply_to = rng.choice([u for u in users if u != author]) if rng.random() < 0.2 else 0
        events.append(Post(1000 + i, author, T0 + rng.randrange(0, 50) * 1000, f"tweet {i} ✓",
                           reply_to))
    events += [Post(BIG - 1, BIG - 5, T0 + 99_000, "the biggest id"),
               Post(BIG - 2, BIG - 5, T0 + 99_000, "same time, smaller id")]
    events += [Follow(rng.choice(users), a, T0 + rng.randrange(0, 60) * 1000,
                      active=rng.random() < 0.8)
               for a in users for _ in range(3)]
    events = [e for e in events if not (isinstance(e, Follow) and e.follower_id == e.followee_id)]
    posts = [e for e in events if isinstance(e, Post)]
    events += [Delete(p.tweet_id, p.author_id, T0 + 200_000)
               for p in rng.sample(posts[:160], 15)]  # not the ids near 2^63
    return events + _timeline_records(rng, users, posts)


def _timeline_records(rng: random.Random, users: list[int], posts: list[Post]) -> list[Event]:
    """DESIGN §4b's records: reposts (some undone), blocks, mutes, one deleted account."""
    events: list[Event] = []
    for i in range(60):  # reposts, often of the same few tweets, the celebrity's among them
        actor = CELEB if i % 6 == 0 else rng.choice(users)
        original = rng.choice(posts[:20] if i % 2 else posts)
        events.append(Repost(5000 + i, actor, original.tweet_id, original.author_id,
                             T0 + rng.randrange(0, 60) * 1000 + 500))
    events += [Unrepost(5000 + i, r.author_id, T0 + 300_000)
               for i, r in enumerate(events) if isinstance(r, Repost) and i % 7 == 3]
    for i in range(12):
        user, other = rng.sample(users, 2)
        kind = "block" if i % 2 else MUTE
        events.append(Relation(user, other, T0 + i * 1000, kind))
        if i % 3 == 0:  # and undone later
            events.append(Relation(user, other, T0 + 100_000, kind, active=False))
    return [*events, AccountDelete(GONE, T0 + 150_000)]


class Filled:
    """The filled store (its URL), the reference and the history behind both."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:") else None
        self.history = _history()
        self.ref = Reference().add(self.history)
        harness = Harness(CONFIG, store=writer_from_url(url, cap=CONFIG.cap).open())
        rng = random.Random(11)
        arrivals = self.history[:]
        rng.shuffle(arrivals)  # out of order, as the changelogs may deliver
        for i in range(0, len(arrivals), 37):
            harness.run(arrivals[i:i + 37])
        harness.store.apply([Delta.source_offset("tweets", 1, 41, T0)])
        self.store = harness.store

    def readers(self) -> list[int]:
        """Every served home timeline: the followers, plus users who follow nobody."""
        return [*self.ref.users(), 9, 12345]

    def author_page(self, author: int) -> list[tuple[int, int]]:
        """What the author route serves: live posts, and reposts of live tweets whose
        author's account is not deleted, newest first (created_at, entry id)."""
        originals = {r.tweet_id: r for r in self.ref.live_reposts()}
        return [key for key in self.ref.author_tweets(author)
                if key[1] not in originals or self._shown(originals[key[1]])]

    def _shown(self, repost: Repost) -> bool:
        post = self.ref.post(repost.original_tweet_id)
        return post is not None and post.author_id == repost.original_author_id \
            and not self.ref.is_deleted(post.author_id) and not any(
                isinstance(e, Delete) and (e.tweet_id, e.author_id)
                == (post.tweet_id, post.author_id) for e in self.history)


@pytest.fixture(scope="module")
def sqlite_filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Filled]:
    filled = Filled(f"sqlite:///{tmp_path_factory.mktemp('api') / 'store.sqlite'}")
    yield filled
    filled.store.close()


@pytest.fixture(scope="module", params=["sqlite", "cassandra"])
def filled(request: pytest.FixtureRequest) -> Iterator[Filled]:
    """The filled store of each kind."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_filled")
        return
    with fresh_keyspace(request.getfixturevalue("cassandra_hosts")) as url:
        filled = Filled(url)
        yield filled
        filled.store.close()


def _settings(url: str) -> ServingSettings:
    return ServingSettings(store_url=url, timeline_cap=CONFIG.cap, max_page=MAX_PAGE,
                           default_page=DEFAULT_PAGE, auth=False)


@pytest.fixture(scope="module")
def settings(filled: Filled) -> ServingSettings:
    return _settings(filled.url)


@pytest.fixture(scope="module")
def client(settings: ServingSettings) -> Iterator[httpx.Client]:
    """A client of the API as ``fanout serve`` runs it: the app opens its own store."""
    with running(create_app(settings)) as base, webclient.client(base_url=base, timeout=10) as c:
        yield c


def _pages(client: httpx.Client, path: str, limit: int) -> list[dict]:
    entries: list[dict] = []
    cursor: str | None = None
    for _ in range(1000):
        params: dict[str, str | int] = {"limit": limit} | ({"cursor": cursor} if cursor else {})
        response = client.get(path, params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["entries"]) <= limit
        entries += body["entries"]
        cursor = body["next_cursor"]
        if cursor is None:
            return entries
    pytest.fail(f"{path} still had a next_cursor after 1000 pages")


# -- the fixture is what it claims ------------------------------------------------------
def test_fixture_has_a_celebrity_trimmed_timelines_and_deletes(filled: Filled):
    assert CELEB in filled.store.celebrities()
    assert filled.store.horizon(2) is not None
    assert any(t.deleted for t in filled.store.tweets(list(range(1000, 1160))).values())


def test_fixture_serves_every_kind_of_entry_and_filters_some(filled: Filled):
    """Reposts (the celebrity's too), replies, and entries §4b filters are all there."""
    rows = [r for u in filled.readers() for r in filled.ref.home(u, 10**6)]
    posts = {p.tweet_id: p for p in filled.history if isinstance(p, Post)}
    assert {r.actor_id for r in rows if r.entry_id != r.original_tweet_id} >= {CELEB}
    assert any(posts[r.entry_id].in_reply_to_user_id for r in rows if r.entry_id in posts)
    plain = Reference().add(e for e in filled.history
                            if not isinstance(e, Relation | AccountDelete | Repost))
    dropped = {(u, r.entry_id) for u in plain.users() for r in plain.home(u, 10**6)} \
        - {(u, r.entry_id) for u in plain.users() for r in filled.ref.home(u, 10**6)}
    assert len(dropped) >= 20, "blocks, mutes, the deleted account and reposts hide posts"
    assert GONE not in filled.readers() and filled.ref.is_deleted(GONE)


# -- timelines ---------------------------------------------------------------------------
@pytest.mark.parametrize("limit", [1, 3, MAX_PAGE])
def test_home_pages_concatenate_to_the_sql(client: httpx.Client, filled: Filled, limit: int):
    for user in filled.readers():
        got = [e["tweet_id"] for e in _pages(client, f"/v1/users/{user}/home", limit)]
        want = [str(t) for t, *_ in filled.ref.home(user, 10**6)]
        assert got == want, f"user {user}, limit {limit}"


def _user(filled: Filled, user: int) -> dict:
    profile = filled.ref.profiles.get(user)
    return {"id": str(user), "handle": profile.handle if profile else None,
            "name": profile.name if profile else None}


def _entry(filled: Filled, row: HomeRow) -> dict:
    """The JSON entry the API must serve for one row of the §4b query."""
    post = filled.ref.post(row.original_tweet_id)
    assert post is not None, f"entry {row.entry_id}: no post {row.original_tweet_id}"
    kind = "repost" if row.entry_id != post.tweet_id else \
        "reply" if post.in_reply_to_user_id else "post"
    reply_to = str(post.in_reply_to_user_id) if post.in_reply_to_user_id else None
    return {"tweet_id": str(row.entry_id), "kind": kind, "created_at": row.created_at,
            "created_at_iso": iso_millis(row.created_at), "actor": _user(filled, row.actor_id),
            "tweet": {"id": str(post.tweet_id), "created_at": post.created_at,
                      "created_at_iso": iso_millis(post.created_at), "text": post.text,
                      "author": _user(filled, post.author_id),
                      "in_reply_to_user_id": reply_to}}


def test_home_entries_are_hydrated(client: httpx.Client, filled: Filled):
    kinds = set()
    for user in filled.readers():
        entries = _pages(client, f"/v1/users/{user}/home", MAX_PAGE)
        want = [_entry(filled, row) for row in filled.ref.home(user, 10**6)]
        assert entries == want, f"user {user}"
        kinds |= {e["kind"] for e in entries}
    assert kinds == {"post", "reply", "repost"}


@pytest.mark.parametrize("limit", [1, 3, MAX_PAGE])
def test_since_reads_exactly_the_entries_above_a_position(client: httpx.Client, filled: Filled,
                                                          limit: int):
    """From positions in each reader's timeline (its top, a third and a half down, the
    last entry, and below everything), ``?since=`` with its gaps filled from the bottom
    up reads the §4b SQL's entries above it, and the count says how many."""
    for user in filled.readers():
        want = filled.ref.home(user, 10**6)
        keys = [(r.created_at, r.entry_id) for r in want]
        picks = {keys[i] for i in (0, len(keys) // 3, len(keys) // 2, -1) if keys} | {(0, 0)}
        for floor in sorted(picks):
            since = encode_cursor(floor)
            got = _since(client, f"/v1/users/{user}/home", since, limit)
            above = [_entry(filled, r) for r, key in zip(want, keys, strict=True) if key > floor]
            assert got == above, f"user {user}, since {floor}, limit {limit}"
            count = client.get(f"/v1/users/{user}/home/new_count", params={"since": since})
            assert count.json() == {"user_id": str(user), "count": min(len(above), 100),
                                    "capped": len(above) > 100}, f"user {user}, since {floor}"


def _since(client: httpx.Client, path: str, since: str, limit: int) -> list[dict]:
    """A since read, then its gap filled (from the bottom up, as ``gap_above`` says): the
    new entries, newest first."""
    response = client.get(path, params={"since": since, "limit": limit})
    upper, lower = [], []
    for _ in range(1000):
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["entries"]) <= limit and body["next_cursor"] is None
        if body["gap_above"]:
            lower = body["entries"] + lower
        else:
            upper += body["entries"]
        if not body["gap"]:
            return upper + lower
        response = client.get(path, params={"since": body["gap_cursor"], "limit": limit})
    pytest.fail(f"{path} still had a gap after 1000 requests")


def test_pages_validate_against_the_openapi_model(client: httpx.Client, filled: Filled):
    for user in filled.readers()[:4]:
        parse_page(client.get(f"/v1/users/{user}/home").content)


@pytest.mark.parametrize("route", ["home", "tweets"])
def test_a_deleted_account_is_404(client: httpx.Client, route: str):
    body = _assert_error(client.get(f"/v1/users/{GONE}/{route}"), 404, "user_id")
    assert body["error"] == "not_found" and "deleted" in body["message"]


def test_author_without_profile_has_null_handle(client: httpx.Client, filled: Filled):
    entries = _pages(client, f"/v1/users/{NO_PROFILE}/tweets", MAX_PAGE)
    assert entries, "the author without a profile should have tweets"
    assert {(e["actor"]["id"], e["actor"]["handle"], e["actor"]["name"]) for e in entries} \
        == {(str(NO_PROFILE), None, None)}
    assert all(e["tweet"]["author"] == e["actor"] for e in entries if e["kind"] != "repost")


@pytest.mark.parametrize("limit", [2, MAX_PAGE])
def test_author_tweets_are_live_newest_first(client: httpx.Client, filled: Filled, limit: int):
    reposts = 0
    for author in [*range(1, 13), BIG - 5]:
        if author == GONE:
            continue
        entries = _pages(client, f"/v1/users/{author}/tweets", limit)
        got = [(e["created_at"], int(e["tweet_id"])) for e in entries]
        assert got == filled.author_page(author), f"author {author}"
        reposts += sum(e["kind"] == "repost" for e in entries)
    assert reposts > 0


def test_ids_are_exact_strings_at_2_pow_63(client: httpx.Client):
    response = client.get(f"/v1/users/{BIG}/home", params={"limit": 2})
    assert response.status_code == 200
    assert f'"user_id":"{BIG}"' in response.text
    assert f'"tweet_id":"{BIG - 1}"' in response.text
    assert f'"id":"{BIG - 5}"' in response.text
    first, second = response.json()["entries"]
    assert (first["tweet_id"], second["tweet_id"]) == (str(BIG - 1), str(BIG - 2))
    assert first["created_at_iso"] == iso_millis(T0 + 99_000) == "2023-11-14T22:14:59.000Z"


def test_default_page_size_and_cursor(client: httpx.Client):
    body = client.get("/v1/users/2/home").json()
    assert len(body["entries"]) == DEFAULT_PAGE
    assert body["next_cursor"].startswith("c1.")


def test_empty_timeline(client: httpx.Client):
    body = client.get("/v1/users/12345/home").json()
    assert body == {"user_id": "12345", "entries": [], "next_cursor": None}


# -- hydration races ---------------------------------------------------------------------
class _RacyStore(SQLiteStore):
    """Hydration sees one tweet deleted and one gone since the page was assembled."""

    def __init__(self, path: Path, deleted: int, missing: int) -> None:
        super().__init__(path, cap=CONFIG.cap)
        self.deleted, self.missing = deleted, missing
        self.calls: list[str] = []

    def tweets(self, ids: Sequence[int]) -> dict[int, TweetRow]:
        self.calls.append("tweets")
        rows = super().tweets(ids)
        rows.pop(self.missing, None)
        if self.deleted in rows:
            rows[self.deleted] = rows[self.deleted]._replace(deleted=True, text="")
        return rows

    def users(self, ids: Sequence[int]) -> dict[int, UserRow]:
        self.calls.append("users")
        return super().users(ids)


def test_hydration_drops_raced_deletes_in_two_bulk_reads(sqlite_filled: Filled):
    page = home_page(sqlite_filled.store, 2, None, 10)
    ids = [e.tweet_id for e in page.entries]
    originals = [e.original_id for e in page.entries]
    assert sqlite_filled.path is not None
    assert any(e.kind == "repost" for e in page.entries)
    store = _RacyStore(sqlite_filled.path, deleted=originals[1], missing=originals[4]).open()
    try:
        got = [int(e["tweet_id"]) for e in hydrated(store, page.entries)]
    finally:
        store.close()
    assert got == [t for t in ids if t not in (ids[1], ids[4])]
    assert store.calls == ["tweets", "users"]


def test_hydrating_nothing_reads_nothing(sqlite_filled: Filled):
    assert sqlite_filled.path is not None
    store = _RacyStore(sqlite_filled.path, 0, 0)
    assert hydrated(store, []) == []
    assert store.calls == []


# -- errors ------------------------------------------------------------------------------
def _assert_error(response: httpx.Response, status: int, field: str | None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) <= {"error", "message", "field"}
    assert isinstance(body["error"], str) and body["error"]
    assert isinstance(body["message"], str) and body["message"]
    assert body.get("field") == field
    return body


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "1.5", "+5", "1e3", "%20", "٣",
                                 str(BIG + 1), "9" * 40])
@pytest.mark.parametrize("route", ["home", "tweets"])
def test_bad_user_id_is_400(client: httpx.Client, raw: str, route: str):
    body = _assert_error(client.get(f"/v1/users/{raw}/{route}"), 400, "user_id")
    assert body["error"] == "bad_request"


@pytest.mark.parametrize("limit", ["0", "-3", str(MAX_PAGE + 1), "x", "2.5", ""])
def test_bad_limit_is_400(client: httpx.Client, limit: str):
    body = _assert_error(client.get("/v1/users/2/home", params={"limit": limit}), 400, "limit")
    assert body["error"] == "bad_request"


@pytest.mark.parametrize("cursor", ["", "nope", "c1.!!!", "c1." + "A" * 100,
                                    encode_cursor((-1, 5)),
                                    encode_cursor((2**64, 1)), encode_cursor((1, 2**63))])
def test_bad_cursor_is_400(client: httpx.Client, cursor: str):
    _assert_error(client.get("/v1/users/2/home", params={"cursor": cursor}), 400, "cursor")


def test_cursor_at_the_top_is_fine(client: httpx.Client):
    top: Key = (BIG, BIG)
    response = client.get("/v1/users/2/home", params={"cursor": encode_cursor(top)})
    assert response.status_code == 200


@pytest.mark.parametrize("path", ["/nope", "/v1/users/1/nothing", "/v1/users/1/home/extra",
                                  "/v1/reposts", "/"])
def test_unknown_route_is_404_json(client: httpx.Client, path: str):
    body = _assert_error(client.get(path), 404, None)
    assert body["error"] == "not_found"


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("POST", "/v1/users/1/home", "GET"), ("GET", "/v1/users/1", "DELETE"),
    ("GET", "/v1/reposts/5", "DELETE"), ("PATCH", "/v1/users/1/blocks/2", "PUT")])
def test_wrong_method_is_405_json(client: httpx.Client, method: str, path: str, allowed: str):
    response = client.request(method, path, json={})
    body = _assert_error(response, 405, None)
    assert body["error"] == "method_not_allowed"
    assert allowed in response.headers["allow"]


# -- a store that fails ------------------------------------------------------------------
class _BrokenStore(SQLiteStore):
    """Fails in three ways: a bug, a store error, an unreadable database."""

    def cached(self, user: int, below: Key | None, limit: int) -> list[Entry]:
        msg = "secret internals"
        raise RuntimeError(msg)

    def author_tweets(self, authors: Sequence[int], below: Key | None,
                      limit: int) -> list[Entry]:
        msg = "cassandra timed out"
        raise StoreError(msg)

    def applied_offsets(self) -> dict[tuple[str, int], int]:
        msg = "database disk image is malformed"
        raise sqlite3.DatabaseError(msg)


@pytest.fixture(scope="module")
def broken(sqlite_filled: Filled) -> Iterator[httpx.Client]:
    assert sqlite_filled.path is not None
    store = _BrokenStore(sqlite_filled.path).open()
    with running(create_app(_settings(sqlite_filled.url), store)) as base, \
            webclient.client(base_url=base) as c:
        yield c
    store.close()


def test_unexpected_exception_is_500_json_without_details(broken: httpx.Client):
    body = _assert_error(broken.get("/v1/users/2/home"), 500, None)
    assert body == {"error": "internal", "message": "internal server error"}
    # The keep-alive connection survives the 500 (Starlette re-raises; the app contains it).
    assert broken.get("/v1/users/2/home?limit=x").status_code == 400


def test_store_error_is_503_json(broken: httpx.Client):
    response = broken.get("/v1/users/2/tweets")
    body = _assert_error(response, 503, None)
    assert body["error"] == "unavailable"
    assert int(response.headers["Retry-After"]) > 0


def test_healthz_degraded_when_store_unreadable(broken: httpx.Client):
    response = broken.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["store"] == "_BrokenStore"
    assert {"error", "message"} <= set(body)


# -- operations --------------------------------------------------------------------------
def test_healthz(client: httpx.Client, settings: ServingSettings):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "store": settings.store_url,
                               "applied_offsets": {"tweets": {"1": 41}}}


def test_docs_and_openapi_serve(client: httpx.Client):
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower()
    spec = client.get("/openapi.json").json()
    assert {"/v1/users/{user_id}/home", "/v1/users/{user_id}/tweets", "/healthz"} \
        <= set(spec["paths"])
    home = spec["paths"]["/v1/users/{user_id}/home"]["get"]
    assert "422" not in home["responses"]
    assert "400" in home["responses"]
    limit = next(p for p in home["parameters"] if p["name"] == "limit")
    assert limit["schema"]["anyOf"][0]["maximum"] == MAX_PAGE
    schemas = spec["components"]["schemas"]
    entry = schemas["TimelineEntry"]["properties"]
    assert entry["tweet_id"]["type"] == "string" and "2^53" in entry["tweet_id"]["description"]
    assert entry["kind"]["enum"] == ["post", "reply", "repost"]
    assert {"actor", "tweet"} <= set(schemas["TimelineEntry"]["required"])
    assert {"id", "text", "author", "in_reply_to_user_id"} <= set(schemas["Tweet"]["properties"])
    assert "404" in home["responses"]


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FANOUT_API_PORT", "9999")
    monkeypatch.setenv("FANOUT_STORE", "sqlite:///x.sqlite")
    monkeypatch.setenv("FANOUT_TIMELINE_CAP", "50")
    s = ServingSettings()
    assert (s.host, s.port, s.store_url, s.timeline_cap) == ("127.0.0.1", 9999,
                                                             "sqlite:///x.sqlite", 50)
    assert ServingSettings(port=1).port == 1
    with pytest.raises(ValueError, match="default_page"):
        ServingSettings(default_page=300)
