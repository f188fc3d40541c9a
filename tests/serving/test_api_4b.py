"""DESIGN §4b over HTTP: the cases DESIGN §4b lists, step by step, as a client sees them.

Each test builds a small world through the pure join (``views.local.LocalJoin``, no
Spark) into a SQLite file that the API serves, then changes it one record at a time.
After every step the reader's home timeline is read page by page (limits 1, 2 and
50, so cursors cross every kind of entry) and must equal ``views.reference`` — the
literal §4b SQL — entry for entry, and the hand-written expectation of the step: which
entries, of which kind, by which actor. Every test runs twice: with the authors on
the fan-out path, and as celebrities (their entries merged at read time). The cap is
3, so deeper pages come from the read-time fallback below the horizon.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra import webclient
from ingest.events import (
    BLOCK,
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
from serving.app import create_app
from serving.settings import ServingSettings
from serving.shapes import parse_page
from tests.support.api import running
from tests.support.join import Harness
from views.join import JoinConfig
from views.reference import Reference
from views.stores.sqlite import SQLiteStore

READER, A, B, S = 10, 1, 2, 3  # the reader follows A and B; S is a stranger
CAP = 3
PATHS = {"fan-out": JoinConfig(cap=CAP, promote_at=100, demote_below=80),
         "celebrity": JoinConfig(cap=CAP, promote_at=1, demote_below=1)}

Seen = list[tuple[int, str, int]]
"""A home timeline as (entry id, kind, actor id), newest first."""


class World:
    """The join, its store, the API over it, and every event so far."""

    def __init__(self, config: JoinConfig, path: Path, client: httpx.Client) -> None:
        self.harness = Harness(config, SQLiteStore(path, cap=CAP).open())
        self.client = client
        self.events: list[Event] = []
        self.run(*[UserUpsert(u, f"u{u}", f"User {u}", 0) for u in (READER, A, B, S)],
                 Follow(READER, A, 1), Follow(READER, B, 1), Follow(B, A, 1), Follow(A, S, 1),
                 Post(101, S, 10, "s1"), Post(102, A, 20, "a1"), Post(103, B, 30, "b1"),
                 Post(104, A, 40, "a2"), Post(105, B, 50, "b2"))

    def run(self, *events: Event) -> None:
        self.events += events
        self.harness.run(list(events))

    def home(self, user: int = READER) -> Seen:
        """The user's home as served, checked against the §4b SQL at every page size."""
        want = Reference().add(self.events).home(user, 10**6)
        pages = {limit: self._pages(user, limit) for limit in (1, 2, 50)}
        for limit, entries in pages.items():
            assert [int(e["tweet_id"]) for e in entries] == [r.entry_id for r in want], limit
            assert [(e["created_at"], int(e["actor"]["id"]), int(e["tweet"]["id"]),
                     int(e["tweet"]["author"]["id"])) for e in entries] \
                == [(r.created_at, r.actor_id, r.original_tweet_id, r.original_author_id)
                    for r in want]
        return [(int(e["tweet_id"]), e["kind"], int(e["actor"]["id"])) for e in pages[50]]

    def _pages(self, user: int, limit: int) -> list[dict]:
        entries: list[dict] = []
        params: dict[str, str | int] = {"limit": limit}
        for _ in range(100):
            response = self.client.get(f"/v1/users/{user}/home", params=params)
            assert response.status_code == 200, response.text
            page = parse_page(response.content)
            assert len(page["entries"]) <= limit
            entries += response.json()["entries"]
            if page["next_cursor"] is None:
                return entries
            params = {"limit": limit, "cursor": page["next_cursor"]}
        pytest.fail(f"user {user}'s home still had a next_cursor after 100 pages")


@pytest.fixture(params=list(PATHS))
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    path = tmp_path / "w.sqlite"
    SQLiteStore(path, cap=CAP).open().close()
    # No celebrity cache: each step's page must show it at once (the cache's staleness
    # is tested in test_celebrity_refresh and test_reads).
    settings = ServingSettings(store_url=f"sqlite:///{path}", timeline_cap=CAP, auth=False,
                               max_page=50, celebrity_refresh_s=0)
    with running(create_app(settings)) as base, webclient.client(base_url=base, timeout=10) as c:
        w = World(PATHS[request.param], path, c)
        if request.param == "celebrity":
            assert {A, B} <= set(w.harness.store.celebrities())
        yield w
        w.harness.store.close()


BASE: Seen = [(105, "post", B), (104, "post", A), (103, "post", B), (102, "post", A)]


def test_the_world_before(world: World):
    assert world.home() == BASE


