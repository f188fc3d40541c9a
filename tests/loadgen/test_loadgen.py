"""Unit tests of the load generator: open-loop pacing, HDR merging, reports, workload, probe.

None of these import Locust (importing it monkey-patches the whole process with
gevent); the locustfile itself runs in subprocesses in ``test_loadgen_stack.py``.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from infra.errors import LoadRunError
from loadgen.action import DELETE, FOLLOW, HOME, HOME_NEXT, POST, UNFOLLOW, Planner
from loadgen.bearer import mint
from loadgen.errors import ProbeError, WorkloadError
from loadgen.openloop import Pacer, Schedule, corrected, per_process_rate
from loadgen.probe import FanoutProbe, ProbeResult, ProbeSettings, Target
from loadgen.recording import HIGHEST_US, Recorder, decode, encode, histogram
from loadgen.report import ModeRun, build, compare_rows, lag_summary, render_text
from loadgen.summary import PERCENTILES, label, problems, summarize
from loadgen.workload import (
    PROFILES,
    Mix,
    Workload,
    ZipfPicker,
    dump_tokens,
    load_tokens,
    parse_mix,
    parse_user_range,
)
from tests.support.paths import ROOT
from tests.support.probes import run_until, steps


class FakeClock:
    """A clock that only moves when someone sleeps or the test advances it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


# -- open loop -----------------------------------------------------------------------------
def test_constant_schedule_is_exact_and_drift_free():
    schedule = Schedule(rate=200.0, start=50.0)
    times = [schedule.next() for _ in range(100_001)]
    assert times[:3] == [50.0, 50.005, 50.01]
    assert times[-1] == pytest.approx(50.0 + 100_000 / 200.0, abs=1e-9)
    assert schedule.due_by(50.0) == 1
    assert schedule.due_by(51.0) == 201


def test_poisson_schedule_has_exponential_gaps_at_the_rate():
    schedule = Schedule(rate=100.0, start=0.0, poisson=True, seed=3)
    times = [schedule.next() for _ in range(20_001)]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(g >= 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(0.01, rel=0.03)
    # An exponential distribution has its standard deviation equal to its mean.
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)
    assert Schedule(100.0, 0.0, poisson=True, seed=3).next() == times[0]


def test_schedule_rejects_a_rate_that_is_not_positive():
    with pytest.raises(WorkloadError):
        Schedule(rate=0, start=0)


def test_pacer_sleeps_until_each_slot_when_the_server_keeps_up():
    clock = FakeClock(10.0)
    pacer = Pacer(Schedule(rate=10.0, start=10.0), clock, clock.sleep)
    latencies = []
    for _ in range(5):
        intended = pacer.acquire()
        sent = clock()
        clock.now += 0.02  # every answer takes 20 ms
        latencies.append(corrected(intended, sent, 0.02))
    assert latencies == pytest.approx([0.02] * 5)
    assert clock.sleeps == pytest.approx([0.08] * 4)  # 100 ms gaps minus the 20 ms service
    assert pacer.late == 1  # only the first slot, due right at the start


def _run_one_connection(rate: float, seconds: float, service) -> tuple[list, list]:  # noqa: ANN001
    """Drive one user through a fake server; (intended, corrected, service) per request."""
    clock = FakeClock(0.0)
    pacer = Pacer(Schedule(rate, start=0.0), clock, clock.sleep)
    rows, served = [], []
    while True:
        intended = pacer.acquire()
        if intended >= seconds:
            return rows, served
        sent = clock()
        took = service(sent)
        clock.now = sent + took
        rows.append((intended, corrected(intended, sent, took)))
        served.append(took)


