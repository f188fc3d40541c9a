"""Unit tests of the social load mix: the planner's §4b actions, expected answers, probes.

Each action's precondition is checked on the calls the planner makes: a reply or
repost only of a tweet the actor's page just showed (never the actor's own), an
unrepost only of a repost this run made, undos of blocks and mutes only of this run's
edges, the probe's users never blocked, muted or deleted, and a deleted account
never acted as again. No Locust here (see ``test_loadgen.py`` for why).
"""

from __future__ import annotations

import itertools
import json
import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from ingest.social import SOCIAL
from loadgen.action import (
    ACTION_NAMES,
    BLOCK,
    DELETE_ACCOUNT,
    HOME,
    MUTE,
    POST,
    REPLY,
    REPOST,
    TWEETS,
    UNBLOCK,
    UNMUTE,
    UNREPOST,
    Call,
    Planner,
)
from loadgen.probe import FanoutProbe, ProbeSettings, Target
from loadgen.recording import Recorder
from loadgen.report import ModeRun, build, render_text
from loadgen.summary import Expected, problems, summarize, table
from loadgen.workload import (
    ACTIONS,
    DEFAULT_PROFILE,
    PROFILES,
    USERS_PER_POST,
    Mix,
    Workload,
    parse_mix,
)
from tests.support.probes import run_until, steps

ACTOR = 5


def _only(**weights: float) -> Mix:
    """A mix of just these actions (every other weight 0)."""
    return Mix(**(dict.fromkeys(ACTIONS, 0.0) | weights))


def _page(*tweets: tuple[int, int]) -> dict[str, Any]:
    """A home page showing (tweet id, author id) pairs, as the API renders entries."""
    return {"entries": [{"tweet_id": str(t), "kind": "post",
                         "actor": {"id": str(a)},
                         "tweet": {"id": str(t), "author": {"id": str(a)}}}
                        for t, a in tweets], "next_cursor": "c"}


def _planner(mix: Mix, users: int = 30, reserved: tuple[int, ...] = (), seed: int = 1
             ) -> Planner:
    workload = Workload.from_range(1, users, seed=seed)
    workload.reserved = list(reserved)
    return Planner(workload, mix, random.Random(seed), texts=["hello"])


def _pre_read(planner: Planner) -> Call:
    call = planner.next_call()
    assert call.name == HOME and call.then is not None and call.expected == (404,)
    assert planner.needs_body(call) is True
    return call


# -- the social profile ----------------------------------------------------------------------
def test_the_social_profile_is_the_default_in_the_proportions_of_the_histories():
    mix = PROFILES["social"]
    assert DEFAULT_PROFILE == "social" and parse_mix("") == mix == parse_mix(mix.describe())
    posts = mix.post + mix.reply
    assert mix.reply / posts == pytest.approx(SOCIAL.replies, rel=1e-3)
    assert mix.repost / posts == pytest.approx(SOCIAL.reposts, rel=1e-3)
    assert mix.unrepost / mix.repost == pytest.approx(SOCIAL.unrepost_ratio, rel=1e-3)
    assert (mix.block / posts, mix.mute / posts) == (pytest.approx(SOCIAL.blocks, rel=1e-3),
                                                     pytest.approx(SOCIAL.mutes, rel=1e-3))
    assert mix.unblock / mix.block == pytest.approx(SOCIAL.unblock_ratio, rel=1e-3)
    assert mix.unmute / mix.mute == pytest.approx(SOCIAL.unmute_ratio, rel=1e-3)
    assert mix.delete_account / posts == pytest.approx(
        SOCIAL.account_deletes * USERS_PER_POST, rel=1e-3)
    # The read load of read-heavy: the tweet-like writes share its post weight.
    assert posts + mix.repost == pytest.approx(PROFILES["read-heavy"].post, rel=1e-3)
    assert 60 <= mix.reads_per_write() <= 70
    assert all(getattr(PROFILES["read-heavy"], a) == 0 for a in ("reply", "repost", "block"))


def test_every_action_has_a_request_name_and_a_mix_weight():
    assert set(ACTION_NAMES) == set(ACTIONS) == set(Mix().weights())
    assert len(set(ACTION_NAMES.values())) == len(ACTIONS)


