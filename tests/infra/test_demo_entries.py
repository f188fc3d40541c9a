"""The demo's search for one entry of each kind in served timelines, against a fake API."""

from __future__ import annotations

from unittest.mock import MagicMock

import httpx

from infra.demo import KINDS, describe, one_of_each
from views.stores.base import Store, UserRow


def _entry(kind: str, entry_id: int, author: int, actor: int, reply_to: int | None = None
           ) -> dict:
    return {"tweet_id": str(entry_id), "kind": kind, "created_at": entry_id,
            "created_at_iso": "2024-01-02T03:04:05.000Z",
            "actor": {"id": str(actor), "handle": f"u{actor}", "name": None},
            "tweet": {"id": str(entry_id), "created_at": entry_id,
                      "created_at_iso": "2024-01-02T03:04:05.000Z", "text": f"text {entry_id}",
                      "author": {"id": str(author), "handle": f"u{author}", "name": None},
                      "in_reply_to_user_id": None if reply_to is None else str(reply_to)}}


PAGES = {1: [_entry("post", 11, 5, 5)],
         3: [_entry("post", 31, 5, 5), _entry("reply", 32, 6, 6, reply_to=7)],
         4: [_entry("repost", 41, 8, 9)],
         5: [_entry("repost", 51, 8, 2)]}


def _client(asked: list[int]) -> httpx.Client:
    def api(request: httpx.Request) -> httpx.Response:
        user = int(request.url.path.split("/")[3])
        asked.append(user)
        if user == 2:
            return httpx.Response(404, json={"error": "not_found", "field": "user_id",
                                             "message": "user 2's account is deleted"})
        return httpx.Response(200, json={"entries": PAGES.get(user, []), "next_cursor": None})

    return httpx.Client(transport=httpx.MockTransport(api), base_url="http://api")


def test_one_of_each_kind_passes_over_deleted_accounts_and_stops_when_all_are_found():
    asked: list[int] = []
    found = one_of_each(_client(asked), [1, 2, 3, 4, 5])
    assert set(found) == set(KINDS)
    assert {k: (user, e["tweet_id"]) for k, (user, e) in found.items()} == {
        "post": (1, "11"), "reply": (3, "32"), "repost": (4, "41")}
    assert asked == [1, 2, 3, 4]  # user 5 was not needed


def test_one_of_each_says_which_kinds_it_did_not_find():
    assert set(one_of_each(_client([]), [1, 2])) == {"post"}


def test_entries_read_as_who_did_what():
    store = MagicMock(spec_set=Store)
    store.users.return_value = {7: UserRow(7, "seven", "Seven")}
    assert describe(_entry("post", 11, 5, 5), store) == \
        "2024-01-02T03:04:05.000Z  @u5: text 11"
    assert describe(_entry("repost", 41, 8, 9), store).endswith("@u9 reposted @u8: text 41")
    assert describe(_entry("reply", 32, 6, 6, reply_to=7), store).endswith(
        "@u6 replying to @seven: text 32")
    store.users.assert_called_once_with([7])