def test_a_stall_shows_in_every_request_that_was_due_during_it():
    """The server stalls for 1 s at t=1: the requests due meanwhile queue behind it.

    A closed-loop tool would record one slow request; timed from the intended send
    time, the k-th request due during the stall waits (stall end − its intended time),
    so latencies fall linearly with the intended time, from ~1 s down to the service
    time once the backlog is worked off. No slot is skipped.
    """
    rate, d = 100.0, 0.001

    def service(sent: float) -> float:
        return (2.0 - sent) if 1.0 <= sent < 2.0 else d  # answers resume at t=2

    rows, served = _run_one_connection(rate, 4.0, service)
    assert len(rows) == 400  # every slot of 4 s at 100/s was sent
    assert sum(1 for s in served if s > 0.5) == 1  # the service times see one slow request
    stall = rows.index(next(r for r in rows if r[0] >= 1.0))
    queued = [r for r in rows[stall + 1:] if r[1] > d + 1e-9]
    # Request k after the stall was sent at 2.0 + (k-1)·d and was due at 1.0 + k/rate.
    for k, (intended, latency) in enumerate(queued, start=1):
        assert intended == pytest.approx(1.0 + k / rate)
        assert latency == pytest.approx(2.0 + k * d - intended)
    steps = {round(b[1] - a[1], 9) for a, b in zip(queued, queued[1:], strict=False)}
    assert steps == {round(d - 1 / rate, 9)}  # linear: the same step every time
    assert 100 <= len(queued) <= 112  # the backlog of ~1 s at 100/s, worked off at 1/d
    assert rows[stall][1] == pytest.approx(1.0)


def test_stall_percentiles_differ_from_service_time_percentiles():
    rows, served = _run_one_connection(
        100.0, 10.0, lambda sent: (2.0 - sent) if 1.0 <= sent < 2.0 else 0.001)
    rec = Recorder()
    for (intended, latency), took in zip(rows, served, strict=True):
        rec.record("GET home", due=intended, done=intended + latency, latency=latency,
                   service=took, ok=True)
    p90 = rec.latency["GET home"].get_value_at_percentile(90) / 1e6
    assert p90 > 0.05  # ~10% of the requests were due during the stall
    assert rec.service["GET home"].get_value_at_percentile(99) / 1e6 < 0.01


def test_a_request_sent_early_counts_from_its_send_and_rates_split_over_processes():
    assert corrected(intended=5.0, sent=4.99, service=0.1) == pytest.approx(0.1)
    assert corrected(intended=5.0, sent=5.5, service=0.1) == pytest.approx(0.6)
    assert per_process_rate(300, 3) == 100
    assert per_process_rate(300, 0) == 300


# -- recording and merging -------------------------------------------------------------------
def _fill(rec: Recorder, rng: random.Random, n: int, start: float) -> list[tuple[str, float]]:
    values = []
    for i in range(n):
        name = rng.choice(["GET home", "GET tweets", "POST tweet"])
        latency = rng.lognormvariate(-6, 1.2)
        rec.record(name, due=start + i * 0.01, done=start + i * 0.01 + latency,
                   latency=latency, service=latency / 2, ok=rng.random() > 0.05)
        values.append((name, latency))
    return values


def test_worker_histograms_merged_on_the_master_equal_one_histogram_of_everything():
    rng = random.Random(1)
    everything = Recorder()
    master = Recorder()
    for worker in range(3):
        rec = Recorder()
        for _ in range(2):  # two reports per worker, as with periodic reporting
            state = rng.getstate()
            _fill(rec, rng, 500, 100.0 + worker)
            rng.setstate(state)
            _fill(everything, rng, 500, 100.0 + worker)
            # Through msgpack, as Locust's RPC carries the report to the master.
            wire = msgpack.unpackb(msgpack.packb(rec.drain(), use_bin_type=True), raw=False)
            master.merge(wire)
        assert rec.count() == 0  # drained
    assert master.count() == everything.count() == 3000
    assert master.errors == everything.errors
    for name, h in everything.latency.items():
        m = master.latency[name]
        assert m.get_total_count() == h.get_total_count()
        for p in (50, 99, 99.9, 100):
            assert m.get_value_at_percentile(p) == h.get_value_at_percentile(p)
        assert m.get_max_value() == h.get_max_value()
    assert set(master.timeline) == set(everything.timeline)
    for slot, bucket in everything.timeline.items():
        assert master.timeline[slot].counts == bucket.counts