# -- replies and reposts -----------------------------------------------------------------------
def test_a_repost_is_of_a_tweet_the_page_showed_never_the_actors_own_nor_twice():
    planner = _planner(_only(repost=1))
    for _ in range(20):
        call = _pre_read(planner)
        actor = call.actor
        assert actor is not None
        page = _page((101, actor), (102, 97), (103, 98))
        follow = planner.answered(call, page)
        assert follow is not None and follow.name == REPOST and follow.actor == actor
        tweet = follow.path.split("/")[3]
        assert follow.path == f"/v1/tweets/{tweet}/reposts" and tweet in ("102", "103")
        assert follow.other == {"102": 97, "103": 98}[tweet] and follow.expected == (404, 409)
        assert planner.needs_body(follow) is True
        planner.answered(follow, {"repost_id": f"r{tweet}", "original_id": tweet,
                                  "token": "k"})
        again = planner.answered(call, page)  # the same page: only the other tweet is left
        assert again is not None and again.path.split("/")[3] != tweet
        planner.answered(again, {"repost_id": "r2", "original_id": again.path.split("/")[3]})
        assert planner.answered(call, page) is None  # nothing left to repost on it
        assert planner.answered(call, _page()) is None  # an empty page ends the action
        planner.memory.reposts.clear()
        planner.memory.reposted.clear()


def test_a_reply_answers_a_tweet_the_page_showed_and_can_be_deleted_later():
    planner = _planner(_only(reply=1, delete=1))
    replied: dict[str, int | None] = {}
    deleted = 0
    for i in range(60):
        call = planner.next_call()
        if call.name == "DELETE tweet":
            tweet = call.path.rsplit("/", 1)[1]
            assert replied.pop(tweet) == call.actor  # a tweet of this run, by its author
            deleted += 1
            continue
        if call.name == POST:  # nothing to delete yet: the opposite, a post
            replied[f"t{i}"] = call.actor
            planner.answered(call, {"tweet_id": f"t{i}", "token": "k"})
            continue
        assert call.then == "reply"
        reply = planner.answered(call, _page((201, call.actor or 0), (202, 99)))
        assert reply is not None and reply.name == REPLY and reply.method == "POST"
        assert reply.body == {"text": "hello", "in_reply_to": "202"}
        assert reply.other == 99 and reply.expected == (404,) and reply.path == "/v1/tweets"
        replied[f"t{i}"] = reply.actor
        planner.answered(reply, {"tweet_id": f"t{i}", "token": "k"})
    assert len(replied) + deleted > 20 and deleted > 5


def test_an_unrepost_undoes_only_a_repost_this_run_made():
    planner = _planner(_only(unrepost=1))
    first = _pre_read(planner)  # nothing to undo yet: the opposite, a repost
    assert first.then == "repost"
    repost = planner.answered(first, _page((301, 9)))
    assert repost is not None and repost.name == REPOST
    planner.answered(repost, {"repost_id": "401", "original_id": "301"})
    undo = planner.next_call()
    assert (undo.method, undo.path, undo.name, undo.actor) == (
        "DELETE", "/v1/reposts/401", UNREPOST, first.actor)
    # Undone: the actor may repost that tweet again.
    assert planner.answered(first, _page((301, 9))) is not None


def test_a_failed_or_refused_repost_is_not_remembered():
    planner = _planner(_only(repost=1, unrepost=0.0001))
    call = _pre_read(planner)
    repost = planner.answered(call, _page((301, 9)))
    assert repost is not None
    assert planner.answered(repost, None) is None
    planner.refused(repost, 409)
    assert not planner.memory.reposts and not planner.memory.reposted


# -- blocks, mutes and their undos ---------------------------------------------------------------
def test_blocks_and_mutes_spare_the_probes_users_and_undo_only_this_runs_edges():
    reserved = (1, 2, 3, 4)
    planner = _planner(_only(block=2, unblock=1, mute=2, unmute=1), users=12,
                       reserved=reserved)
    made: dict[str, set[tuple[int, int]]] = {BLOCK: set(), MUTE: set()}
    undo_of = {UNBLOCK: BLOCK, UNMUTE: MUTE}
    seen: Counter[str] = Counter()
    for _ in range(2000):
        call = planner.next_call()
        seen[call.name] += 1
        if call.name == HOME:  # no free pair drawn: a read instead
            continue
        assert call.actor not in reserved and call.other not in reserved
        assert call.actor != call.other and call.expected == ()
        pair = (call.actor or 0, call.other or 0)
        path = {BLOCK: "blocks", UNBLOCK: "blocks", MUTE: "mutes", UNMUTE: "mutes"}[call.name]
        assert call.path == f"/v1/users/{pair[0]}/{path}/{pair[1]}"
        if call.name in made:
            assert call.method == "PUT"
            made[call.name].add(pair)
            planner.answered(call, {"token": "k"})
        else:
            assert call.method == "DELETE" and pair in made[undo_of[call.name]]
    assert min(seen[n] for n in (BLOCK, UNBLOCK, MUTE, UNMUTE)) > 100, seen
    assert seen[HOME] < 2000 * 0.05, seen