def test_a_repost_of_a_visible_tweet_moves_it_up_once(world: World):
    world.run(Repost(201, B, 102, A, 60))
    assert world.home() == [(201, "repost", B), (105, "post", B), (104, "post", A),
                            (103, "post", B)]
    entry = world.client.get(f"/v1/users/{READER}/home?limit=1").json()["entries"][0]
    assert entry["tweet"] == {"id": "102", "created_at": 20,
                              "created_at_iso": "1970-01-01T00:00:00.020Z", "text": "a1",
                              "author": {"id": str(A), "handle": f"u{A}", "name": f"User {A}"},
                              "in_reply_to_user_id": None}
    world.run(Unrepost(201, B, 70))
    assert world.home() == BASE


def test_two_followees_reposting_one_tweet_show_it_once(world: World):
    world.run(Repost(201, A, 101, S, 60), Repost(202, B, 101, S, 70))
    assert world.home()[:2] == [(202, "repost", B), (105, "post", B)]
    world.run(Delete(202, B, 80))  # a tweets-topic delete of the repost undoes it too
    assert world.home()[:2] == [(201, "repost", A), (105, "post", B)]
    world.run(Delete(101, S, 90))  # the original's delete hides every repost of it
    assert world.home() == BASE


def test_a_block_while_a_repost_is_in_the_cache(world: World):
    world.run(Repost(201, A, 101, S, 60))
    assert world.home()[0] == (201, "repost", A)
    world.run(Relation(READER, S, 70, BLOCK))  # the original's author
    assert world.home() == BASE
    world.run(Relation(READER, S, 80, BLOCK, active=False))
    assert world.home()[0] == (201, "repost", A)
    world.run(Relation(S, READER, 90, BLOCK))  # blocks act both ways
    assert world.home() == BASE
    world.run(Relation(S, READER, 95, BLOCK, active=False), Relation(READER, A, 95, BLOCK))
    assert world.home() == [(105, "post", B), (103, "post", B)]  # the reposter: all of A


def test_mute_then_unmute(world: World):
    world.run(Repost(201, B, 104, A, 60), Follow(A, READER, 61), Post(106, READER, 62, "r"))
    assert world.home()[0] == (201, "repost", B)
    assert world.home(A)[0] == (106, "post", READER)
    world.run(Relation(READER, A, 70, MUTE))  # A's posts, and B's repost of A's tweet
    assert world.home() == [(105, "post", B), (103, "post", B)]
    assert world.home(A)[0] == (106, "post", READER)  # one way: A still sees the reader
    world.run(Relation(READER, A, 80, MUTE, active=False))
    assert world.home()[0] == (201, "repost", B)


def test_replies_show_to_followers_of_both_sides(world: World):
    world.run(Post(301, B, 60, "@S hi", S), Post(302, B, 61, "@reader hi", READER),
              Post(303, B, 62, "@A hi", A))
    assert world.home()[:2] == [(303, "reply", B), (302, "reply", B)]  # not to S
    world.run(Follow(READER, S, 70))
    assert world.home()[:3] == [(303, "reply", B), (302, "reply", B), (301, "reply", B)]
    reply = world.client.get(f"/v1/users/{READER}/home?limit=1").json()["entries"][0]
    assert reply["tweet"]["in_reply_to_user_id"] == str(A)


def test_deleting_an_account_with_followers_reposts_and_replies(world: World):
    world.run(Repost(201, A, 101, S, 60), Repost(202, B, 104, A, 61),
              Post(301, B, 62, "@A hi", A), Post(302, A, 63, "@B hi", B))
    assert world.home() == [(302, "reply", A), (301, "reply", B), (202, "repost", B),
                            (201, "repost", A), (105, "post", B), (103, "post", B),
                            (102, "post", A)]
    world.run(AccountDelete(A, 70))
    # A's posts, replies and reposts go; so does B's repost of A's tweet, and B's
    # reply to A (A is no longer someone the reader follows).
    assert world.home() == [(105, "post", B), (103, "post", B)]
    assert world.home(B) == []
    for route in ("home", "tweets"):
        gone = world.client.get(f"/v1/users/{A}/{route}")
        assert gone.status_code == 404 and gone.json()["field"] == "user_id"
    world.run(UserUpsert(A, "back", "Back", 80), Post(106, A, 90, "after"))  # ignored
    assert world.home() == [(105, "post", B), (103, "post", B)]


def test_the_authors_page_lists_reposts_of_live_tweets(world: World):
    world.run(Repost(201, B, 101, S, 60), Repost(202, B, 104, A, 61))
    def page() -> list[tuple[str, str]]:
        body = world.client.get(f"/v1/users/{B}/tweets?limit=50").json()
        return [(e["tweet_id"], e["kind"]) for e in body["entries"]]
    assert page() == [("202", "repost"), ("201", "repost"), ("105", "post"), ("103", "post")]
    world.run(Delete(101, S, 70), AccountDelete(A, 71))
    assert page() == [("105", "post"), ("103", "post")]