def test_warmup_requests_reach_only_the_timeline_and_huge_values_are_clipped():
    rec = Recorder(measure_from=100.0)
    rec.record("GET home", due=99.0, done=99.5, latency=0.5, service=0.5, ok=True)
    rec.record("GET home", due=100.0, done=200.0, latency=100.0, service=1.0, ok=False)
    assert rec.warmup == 1 and rec.count() == 1 and rec.clipped == 1
    assert rec.latency["GET home"].get_max_value() >= HIGHEST_US * 0.999
    assert sum(sum(b.counts.values()) for b in rec.timeline.values()) == 2
    assert rec.errors["GET home"] == 1


def test_encoded_histograms_round_trip_and_intervals_rebucket():
    h = histogram()
    for v in (1, 10, 1000, 123_456):
        h.record_value(v)
    back = decode(encode(h))
    assert back.get_total_count() == 4 and back.get_max_value() == h.get_max_value()
    coarse = Recorder(interval=5.0)
    fine = Recorder(interval=1.0)
    for t in range(10):
        fine.record("GET home", due=t, done=float(t), latency=0.001, service=0.001, ok=True)
    coarse.merge(fine.to_dict())
    assert {slot: sum(b.counts.values()) for slot, b in coarse.timeline.items()} == {0: 5, 1: 5}


# -- summary and report ------------------------------------------------------------------------
def _results(seed: int, rate: float = 50.0) -> dict[str, Any]:
    rec = Recorder(measure_from=1000.0)
    _fill(rec, random.Random(seed), 2000, 1000.0)
    meta = {"started_at": 995.0, "measure_from": 1000.0, "stopped_at": 1020.0,
            "options": {"fanout_rate": rate}}
    return {"meta": meta, "recording": rec.to_dict()}


def test_summary_counts_add_up_and_percentiles_never_decrease():
    rec = Recorder.from_dict(_results(2)["recording"])
    s = summarize(rec, 20.0)
    assert problems(s) == []
    assert s["all"]["count"] == 2000 == s["reads"]["count"] + s["writes"]["count"]
    assert s["all"]["rps"] == pytest.approx(100.0)
    values = [s["all"][label(p)] for p in PERCENTILES] + [s["all"]["max"]]
    assert values == sorted(values)
    s["reads"]["count"] += 1
    s["endpoints"]["GET home"]["p99"] = s["endpoints"]["GET home"]["p50"] / 2
    found = problems(s)
    assert any("reads.count" in f for f in found)
    assert any("GET home: percentiles decrease" in f for f in found)


def test_report_writes_summary_html_and_plots_for_two_modes(tmp_path: Path):
    probe = ProbeResult()
    probe.add(_sample("normal", 0.4))
    probe.add(_sample("celebrity", 0.7))
    probe.add(_sample("celebrity", None))
    runs = [ModeRun("fanout", _results(3), probe, [(1001.0, 0.5), (1002.0, 0.8)],
                    server={"processes": 2, "cpu_s": 3.0, "wall_s": 60.0}),
            ModeRun("read", _results(4))]
    info = {"name": "unit", "modes": ["fanout", "read"], "duration_s": 60.0,
            "probe": {"interval": 1.0, "deadline": 30.0, "max_pages": 10},
            "history": {"users": 1000, "seed": 7}}
    summary = build(runs, info, tmp_path)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["compare"] == json.loads(json.dumps(summary["compare"]))
    for name in ("report.html", "latency-percentiles.png", "over-time-fanout.png",
                 "over-time-read.png", "fanout-lag-fanout.png"):
        assert (tmp_path / name).stat().st_size > 1000, name
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(summary["images"]) == 4
    for repr_start in ("['", "{'", "[&#x27;", "{&#x27;", "None<"):  # words, not reprs
        assert repr_start not in html, repr_start
    assert "<td>fanout, read</td>" in html and "<th>duration</th><td>60 s</td>" in html
    assert "interval 1 s, deadline 30 s, max pages 10" in html
    assert "users 1,000, seed 7" in html
    assert [r["mode"] for r in summary["compare"]] == ["fanout", "read"]
    # The API's CPU where it was measured (a local API), and none where it was not.
    assert [r["api cores"] for r in summary["compare"]] == [pytest.approx(0.05), None]
    assert on_disk["modes"]["fanout"]["server"]["cores"] == pytest.approx(0.05)
    fan = on_disk["modes"]["fanout"]["fanout_latency"]
    assert (fan["normal"]["count"], fan["celebrity"]["count"], fan["celebrity"]["timeouts"]) \
        == (1, 1, 1)
    assert on_disk["modes"]["fanout"]["view_lag"]["max"] == pytest.approx(800.0)
    assert all(not m["problems"] for m in on_disk["modes"].values())
    text = render_text(summary)
    assert "fan-out-on-write vs fan-out-on-read" in text and "celebrity" in text
    assert "API: 2 process(es), 3.0 CPU-s over 60.0 s (0.05 cores)" in text


