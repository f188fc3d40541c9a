"""One of each record of DESIGN §4b, as events, as JSONL and as a CSV of records.

:data:`EVERY_KIND` holds every kind of changelog record (undos included) in time
order; :func:`jsonl` writes events as a JSONL history file and :data:`RECORDS_CSV` is
the same history as the CSV-of-records format. Used by the history reader's tests
and replay's.
"""

from __future__ import annotations

from pathlib import Path

from ingest.events import (
    BLOCK,
    MUTE,
    AccountDelete,
    Activity,
    Delete,
    Follow,
    Post,
    Relation,
    Repost,
    Unrepost,
    UserUpsert,
    encode,
)

EVERY_KIND = [
    UserUpsert(1, "a", "A", 10), UserUpsert(2, "b", "", 10), UserUpsert(3, "c", "C", 10),
    Follow(2, 1, 20), Follow(3, 1, 21), Follow(1, 2, 22),
    Post(100, 1, 30, "hi, \"all\""), Post(101, 2, 31, "@a hello\nthere", in_reply_to_user_id=1),
    Repost(102, 2, 100, 1, 32), Relation(3, 2, 33, BLOCK), Relation(1, 3, 34, MUTE),
    Unrepost(102, 2, 40), Repost(103, 3, 100, 1, 41), Delete(103, 3, 42),  # undo by delete
    Relation(3, 2, 43, BLOCK, active=False), Relation(1, 3, 44, MUTE, active=False),
    Delete(100, 1, 45), Follow(2, 1, 46, active=False), Activity(2, 47),
    AccountDelete(3, 50),
]


def jsonl(path: Path, events: list) -> Path:
    path.write_bytes(b"".join(encode(e)[1] + b"\n" for e in events))
    return path


RECORDS_CSV = [
    "created_at,op,tweet_id,author_id,text,in_reply_to_user_id,original_tweet_id,"
    "original_author_id,follower_id,followee_id,user_id,handle,name",
    "10,upsert,,,,,,,,,1,a,A",
    "10,upsert,,,,,,,,,2,b,",
    "10,upsert,,,,,,,,,3,c,C",
    "20,follow,,,,,,,2,1,,,",
    "21,follow,,,,,,,3,1,,,",
    "22,follow,,,,,,,1,2,,,",
    '30,post,100,1,"hi, ""all""",,,,,,,,',
    '31,post,101,2,"@a hello\nthere",1,,,,,,,',
    "32,repost,102,2,,,100,1,,,,,",
    "33,block,,,,,,,3,2,,,",
    "34,mute,,,,,,,1,3,,,",
    "40,unrepost,102,2,,,,,,,,,",
    "41,repost,103,3,,,100,1,,,,,",
    "42,delete,103,3,,,,,,,,,",
    "43,unblock,,,,,,,3,2,,,",
    "44,unmute,,,,,,,1,3,,,",
    "45,delete,100,1,,,,,,,,,",
    "46,unfollow,,,,,,,2,1,,,",
    "47,read,,,,,,,,,2,,",
    "50,delete,,,,,,,,,3,,",
]
