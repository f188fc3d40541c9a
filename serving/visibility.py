"""What one reader may see: DESIGN §4b's ``visible`` and ``ranked`` clauses, at read time.

The home path (:mod:`serving.timeline`) produces *candidate* entries newest first —
every post and shown repost the join fanned out to the reader, plus celebrities'
and the read-time fallback's — and :class:`Viewer` keeps those §4b serves. Blocks,
mutes, deleted accounts, deleted originals and reply visibility are filtered here
rather than materialized: none of them rewrites a timeline row on write, so a block
or an account delete costs one store row, however many timelines it touches.

For an entry of user ``u`` to be served (the pinned semantics of DESIGN §4b):

- its row is live (a post not deleted, a repost shown), and a repost's original is a
  live post — not a repost — by the repost's ``original_author``;
- its row is its actor's: a tweet id belongs to one author, and where several claim
  one the store's row holds the owner (:mod:`views.stores.plan`). An entry listed
  under another author at the row's own position — two claims at one time, one
  timeline row — is the owner's entry, served if the owner is in ``F(u)``;
- neither the actor nor the original's author is a deleted account, blocked by or
  blocking ``u``, or muted by ``u``; a repost of ``u``'s own tweet is not served;
- a reply is served if it answers ``u``, its own author, or someone in ``F(u)``
  (``u``'s live followees minus deleted accounts and blocks either way);
- and no *visible appearance* of the same original is newer: neither a shown repost
  by someone in ``F(u)`` (:meth:`TimelineReader.reposts_of`) nor the original post itself.

The last check reads the store, never the page, so whether an entry is served does
not depend on the cursor: pages concatenate to the query. Rows are read in bulk and
at most once per page: once a batch of candidates' own rows is in, their originals,
the profiles they name, their originals' newer reposts and (if a reply to a third
user is among them) the reader's followees are read together
(:meth:`~TimelineReader.hydrate`, one round trip on Cassandra); the followee list
otherwise only when a newer appearance needs it.
"""

from __future__ import annotations

import functools
from collections.abc import Container, Iterable, Sequence
from typing import Literal, NamedTuple

from views.delta import Key
from views.stores.contract import TimelineReader
from views.stores.rows import Entry, Relations, TweetRow, UserRow


class HomeEntry(NamedTuple):
    """One served entry: a post, a reply or a repost, at its timeline position.

    ``tweet_id`` is the entry's own id and ``author_id`` its actor (the reposter, for
    a repost); ``original_id``/``original_author`` the tweet shown (the entry itself,
    for a post); ``reply_to`` the user the original answers (0: not a reply).
    """

    created_at: int
    tweet_id: int
    author_id: int
    original_id: int
    original_author: int
    reply_to: int = 0

    @property
    def key(self) -> Key:
        return (self.created_at, self.tweet_id)

    @property
    def kind(self) -> Literal["post", "reply", "repost"]:
        """``repost``, ``reply`` or ``post``."""
        if self.tweet_id != self.original_id:
            return "repost"
        return "reply" if self.reply_to else "post"