def test_compare_rows_and_lag_summary():
    summary = {"modes": {"fanout": {"endpoints": {}, "reads": {"count": 0, "errors": 0},
                                    "meta": {"options": {"fanout_rate": 10}}}}}
    assert compare_rows(summary)[0]["read p99"] is None
    lag = lag_summary([(1.0, 0.1), (2.0, 0.2), (3.0, 0.3)])
    assert (lag["batches"], lag["p50"], lag["max"]) == (3, pytest.approx(200.0),
                                                        pytest.approx(300.0))
    assert lag_summary([])["p99"] is None


def _sample(kind: str, lag: float | None):  # noqa: ANN202
    from loadgen.probe import Sample

    return Sample(kind, 7, 3, 1005.0, 0.01, lag)


# -- workload and actions ----------------------------------------------------------------------
def test_profiles_and_mix_overrides():
    assert 60 <= PROFILES["read-heavy"].reads_per_write() <= 70
    assert PROFILES["read-only"].reads_per_write() == float("inf")
    mix = parse_mix("mixed:post=2,page=0.5,max_pages=4")
    assert (mix.post, mix.page, mix.max_pages, mix.home) == (2.0, 0.5, 4, 9.0)
    assert parse_mix(mix.describe()) == mix
    assert parse_mix("post=3").home == Mix().home
    for bad in ("nope", "home=-1", "read-heavy:bogus=1", "home=x", "page=2"):
        with pytest.raises(WorkloadError):
            parse_mix(bad)


def test_zipf_picker_favours_the_first_ranks():
    picker = ZipfPicker(list(range(1, 1001)), exponent=1.0)
    rng = random.Random(5)
    counts = Counter(picker.pick(rng) for _ in range(50_000))
    assert counts[1] > counts[2] > counts[10] > counts[100]
    assert counts[1] / 50_000 == pytest.approx(1 / sum(1 / r for r in range(1, 1001)), rel=0.1)
    with pytest.raises(WorkloadError):
        ZipfPicker([])


def test_planner_mix_and_undo_only_what_it_did():
    workload = Workload.from_range(1, 50, seed=1)
    workload.reserved = [workload.authors[0], workload.authors[1]]
    planner = Planner(workload, parse_mix("write-heavy"), random.Random(2), texts=["hi"])
    seen: Counter[str] = Counter()
    posted, followed = set(), set()
    for i in range(3000):
        call = planner.next_call()
        seen[call.name] += 1
        if call.name == DELETE:
            assert call.path.rsplit("/", 1)[1] in posted
        if call.name == UNFOLLOW:
            assert (call.actor, call.other) in followed
        if call.name == FOLLOW:
            assert call.actor not in workload.reserved and call.actor != call.other
            followed.add((call.actor, call.other))
        if call.name == POST:
            posted.add(str(i))
            planner.answered(call, {"tweet_id": str(i), "token": "k1.x"})
        elif call.name == FOLLOW:
            planner.answered(call, {"token": "k1.x"})
    assert seen[POST] > seen[DELETE] > 0 and seen[FOLLOW] > seen[UNFOLLOW] > 0
    assert seen[HOME] > 0