# -- account deletions ------------------------------------------------------------------------------
def test_a_deleted_account_is_never_acted_as_or_read_again():
    reserved = (1, 2)
    mix = _only(home=3, tweets=1, post=1, follow=1, block=1, delete_account=0.3)
    planner = _planner(mix, users=15, reserved=reserved)
    gone: set[int] = set()
    deleted = 0
    for _ in range(3000):
        call = planner.next_call()
        assert call.actor not in gone and call.other not in gone, (call, gone)
        if call.name == DELETE_ACCOUNT:
            assert call.actor not in reserved and call.path == f"/v1/users/{call.actor}"
            assert call.method == "DELETE" and call.expected == ()
            deleted += 1
            if deleted <= 5:  # keep some users: past that, the deletes fail (not remembered)
                planner.answered(call, {"token": "k"})
                gone.add(call.actor or 0)
            else:
                planner.answered(call, None)
        elif call.name in (HOME, TWEETS):
            assert call.expected == (404,)
    assert deleted > 5 and gone == planner.memory.gone
    assert not gone & set(reserved)


def test_a_404_for_a_timeline_says_the_account_is_gone():
    planner = _planner(_only(home=1, tweets=1), users=3)
    users = {1, 2, 3}
    for _ in range(200):
        call = planner.next_call()
        if call.name == HOME and call.actor == 1:
            planner.refused(call, 404)
        if call.name == TWEETS and call.other == 2:
            planner.refused(call, 404)
    assert planner.memory.gone == {1, 2}
    later = [planner.next_call() for _ in range(200)]
    assert {c.actor for c in later if c.name == HOME} == users - {1, 2}
    assert {c.other for c in later if c.name == TWEETS} == users - {1, 2}


def test_undos_of_a_deleted_actor_are_dropped_and_posts_fall_back():
    planner = _planner(_only(post=1, delete=1), users=4)
    post = next(c for c in iter(planner.next_call, None) if c.name == POST)
    planner.answered(post, {"tweet_id": "9", "token": "k"})
    planner.memory.gone.add(post.actor or 0)
    calls = [planner.next_call() for _ in range(50)]
    assert not any(c.path == "/v1/tweets/9" for c in calls)
    assert all(c.actor != post.actor for c in calls)


# -- expected answers in the figures ----------------------------------------------------------------
def test_expected_answers_are_counted_apart_merged_and_checked():
    master = Expected(measure_from=100.0)
    for worker in range(2):
        counted = Expected(measure_from=100.0)
        counted.add(HOME, 404, due=99.0)  # warm-up: left out, as from the histograms
        counted.add(HOME, 404, due=100.5)
        counted.add(REPOST, 409 - worker * 5, due=101.0)
        wire = msgpack.unpackb(msgpack.packb(counted.drain(), use_bin_type=True), raw=False)
        assert counted.to_dict() == {}
        master.merge(wire)
    assert master.to_dict() == {HOME: {"404": 2}, REPOST: {"409": 1, "404": 1}}
    rec = Recorder(measure_from=100.0)
    for name, n in ((HOME, 5), (REPOST, 3), (POST, 1)):
        for i in range(n):
            rec.record(name, due=100.0 + i, done=100.1 + i, latency=0.1, service=0.1, ok=True)
    s = summarize(rec, 10.0, master.to_dict())
    assert (s["endpoints"][HOME]["expected"], s["endpoints"][REPOST]["expected"]) == (2, 2)
    assert (s["reads"]["expected"], s["writes"]["expected"], s["all"]["expected"]) == (2, 2, 4)
    assert s["all"]["errors"] == 0 and problems(s) == []
    text = table(s)
    assert "expected answers (not errors): GET home 404 x2; POST repost 404 x1; " \
           "POST repost 409 x1" in text
    s["endpoints"][POST]["expected"] = 2
    assert any("POST tweet: 0 errors and 2 expected" in p for p in problems(s))


def test_the_report_shows_expected_answers_and_the_repost_probe(tmp_path: Path):
    from loadgen.probe import ProbeResult, Sample

    rec = Recorder(measure_from=1000.0)
    for i in range(20):
        rec.record(HOME, due=1000.0 + i, done=1000.01 + i, latency=0.01, service=0.01, ok=True)
    results = {"meta": {"started_at": 999.0, "measure_from": 1000.0, "stopped_at": 1020.0,
                        "options": {"fanout_rate": 1}},
               "recording": rec.to_dict(), "expected": {HOME: {"404": 3}}}
    probe = ProbeResult()
    probe.add(Sample("normal", 7, 3, 1004.0, 0.01, 0.5))
    probe.add(Sample("repost", 7, 3, 1005.0, 0.01, 0.9))
    probe.add_own(0.2, shown=True)
    probe.add_own(0.3, shown=False)
    summary = build([ModeRun("fanout", results, probe)], {"name": "unit"}, tmp_path)
    figures = json.loads((tmp_path / "summary.json").read_text())["modes"]["fanout"]
    assert figures["endpoints"][HOME]["expected"] == 3 and figures["problems"] == []
    own = figures["fanout_latency"]["read_your_writes"]
    assert (own["count"], own["misses"]) == (2, 1)
    assert figures["fanout_latency"]["repost"]["count"] == 1
    text = render_text(summary)
    assert "GET home 404 x3" in text and "repost" in text and "misses=1" in text
    assert "read-your-writes" in (tmp_path / "report.html").read_text()