class Viewer:
    """One reader (or none: an author's own page) of one store snapshot.

    Holds every tweet and user row read so far, so that rendering the page needs no
    further reads (:mod:`serving.render`).
    """

    def __init__(self, store: TimelineReader, user: int | None,
                 relations: Relations | None = None) -> None:
        """``relations``: the reader's, when read already (else read on first use)."""
        self.store, self.user = store, user
        self.tweets: dict[int, TweetRow] = {}
        self.users: dict[int, UserRow] = {}
        # ids read, found or not: tweets, profiles, authors' lists of tweets
        self._asked_t: set[int] = set()
        self._asked_u: set[int] = set()
        self._asked_a: set[int] = set()
        self._relations = relations
        self._followees: frozenset[int] | None = None
        # original → (bound, its shown reposts above the bound): read with the rows
        self._reposts: dict[int, tuple[Key, list[Entry]]] = {}

    # -- rows, read once -----------------------------------------------------------------
    def load(self, tweets: Iterable[int] = (), users: Iterable[int] = ()) -> None:
        """The tweets and profiles not read yet, read together (one round trip)."""
        ask_t = [i for i in dict.fromkeys(tweets) if i not in self._asked_t]
        ask_u = [i for i in dict.fromkeys(users) if i not in self._asked_u]
        if not (ask_t or ask_u):
            return
        if not ask_u:
            self.tweets.update(self.store.tweets(ask_t))
        elif not ask_t:
            self.users.update(self.store.users(ask_u))
        else:
            read = self.store.hydrate(ask_t, ask_u, {})
            self.tweets.update(read.tweets)
            self.users.update(read.users)
        self._asked_t.update(ask_t)
        self._asked_u.update(ask_u)

    def load_tweets(self, ids: Iterable[int]) -> None:
        self.load(tweets=ids)

    def load_users(self, ids: Iterable[int]) -> None:
        self.load(users=ids)

    def _hydrate(self, rows: list[tuple[Entry, TweetRow]], reposts: bool) -> None:
        """Read at once what deciding on ``rows`` reads next, where not read already.

        The reposts' originals, the profiles of the people named, and for a home page
        (``reposts``) each original's shown reposts above its oldest candidate and the
        reader's followees if a reply to a third user is among the candidates. A store
        that can runs them in one round trip instead of three or four in turn; reading a
        little more than the filter will ask for (rows of candidates it drops) is the
        price.
        """
        live = [(c, r) for c, r in rows if not r.deleted]
        tweets = [i for i in dict.fromkeys(r.original_id for _, r in live if r.original_id)
                  if i not in self._asked_t]
        people = {c.author_id for c, _ in live} | {r.original_author for _, r in live}
        people |= {r.reply_to for _, r in live}
        if self.user is not None:
            people.add(self.user)
        users = [u for u in people if u and u not in self._asked_u]
        bounds: dict[int, Key] = {}
        followees = False
        if reposts:
            for c, r in live:
                original, key = r.original_id or r.tweet_id, (c.created_at, c.tweet_id)
                if original not in bounds or key < bounds[original]:
                    bounds[original] = key
            bounds = {o: k for o, k in bounds.items()
                      if (kept := self._reposts.get(o)) is None or k < kept[0]}
            followees = self._followees is None and self.user is not None and any(
                r.reply_to not in (self.user, r.author_id) for _, r in live if r.reply_to)
        if not (tweets or users or bounds or followees):
            return
        read = self.store.hydrate(tweets, users, bounds, self.user, followees)
        self.tweets.update(read.tweets)
        self.users.update(read.users)
        self._asked_t.update(tweets)
        self._asked_u.update(users)
        for o, bound in bounds.items():
            self._reposts[o] = (bound, read.reposts.get(o, []))
        if read.followees is not None:
            self._followees = frozenset(read.followees)

    def _reposts_above(self, oldest: dict[int, Key]) -> dict[int, list[Entry]]:
        """Each original's shown reposts above its bound, at least: read with the rows or now."""
        out, ask = {}, {}
        for o, bound in oldest.items():
            kept = self._reposts.get(o)
            if kept is not None and kept[0] <= bound:
                if kept[1]:
                    out[o] = kept[1]
            else:
                ask[o] = bound
        if ask:
            out.update(self.store.reposts_of(list(ask), ask, self.user))
        return out

    @property
    def asked(self) -> set[tuple[str, int]]:
        """Every row read so far, found or not.

        ``("t", tweet_id)``, ``("u", user_id)``, or ``("a", author_id)`` for an author's
        list of tweets (:meth:`author_tweets`).
        """
        return {("t", i) for i in self._asked_t} | {("u", i) for i in self._asked_u} \
            | {("a", i) for i in self._asked_a}

    def author_tweets(self, authors: Sequence[int], below: Key, n: int) -> list[Entry]:
        """The store's :meth:`~TimelineReader.author_tweets`, the authors noted as read."""
        self._asked_a.update(authors)
        return self.store.author_tweets(authors, below, n)

    def tweet(self, tweet_id: int) -> TweetRow:
        """A loaded tweet row; one the store does not have reads as deleted."""
        return self.tweets.get(tweet_id) or _ABSENT

    def followees(self) -> frozenset[int]:
        """Live follow edges of the reader (read once)."""
        if self._followees is None:
            self._followees = frozenset(self.store.followees(self.user)) \
                if self.user is not None else frozenset()
        return self._followees

    def relations(self) -> Relations:
        if self._relations is None:
            self._relations = self.store.relations(self.user) \
                if self.user is not None else Relations()
        return self._relations

    def deleted(self, user: int) -> bool:
        row = self.users.get(user)
        return row is not None and row.deleted

    def reader_deleted(self) -> bool:
        """Whether the reader's own account is deleted (its home is not served)."""
        if self.user is None:
            return False
        self.load_users([self.user])
        return self.deleted(self.user)

    def follows(self, other: int) -> bool:
        """``other`` ∈ F(reader); ``other``'s row must have been loaded."""
        return other in self.followees() and not self.deleted(other) \
            and other not in self.relations().blocked

    # -- the filter ------------------------------------------------------------------------
    def home(self, candidates: Sequence[Entry]) -> list[HomeEntry]:
        """The candidates §4b serves to the reader, in the order given."""
        entries, claimed = self._live(candidates, reposts=True)
        if not entries:
            return []
        wanted = {e.author_id for e in entries} | {e.original_author for e in entries}
        wanted |= {e.reply_to for e in entries if e.reply_to}
        self.load_users([*wanted, self.user] if self.user is not None else wanted)
        blocked, muted = self.relations()
        hidden = blocked | muted | {u for u, row in self.users.items() if row.deleted}
        shown = [e for e in entries if self._shown(e, hidden)
                 and (e.tweet_id not in claimed or self.follows(e.author_id))]
        return self._newest_per_original(shown)

    def own(self, candidates: Sequence[Entry]) -> list[HomeEntry]:
        """An author's own page: live posts and shown reposts of live originals."""
        entries, claimed = self._live(candidates)
        entries = [e for e in entries if e.tweet_id not in claimed]
        self.load_users({e.author_id for e in entries} | {e.original_author for e in entries})
        return [e for e in entries if not self.deleted(e.original_author)]

    def _live(self, candidates: Sequence[Entry], reposts: bool = False
              ) -> tuple[list[HomeEntry], set[int]]:
        """Live entries as their rows say, and the ids listed under another author.

        ``reposts``: read the newer reposts of their originals too (:meth:`_hydrate`).
        """
        self.load_tweets(c.tweet_id for c in candidates)
        get = self.tweets.get
        rows = [(c, get(c.tweet_id) or _ABSENT) for c in candidates]
        self._hydrate(rows, reposts)
        # One id under two authors at one time: listed once per author (two followees'
        # author_tweets), it is one entry, the row's.
        owned = {(c.created_at, c.tweet_id) for c, r in rows if r.author_id == c.author_id}
        claimed = {c.tweet_id for c, r in rows if r.author_id != c.author_id
                   and r.created_at == c.created_at and (c.created_at, c.tweet_id) not in owned}
        out: dict[Key, HomeEntry] = {}
        for c, r in rows:
            key = (c.created_at, c.tweet_id)
            if key not in out and (e := self._entry(c, r)) is not None:
                out[key] = e
        return list(out.values()), claimed

    def _entry(self, candidate: Entry, row: TweetRow) -> HomeEntry | None:
        # Deleted, hidden, or not in the store at all; or listed at a position that is
        # not the row's (an index row left behind: the row is the truth).
        if row.deleted or row.created_at != candidate.created_at:
            return None
        if not row.original_id:
            return _home_entry((candidate.created_at, row.tweet_id, row.author_id, row.tweet_id,
                                row.author_id, row.reply_to))
        original = self.tweets.get(row.original_id) or _ABSENT
        if original.deleted or original.original_id or original.author_id != row.original_author:
            return None
        return _home_entry((candidate.created_at, row.tweet_id, row.author_id, original.tweet_id,
                            original.author_id, original.reply_to))

    def _shown(self, e: HomeEntry, hidden: Container[int]) -> bool:
        """``hidden``: the reader's blocks (either way) and mutes, and deleted accounts."""
        if e.author_id in hidden or e.original_author in hidden:
            return False
        if e.tweet_id != e.original_id:  # a repost
            return e.original_author != self.user
        return self._reply_visible(e.author_id, e.reply_to)

    def _reply_visible(self, author: int, reply_to: int) -> bool:
        return not reply_to or reply_to in (self.user, author) or self.follows(reply_to)

    def _newest_per_original(self, entries: list[HomeEntry]) -> list[HomeEntry]:
        """Entries with no newer visible appearance of their original (``ranked``, rn = 1)."""
        # Only reposts newer than an entry can hide it: each original's oldest entry
        # here bounds what is read (a viral tweet's older reposts are not).
        oldest: dict[int, Key] = {}
        for e in entries:
            key, was = (e.created_at, e.tweet_id), oldest.get(e.original_id)
            if was is None or key < was:
                oldest[e.original_id] = key
        reposts = self._reposts_above(oldest)
        newer: dict[int, list[Entry]] = {}
        for e in entries:
            if rs := reposts.get(e.original_id):
                if later := _newer(rs, e):
                    newer[e.tweet_id] = later
        posts = {e.tweet_id: post for e in entries if e.tweet_id != e.original_id
                 and _key(post := self.tweet(e.original_id)) > (e.created_at, e.tweet_id)}
        if not newer and not posts:
            return entries
        # Only a reposter the reader follows can make a repost visible: the followee
        # list (one read) usually rules them all out before any row is read.
        followees = self.followees()
        newer = {e: [r for r in rs if r.author_id in followees] for e, rs in newer.items()}
        others = [r for rs in newer.values() for r in rs]
        self.load([r.tweet_id for r in others], [r.author_id for r in others])
        return [e for e in entries
                if not any(self._repost_visible(r, e) for r in newer.get(e.tweet_id, ()))
                and not (e.tweet_id in posts and self._post_visible(posts[e.tweet_id]))]

    def _repost_visible(self, repost: Entry, of: HomeEntry) -> bool:
        """Whether another repost of a visible entry's original is visible too.

        The original's own conditions are the entry's, already met; what is left is
        the reposter (in F(reader), not muted) and the repost naming the right author.
        """
        row = self.tweet(repost.tweet_id)
        return not row.deleted and row.original_author == of.original_author \
            and row.author_id == repost.author_id and row.created_at == repost.created_at \
            and self.follows(repost.author_id) \
            and repost.author_id not in self.relations().muted

    def _post_visible(self, post: TweetRow) -> bool:
        """The original post, newer than a repost of it: visible when its author is in F."""
        return self.follows(post.author_id) and self._reply_visible(post.author_id,
                                                                    post.reply_to)


def _key(row: TweetRow) -> Key:
    return (row.created_at, row.tweet_id)


def _newer(reposts: list[Entry], e: HomeEntry) -> list[Entry]:
    """The reposts newer than ``e`` (they come newest first), ``e`` itself left out."""
    key, out = (e.created_at, e.tweet_id), []
    for r in reposts:
        if (r.created_at, r.tweet_id) <= key:
            break
        if r.tweet_id != e.tweet_id:
            out.append(r)
    return out


#: A HomeEntry from its six fields, without the keyword handling of its constructor
#: (assembling a page builds one per candidate).
_home_entry = functools.partial(tuple.__new__, HomeEntry)


#: A tweet id the store does not know: reads as deleted.
_ABSENT = TweetRow(0, 0, 0, "", deleted=True)
