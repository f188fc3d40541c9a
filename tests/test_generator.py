"""The synthetic history generator: deterministic, power-law, internally consistent."""

from __future__ import annotations

import argparse
import json
from collections import Counter

import numpy as np
import pytest

from ingest import cli, generator
from ingest.events import MAX_ID, MAX_TEXT, TOPIC_RANK, Delete, Follow, Post, decode, encode
from ingest.generator import FILES, MANIFEST, History, for_graph, generate

SMALL = {"users": 2_000, "follows": 20_000, "tweets": 10_000}


@pytest.fixture(scope="module")
def history() -> History:
    return generate(**SMALL, seed=7, delete_ratio=0.05, unfollow_ratio=0.1)


def encoded(h: History) -> list[bytes]:
    return [encode(e)[1] for e in h.events()]


def test_same_seed_same_history(history):
    again = generate(**SMALL, seed=7, delete_ratio=0.05, unfollow_ratio=0.1)
    assert encoded(again) == encoded(history)


def test_other_seed_other_history(history):
    other = generate(**SMALL, seed=8, delete_ratio=0.05, unfollow_ratio=0.1)
    assert encoded(other) != encoded(history)


def test_same_seed_same_files(tmp_path):
    for name in ("a", "b"):
        generator.write(generate(300, 2_000, 1_000, seed=3), tmp_path / name)
    for name in [*FILES.values(), MANIFEST]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_counts(history):
    counts = history.counts()
    assert counts == {"users": 2_000, "follows": 20_000, "unfollows": 2_000,
                      "posts": 10_000, "deletes": 500}


