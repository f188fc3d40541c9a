"""The rules of a history's social records, re-derived from its events alone (:class:`World`).

Which follows were live when, which posts were shown, who replied to whom and who
reposted what: what the generator's social mix must respect, checked by its own
tests (``tests/ingest/test_generator.py``) and by replay's.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from ingest.events import AccountDelete, Delete, Event, Follow, Post, Repost, Unrepost


@dataclass
class World:
    """The rules of a history's social records, re-derived from its events alone."""

    follows: dict[tuple[int, int], list[tuple[int, int]]] = field(default_factory=dict)
    posts: dict[int, Post] = field(default_factory=dict)
    by_author: dict[int, list[Post]] = field(default_factory=lambda: defaultdict(list))
    reposts: dict[int, Repost] = field(default_factory=dict)
    deleted: dict[int, int] = field(default_factory=dict)
    undone: dict[int, Event] = field(default_factory=dict)
    gone: dict[int, int] = field(default_factory=dict)
    #: (author, replied-to user) -> the reply ids, oldest first.
    replies_to: dict[tuple[int, int], list[int]] = field(default_factory=lambda: defaultdict(list))
    reposted_by: dict[int, list[Repost]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def of(cls, events: list[Event]) -> World:
        w = cls()
        edges: dict[tuple[int, int], list[Follow]] = defaultdict(list)
        for e in sorted(events, key=lambda e: e.created_at):
            if isinstance(e, Follow):
                edges[(e.follower_id, e.followee_id)].append(e)
            elif isinstance(e, Post):
                w.posts[e.tweet_id] = e
                w.by_author[e.author_id].append(e)
                if e.in_reply_to_user_id:
                    w.replies_to[(e.author_id, e.in_reply_to_user_id)].append(e.tweet_id)
            elif isinstance(e, Repost):
                w.reposts[e.tweet_id] = e
                w.reposted_by[e.original_tweet_id].append(e)
            elif isinstance(e, Delete | Unrepost) and e.tweet_id in w.reposts:
                w.undone[e.tweet_id] = e
            elif isinstance(e, Delete):
                w.deleted[e.tweet_id] = e.created_at
            elif isinstance(e, AccountDelete):
                w.gone[e.user_id] = e.created_at
        w.follows = {pair: _intervals(changes) for pair, changes in edges.items()}
        return w

    def live(self, u: int, f: int, t: int) -> bool:
        return any(a < t < b for a, b in self.follows.get((u, f), []))

    def up(self, user: int, t: int) -> bool:
        return self.gone.get(user, 2**63) > t

    def shown(self, tweet_id: int, t: int) -> bool:
        post = self.posts[tweet_id]
        return post.created_at < t < self.deleted.get(tweet_id, 2**63) and self.up(
            post.author_id, t)

    def replied(self, x: int, u: int, t: int, *, still_up: bool = False) -> bool:
        """Whether ``x`` replied to ``u`` before ``t`` (and the reply is up at ``t``)."""
        replies = self.replies_to.get((x, u), [])
        times = [self.posts[r].created_at for r in replies]
        before = replies[:bisect.bisect_left(times, t)]
        return any(self.shown(r, t) for r in before) if still_up else bool(before)


def _intervals(changes: list[Follow]) -> list[tuple[int, int]]:
    spans, start = [], None
    for f in changes:
        if f.active and start is None:
            start = f.created_at
        elif not f.active and start is not None:
            spans.append((start, f.created_at))
            start = None
    return spans + ([(start, 2**63)] if start is not None else [])