def test_planner_pages_on_only_with_a_cursor_and_within_max_pages():
    planner = Planner(Workload([5], [6]), parse_mix("read-only:page=1,max_pages=2"),
                      random.Random(0), texts=["x"])
    first = planner.next_call()
    while first.name != HOME:
        first = planner.next_call()
    second = planner.answered(first, {"next_cursor": "c1"}, pages=1)
    assert second is not None and second.name == HOME_NEXT
    assert second.params == {"limit": 20, "cursor": "c1"} and second.actor == 5
    assert planner.answered(second, {"next_cursor": "c2"}, pages=2) is None
    assert planner.answered(first, {"next_cursor": None}, pages=1) is None
    assert planner.answered(first, None, pages=1) is None


@pytest.mark.parametrize("page", [0.0, 0.3, 1.0])
def test_a_body_is_decoded_exactly_when_the_planner_uses_it(page: float):
    """needs_body draws the page-on decision: a page is decoded iff the user pages on."""
    planner = Planner(Workload([5], [6]), parse_mix(f"mixed:page={page},max_pages=3"),
                      random.Random(1), texts=["x"])
    paged = decoded = 0
    for _ in range(400):
        call, pages = planner.next_call(), 0
        while call is not None:
            pages += 1
            decode = planner.needs_body(call, pages)
            assert decode == (call.name == POST or (call.name in (HOME, HOME_NEXT) and decode))
            body = {"next_cursor": "c", "tweet_id": "1"} if decode else {}
            decoded += decode and call.name in (HOME, HOME_NEXT)
            call = planner.answered(call, body, pages)
            if call is not None:
                paged += 1
                assert call.name == HOME_NEXT and pages < 3
    assert paged == decoded
    assert (paged == 0) == (page == 0.0) and (page < 1.0 or paged > 100)


def test_workload_files_tokens_and_ranges(tmp_path: Path):
    w = Workload([3, 1, 2], [2, 3], reserved=[1])
    back = Workload.load(w.dump(tmp_path / "w.json"))
    assert (back.readers, back.authors, back.reserved) == ([3, 1, 2], [2, 3], [1])
    tokens = {1: "t1", 3: "t3"}
    path = dump_tokens(tokens, tmp_path / "tokens.json")
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_tokens(path) == tokens
    limited = back.with_tokens(tokens)
    assert (limited.readers, limited.actors) == ([3, 1], [1, 3])
    with pytest.raises(WorkloadError):
        back.with_tokens({99: "x"})
    assert parse_user_range("1-2000") == (1, 2000)
    for bad in ("1", "a-b", "5-"):
        with pytest.raises(WorkloadError):
            parse_user_range(bad)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(WorkloadError):
        Workload.load(tmp_path / "bad.json")


def test_bearer_tokens_minted_by_loadgen_are_accepted_by_the_api():
    from serving.callers import verify

    secret = b"0123456789abcdef-secret"
    token = mint(42, secret, ttl=60, now=1_000_000)
    assert verify(token, secret, now=1_000_010) == 42


# -- the probe, against a fake API --------------------------------------------------------------
class FakeApi:
    """POST /v1/tweets and GET home: a tweet shows up after ``delay_polls`` reads."""

    def __init__(self, delay_polls: int, never: set[int] | None = None) -> None:
        self.delay_polls, self.never = delay_polls, never or set()
        self.next_id = 100
        self.polls: Counter[str] = Counter()
        self.posted: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            if request.method == "POST":
                self.next_id += 1
                author = int(request.headers["X-User-Id"])
                self.posted[str(self.next_id)] = author
                return httpx.Response(202, json={"tweet_id": str(self.next_id), "token": "k1.t"})
            assert request.url.params["after"] == "k1.t"
            tweet = max(self.posted)
            self.polls[tweet] += 1
            visible = (self.polls[tweet] > self.delay_polls
                       and self.posted[tweet] not in self.never)
            entries = [{"tweet_id": tweet}] if visible else []
            return httpx.Response(200, json={"entries": entries, "next_cursor": None})