# -- the probe: reposts and read-your-writes ----------------------------------------------------------
class SocialApi:
    """Posts, reposts, an author's page and a home: each write shows after ``delay`` reads.

    ``miss_own``: the first ``?after=`` read of an author's page does not show the
    write yet (a view that broke read-your-writes).
    """

    def __init__(self, delay: int = 1, miss_own: bool = False) -> None:
        self.delay, self.miss_own = delay, miss_own
        self.ids = itertools.count(1000)
        self.by: dict[str, int] = {}  # entry id -> its author or reposter
        self.reposted: dict[str, str] = {}  # repost id -> original
        self.reads: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            user = int(request.headers["X-User-Id"])
            parts = request.url.path.strip("/").split("/")
            if request.method == "POST":
                return self._write(user, parts)
            return self._read(int(parts[2]), parts[3], "after" in request.url.params)

    def _write(self, user: int, parts: list[str]) -> httpx.Response:
        entry = str(next(self.ids))
        self.by[entry] = user
        if parts[-1] == "reposts":
            assert self.by[parts[2]] != user, "a repost of one's own tweet"
            self.reposted[entry] = parts[2]
            return httpx.Response(202, json={"repost_id": entry, "original_id": parts[2],
                                             "token": "k1.t"})
        return httpx.Response(202, json={"tweet_id": entry, "token": "k1.t"})

    def _read(self, user: int, route: str, after: bool) -> httpx.Response:
        mine = route == "tweets"
        entries = [e for e in sorted(self.by, reverse=True)
                   if (self.by[e] == user) == mine and self._shows(e, after and mine)]
        return httpx.Response(200, json={"entries": [{"tweet_id": e} for e in entries],
                                         "next_cursor": None})

    def _shows(self, entry: str, first_own_read: bool) -> bool:
        self.reads[entry] += 1
        if first_own_read:
            return not self.miss_own
        return self.reads[entry] > self.delay


TARGETS = [Target(1, 2, False), Target(3, 4, False), Target(5, 6, True)]


def test_the_repost_probe_times_the_repost_and_checks_the_authors_own_read():
    api = SocialApi(delay=2)
    client = httpx.Client(transport=httpx.MockTransport(api), base_url="http://api")
    probe = FanoutProbe(client, TARGETS, ProbeSettings(deadline=1, poll=0.01), clock=steps())
    sample = probe.measure_repost(TARGETS[0])
    assert sample.kind == "repost" and sample.author == 1 and sample.lag is not None
    (original, by), = [(o, api.by[o]) for o in api.reposted.values()]
    assert by in (3, 5)  # another probe author: not the reposter 1, nor the follower 2
    assert probe.result.own.get_total_count() == 1 and probe.result.own_misses == 0


def test_a_read_your_writes_miss_is_counted_and_the_repost_still_measured():
    api = SocialApi(delay=0, miss_own=True)
    client = httpx.Client(transport=httpx.MockTransport(api), base_url="http://api")
    probe = FanoutProbe(client, TARGETS, ProbeSettings(deadline=1, poll=0.01), clock=steps())
    assert probe.measure_repost(TARGETS[1]).lag is not None
    assert probe.result.own_misses == 1


def test_the_probe_cycles_normal_celebrity_and_repost():
    api = SocialApi(delay=0)
    client = httpx.Client(transport=httpx.MockTransport(api), base_url="http://api")
    probe = FanoutProbe(client, TARGETS, ProbeSettings(interval=0.5, deadline=1, poll=0.01,
                                                       concurrency=1))  # no turn skipped
    result = run_until(probe, lambda r: len(r.samples) >= 6)
    kinds = [s.kind for s in sorted(result.samples, key=lambda s: s.posted_at)]
    assert kinds[:6] == ["normal", "celebrity", "repost"] * 2, kinds
    assert result.errors == {"normal": 0, "celebrity": 0, "repost": 0}
    assert {s.author for s in result.samples if s.kind == "repost"} == {1, 3}


def test_load_reserves_the_probes_authors_in_the_workload(tmp_path: Path):
    from infra.load.run import reserve

    path = Workload([1, 2, 3], [3, 2], reserved=[2]).dump(tmp_path / "w.json")
    reserve(path, TARGETS)
    assert Workload.load(path).reserved == [1, 2, 3, 4, 5, 6]