def test_follower_counts_follow_a_power_law(history):
    followers = np.array(sorted(generator.follower_counts(history.follows).values()))
    assert len(followers) == SMALL["users"]
    top_1_percent = followers[-len(followers) // 100:].sum() / followers.sum()
    assert top_1_percent > 0.25, "a few users should hold a large share of all follows"
    assert followers[-1] > 20 * np.median(followers), "celebrities should stand out"
    assert followers[-1] <= SMALL["users"] - 1


def test_celebrities_get_their_share():
    h = generate(5_000, 40_000, 0, seed=1, celebrities=5, celebrity_share=0.3)
    top5 = sorted(generator.follower_counts(h.follows).values())[-5:]
    # Approximate: nobody's expected in-degree may exceed half the users.
    assert sum(top5) >= 0.2 * 40_000


def test_no_self_follows_and_no_duplicate_edges(history):
    edges = [(f.follower_id, f.followee_id) for f in history.follows if f.active]
    assert all(a != b for a, b in edges)
    assert len(edges) == len(set(edges)) == SMALL["follows"]


def test_unfollows_undo_earlier_follows(history):
    followed = {(f.follower_id, f.followee_id): f.created_at
                for f in history.follows if f.active}
    unfollows = [f for f in history.follows if not f.active]
    assert unfollows
    for u in unfollows:
        assert u.created_at > followed[(u.follower_id, u.followee_id)]
    assert len({(u.follower_id, u.followee_id) for u in unfollows}) == len(unfollows)


def test_deletes_come_after_their_posts(history):
    posts = {p.tweet_id: p for p in history.tweets if isinstance(p, Post)}
    deletes = [d for d in history.tweets if isinstance(d, Delete)]
    assert deletes
    assert len({d.tweet_id for d in deletes}) == len(deletes)
    for d in deletes:
        assert d.author_id == posts[d.tweet_id].author_id
        assert d.created_at > posts[d.tweet_id].created_at


def test_tweet_ids_are_time_ordered_unique_64_bit(history):
    posts = [t for t in history.tweets if isinstance(t, Post)]
    ids = [p.tweet_id for p in posts]
    assert len(set(ids)) == len(ids)
    assert all(0 < i <= MAX_ID for i in ids)
    assert ids == sorted(ids), "posts sorted by time must also be sorted by id"
    assert ids[0] > 2**60, "snowflake ids are large, like real tweet ids"


def test_authors_are_weighted_by_followers(history):
    followers = generator.follower_counts(history.follows)
    tweets = Counter(t.author_id for t in history.tweets if isinstance(t, Post))
    top = sorted(followers, key=followers.get, reverse=True)[:20]
    bottom = sorted(followers, key=followers.get)[:1000]
    per_top = sum(tweets[u] for u in top) / len(top)
    per_bottom = sum(tweets[u] for u in bottom) / len(bottom)
    assert per_top > 10 * per_bottom


def test_profiles_texts_and_times(history):
    handles = [u.handle for u in history.users]
    assert len(set(handles)) == len(handles)
    assert all(h and len(h) <= 15 and h.isascii() for h in handles)
    assert all(u.name for u in history.users)
    texts = [t.text for t in history.tweets if isinstance(t, Post)]
    assert all(0 < len(t) <= MAX_TEXT and t == t.strip() for t in texts)
    assert len(set(texts)) > 0.8 * len(texts), "texts are recombined, mostly distinct"
    lo, hi = generator.activity_window(generator.DEFAULT_START_MS, generator.DEFAULT_SPAN_MS)
    assert all(generator.DEFAULT_START_MS <= u.created_at < lo for u in history.users)
    assert all(lo <= e.created_at < hi for e in [*history.follows, *history.tweets])


def test_event_stream_is_in_time_order(history):
    keys = [(e.created_at, TOPIC_RANK[e.topic]) for e in history.events()]
    assert keys == sorted(keys)
    assert len(keys) == sum(history.counts().values())


def test_files_hold_contract_values_sorted_by_time(history, tmp_path):
    manifest = json.loads(generator.write(history, tmp_path).read_text())
    assert manifest["seed"] == 7
    assert manifest["counts"] == history.counts()
    for name, events in (("users", history.users), ("follows", history.follows),
                         ("tweets", history.tweets)):
        lines = (tmp_path / FILES[name]).read_bytes().splitlines()
        assert lines == [encode(e)[1] for e in events]
        decoded = [decode(e.topic, encode(e)[0], line) for e, line in zip(events, lines, strict=True)]
        assert decoded == events
        times = [e.created_at for e in decoded]
        assert times == sorted(times)


def test_for_graph_profiles_every_user_and_weights_authors():
    counts = {1: 5_000, 2: 100, 3: 0, 2**63 - 1: 0}
    h = for_graph(counts, 20_000, seed=1)
    assert [u.user_id for u in h.users] == sorted(counts)
    assert h.follows == []
    authors = Counter(t.author_id for t in h.tweets if isinstance(t, Post))
    assert authors[1] > 10 * authors[2] > 0
    assert all(len(u.handle) <= 50 for u in h.users)
    for e in h.events():
        assert decode(e.topic, *encode(e)) == e


def test_follower_counts_include_users_without_followers():
    edges = [Follow(1, 2, 10), Follow(3, 2, 11), Follow(3, 2, 12, active=False)]
    assert generator.follower_counts(edges) == {2: 2, 1: 0, 3: 0}


@pytest.mark.parametrize("kwargs,match", [
    ({"users": 1, "follows": 0, "tweets": 0}, "at least 2 users"),
    ({"users": 10, "follows": 46, "tweets": 0}, "too dense"),
    ({"users": 10, "follows": 5, "tweets": 0, "start_ms": 0}, "snowflake epoch"),
])
def test_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(**kwargs)


def test_generate_command(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="fanout")
    cli.register(parser.add_subparsers(required=True))
    args = parser.parse_args(["generate", "--out", str(tmp_path / "h"), "--users", "100",
                              "--follows", "500", "--tweets", "300", "--seed", "5",
                              "--start", "2023-06-01", "--span-days", "2"])
    assert args.func(args) == 0
    manifest = json.loads((tmp_path / "h" / MANIFEST).read_text())
    assert manifest["counts"]["posts"] == 300
    assert manifest["params"]["start_ms"] == 1_685_577_600_000
    assert "wrote" in capsys.readouterr().out