def test_probe_measures_until_visible_and_counts_timeouts():
    api = FakeApi(delay_polls=2, never={9})
    client = httpx.Client(transport=httpx.MockTransport(api), base_url="http://api")
    settings = ProbeSettings(interval=0.01, deadline=0.3, poll=0.01, concurrency=1)
    probe = FanoutProbe(client, [Target(7, 8, False, 3)], settings, clock=steps())
    sample = probe.measure(Target(7, 8, False, 3))
    assert sample.lag is not None and sample.kind == "normal"
    assert api.polls[max(api.posted)] == 3
    lost = probe.measure(Target(9, 8, True, 500))
    assert lost.lag is None and lost.kind == "celebrity"
    result = ProbeResult()
    result.add(sample)
    result.add(lost)
    assert result.timeouts == {"normal": 0, "celebrity": 1, "repost": 0}
    assert result.hists["normal"].get_total_count() == 1


def test_probe_pages_down_when_newer_tweets_came_in_the_same_batch():
    def api(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(202, json={"tweet_id": "500", "token": "k1.t"})
        newer = [{"tweet_id": str(i)} for i in range(700, 600, -1)]
        if "cursor" not in request.url.params:
            return httpx.Response(200, json={"entries": newer[:50], "next_cursor": "p2"})
        assert request.url.params["cursor"] == "p2" and "after" not in request.url.params
        page = newer[50:] + [{"tweet_id": "500"}]
        return httpx.Response(200, json={"entries": page, "next_cursor": "p3"})

    client = httpx.Client(transport=httpx.MockTransport(api), base_url="http://api")
    probe = FanoutProbe(client, [Target(1, 2, False)], ProbeSettings(deadline=1, poll=0.01),
                        clock=steps())
    assert probe.measure(Target(1, 2, False)).lag is not None


def test_probe_stops_paging_once_past_where_the_tweet_belongs():
    pages = Counter[str]()

    def api(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(202, json={"tweet_id": "500", "token": "k1.t"})
        pages[request.url.params.get("cursor", "first")] += 1
        return httpx.Response(200, json={"entries": [{"tweet_id": "499"}], "next_cursor": "p2"})

    client = httpx.Client(transport=httpx.MockTransport(api), base_url="http://api")
    probe = FanoutProbe(client, [Target(1, 2, False)],
                        ProbeSettings(deadline=0.1, poll=0.02), clock=steps())
    assert probe.measure(Target(1, 2, False)).lag is None
    assert set(pages) == {"first"}  # older tweets on page one: no use reading on


def test_probe_run_alternates_classes_and_stops_on_time():
    api = FakeApi(delay_polls=0)
    client = httpx.Client(transport=httpx.MockTransport(api), base_url="http://api")
    targets = [Target(1, 2, False), Target(3, 4, False), Target(5, 6, True)]
    # One probe at a time, a turn each 0.5 s: they start in the order of their turns, and
    # none is skipped for the one before it still running (a probe here takes ms; a turn
    # is skipped only when one stalls past two turns).
    settings = ProbeSettings(interval=0.5, deadline=1, poll=0.01, reposts=False, concurrency=1)
    probe = FanoutProbe(client, targets, settings)
    result = run_until(probe, lambda r: len(r.samples) >= 6)
    kinds = [s.kind for s in sorted(result.samples, key=lambda s: s.posted_at)]
    assert len(kinds) >= 6 and result.errors == {"normal": 0, "celebrity": 0, "repost": 0}
    assert kinds[:4] == ["normal", "celebrity", "normal", "celebrity"]
    # ``until`` ends a run too: one whose end has passed probes nothing.
    late = FanoutProbe(client, targets, settings).run(threading.Event(), until=time.time() - 1)
    assert not late.samples and late.errors == {"normal": 0, "celebrity": 0, "repost": 0}
    with pytest.raises(ProbeError):
        FanoutProbe(client, [])


def test_probe_counts_an_api_error_and_goes_on():
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": "unauthorized"})

    client = httpx.Client(transport=httpx.MockTransport(refuse), base_url="http://api")
    probe = FanoutProbe(client, [Target(1, 2, False)], ProbeSettings(interval=0.01))
    with pytest.raises(ProbeError, match="401"):
        probe.measure(Target(1, 2, False))
    result = run_until(probe, lambda r: r.errors["normal"] >= 1)
    assert result.errors["normal"] >= 1 and not result.samples


# -- fanout load: flags and bounds ---------------------------------------------------------------
def test_load_plan_bounds_and_loopback_only(tmp_path: Path):
    from infra.cli import _parser
    from infra.load.prep import check_loopback
    from infra.load.run import make_plan

    def plan(*flags: str):  # noqa: ANN202
        args = _parser().parse_args(["load", "--reports", str(tmp_path), *flags])
        return make_plan(args)

    p = plan("--compare", "--rate", "200", "--duration", "30", "--warmup", "5", "--name", "x")
    assert p.modes == ("fanout", "read") and p.out == tmp_path / "x"
    assert p.max_requests == 3 * 200 * 35 + 1000 and p.interval == 1.0
    assert plan("--duration", "3600").interval == 7.0
    for bad in (["--duration", "0"], ["--duration", "99999"], ["--rate", "-1"],
                ["--users", "0"], ["--profile", "bogus"]):
        with pytest.raises((LoadRunError, WorkloadError)):
            plan(*bad)
    check_loopback("http://127.0.0.1:8080", allow_remote=False)
    check_loopback("http://localhost:1", allow_remote=False)
    check_loopback("http://[::1]:1", allow_remote=False)
    with pytest.raises(LoadRunError, match="loopback"):
        check_loopback("http://10.0.0.5:8080", allow_remote=False)
    check_loopback("http://10.0.0.5:8080", allow_remote=True)


def test_an_api_that_does_not_answer_gets_a_message_that_says_what_to_do():
    # A stack that was stopped (its stack.json stays): nothing listens on its port.
    from infra.load.prep import auth_on
    from infra.services.process import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(LoadRunError, match=r"does not answer.*`fanout status`.*`fanout up`"):
        auth_on(url, 1)


def test_plots_of_a_run_with_nothing_to_plot_are_drawn_empty(tmp_path: Path):
    """A short run may have no probe sample of some kind, or none at all: the plots are
    drawn (empty) rather than failing the report on a log scale with no data."""
    from loadgen import plot

    repost_only = [{"kind": "repost", "posted_at": 1.0, "lag": 0.5}]
    for samples in ([], repost_only):
        assert plot.fanout_lag(samples, [], 0.0, 30.0, tmp_path / "lag.png", "t").exists()
    assert plot.percentiles({}, tmp_path / "p.png", "t").exists()
    assert plot.over_time([], 0.0, 0.0, tmp_path / "o.png", "t").exists()



_TIMER_AFTER_IMPORTS = """
import time
import gevent
from loadgen.locustfile import fresh_loop_time  # imports Locust: the hub is made, not run
gevent.get_hub()
began = time.monotonic()
while time.monotonic() - began < 2.0:  # imports that take a while on a busy machine
    pass
began = time.monotonic()  # before the loop's clock is read: a stall between cannot count
fresh_loop_time()
gevent.spawn_later(1.0, lambda: None).join()
print(round(time.monotonic() - began, 3))
"""


def test_a_run_time_timer_started_after_slow_imports_counts_from_when_it_starts():
    # Locust's `-t` is a gevent timer started before the loop first runs: without the
    # locustfile bringing the loop's clock up to date, it fires as early as the imports
    # took (here at once, 2 s early), and `fanout load` on a busy machine ran 3 s of 10.
    done = subprocess.run([sys.executable, "-c", _TIMER_AFTER_IMPORTS], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    assert float(done.stdout.split()[-1]) >= 0.95, done.stdout
