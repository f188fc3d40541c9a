"""The live verifier's log tail: which users a record names (``infra.checks.logtail``)."""

from __future__ import annotations

from infra.checks.logtail import named_users
from ingest.events import KINDS
from tests.support.history import EVERY_KIND


def test_every_kind_names_the_users_whose_timelines_or_entries_it_can_change():
    named = [named_users(e) for e in EVERY_KIND]
    assert named == [
        (1,), (2,), (3,),  # profiles
        (2, 1), (3, 1), (1, 2),  # follows: follower, then followee
        (1,), (2,),  # posts: their author
        (2, 1), (3, 2), (1, 3),  # a repost names its original's author; block, mute
        (2,), (3, 1), (3,),  # unrepost, repost, the delete that undoes it
        (3, 2), (1, 3),  # unblock, unmute
        (1,), (2, 1), (),  # delete, unfollow; a read changes no one's entries
        (3,),  # account deletion
    ]


def test_the_history_holds_every_kind_of_record():
    assert {type(e) for e in EVERY_KIND} == {k.event for k in KINDS}
