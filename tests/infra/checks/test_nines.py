"""The live verifier's nines: the bookkeeping of time to correct, and the verifier's use of it.

Times are a controlled clock's: :class:`infra.checks.nines.Nines` takes them as arguments, and
the verifier's test replaces ``time.monotonic`` with :class:`Clock`, which moves only
when told. Nothing sleeps, and nothing asserts how long anything took.
"""

from __future__ import annotations

import math
import time
from typing import Any
from unittest.mock import MagicMock

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from infra.checks.apireader import ApiReader
from infra.checks.logtail import LogTail
from infra.checks.nines import Counts, Nines, NinesGauges
from infra.checks.verifier import (
    SETTLE_MARGIN_S,
    LiveVerifier,
    Settle,
    VerifierMetrics,
    summary,
)
from infra.settings import VerifierSettings
from ingest.events import TWEETS, Follow, Post
from ingest.settings import KafkaSettings
from serving.settings import ServingSettings
from views.reference import HomeRow
from views.settings import ViewSettings


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_first_read_that_is_right_is_correct_in_every_window():
    nines = Nines()
    nines.read(7, reached=100.0, now=130.0, correct=True)  # an old position, read late
    assert nines.total() == Counts(1, (1, 1, 1)) and not nines.open


def test_a_wrong_check_is_settled_at_its_first_right_reread():
    nines = Nines()
    nines.read(1, reached=100.0, now=100.2, correct=False)
    nines.read(2, reached=100.0, now=100.2, correct=False)
    assert nines.total() == Counts(0, (0, 0, 0)) and set(nines.open) == {1, 2}
    assert nines.due(100.4) is None and nines.due(100.5) == 1  # the older of equals first
    nines.read(1, reached=100.5, now=100.9, correct=True)  # its own reach time counts
    assert nines.total() == Counts(1, (1, 1, 1))
    nines.read(2, reached=100.5, now=100.9, correct=False)
    assert nines.open[2].due == pytest.approx(103.0)  # the next age of RECHECK_AGES
    nines.read(2, reached=101.0, now=103.0, correct=True)
    assert nines.total() == Counts(2, (1, 2, 2))
    assert nines.total().ratios() == (0.5, 1.0, 1.0)


def test_a_check_never_found_right_counts_in_no_window_once_the_last_has_passed():
    nines = Nines()
    nines.read(3, reached=0.0, now=0.1, correct=False)
    for age in (0.5, 0.9, 3.0, 9.5, 20.0, 40.0):
        assert nines.due(age) == 3
        nines.read(3, reached=age, now=age, correct=False)
    nines.expire(59.0)
    assert 3 in nines.open  # it may still be right by 60 s
    nines.read(3, reached=59.5, now=59.5, correct=False)  # the last re-read
    assert nines.total() == Counts(1, (0, 0, 0)) and not nines.open


def test_a_check_not_read_again_expires_after_the_last_window():
    nines = Nines()
    nines.read(4, reached=0.0, now=2.0, correct=False)  # the view then stood still, unread
    nines.expire(60.0)
    assert nines.open and nines.total().checks == 0
    nines.expire(60.1)
    assert nines.total() == Counts(1, (0, 0, 0)) and not nines.open


def test_a_wrong_check_too_old_or_beyond_the_followed_counts_at_once_as_never_right():
    nines = Nines(max_open=1)
    nines.read(5, reached=0.0, now=61.0, correct=False)  # past every re-read
    nines.read(6, reached=0.0, now=0.1, correct=False)
    nines.read(7, reached=0.0, now=0.1, correct=False)  # one is followed already
    assert nines.total() == Counts(2, (0, 0, 0)) and set(nines.open) == {6}


def test_recent_is_the_last_checks_and_total_all_of_them():
    nines = Nines(recent=3)
    nines.read(1, reached=0.0, now=0.0, correct=False)
    nines.read(1, reached=0.0, now=5.0, correct=True)  # within 10 s and 60 s
    for user in (2, 3, 4):
        nines.read(user, reached=10.0, now=10.0, correct=True)
    assert nines.total() == Counts(4, (3, 4, 4))
    assert nines.recent() == Counts(3, (3, 3, 3))
    assert all(math.isnan(r) for r in Counts(0, (0, 0, 0)).ratios())


def test_the_gauges_and_the_status_show_each_sampler_and_their_difference():
    registry = CollectorRegistry(auto_describe=False)
    gauges = NinesGauges(registry)
    a, b = Nines(), Nines()
    for user in range(4):
        a.read(user, reached=0.0, now=0.0, correct=True)
        b.read(user, reached=0.0, now=0.0, correct=user != 0)
    b.read(0, reached=0.0, now=2.0, correct=True)  # right at 2 s: within 10 s, not 1 s
    gauges.export("a", a)
    gauges.export("b", b)
    text = generate_latest(registry).decode()
    assert ('fanout_verify_consistent_within_ratio{sampler="b",span="total",window="1s"} 0.75'
            in text)
    assert 'fanout_verify_consistent_within{sampler="a",span="recent",window="60s"} 4.0' in text
    assert 'fanout_verify_nines_checks{sampler="b",span="total"} 4.0' in text
    shown = summary(text)["consistent_within"]
    assert shown["total"]["a"] == {"checks": 4, "1s": 1.0, "10s": 1.0, "60s": 1.0}
    assert shown["total"]["b"] == {"checks": 4, "1s": 0.75, "10s": 1.0, "60s": 1.0}
    assert shown["total"]["noise"] == {"1s": 0.25, "10s": 0.0, "60s": 0.0}
    assert shown["recent"]["noise"]["1s"] == 0.25 and shown["open"] == {"a": 0, "b": 0}


def test_before_any_check_the_ratios_are_unknown_not_one():
    shown = summary(generate_latest(VerifierMetrics().registry).decode())
    assert shown["checked"] == 0
    assert shown["consistent_within"]["total"]["a"] == {
        "checks": 0, "1s": None, "10s": None, "60s": None}
    assert shown["consistent_within"]["total"]["noise"]["60s"] is None


# -- the verifier's use of them ----------------------------------------------------------

USER, AUTHOR, TWEET, T0 = 1, 2, 100, 1_700_000_000_000
RIGHT = [HomeRow(TWEET, T0, AUTHOR, TWEET, AUTHOR)]


class _View:
    """What the fake API serves: the applied offsets, and a page right from ``right_at``."""

    def __init__(self, clock: Clock, right_at: float) -> None:
        self.clock, self.right_at = clock, right_at
        self.position = {(TWEETS, 0): 0}

    def page(self, user: int, n: int) -> list[HomeRow]:
        return RIGHT[:n] if user == USER and self.clock() >= self.right_at else []


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    return clock


def _verifier(clock: Clock, view: _View) -> LiveVerifier:
    api = MagicMock(spec_set=ApiReader)
    api.applied.side_effect = lambda: dict(view.position)
    api.page.side_effect = view.page
    verifier = LiveVerifier(VerifierSettings(entries=5), KafkaSettings(bootstrap="x:1"),
                            api, seed=3)
    tail = MagicMock(spec_set=LogTail)
    tail.started = True
    tail.reached.return_value = True
    events: list[Any] = [Follow(USER, AUTHOR, T0 - 1), Post(TWEET, AUTHOR, T0, "hi")]
    tail.release.side_effect = lambda _upto: [events.pop(0) for _ in range(len(events))]
    tail.held.return_value = iter(())
    tail.between.side_effect = lambda _after, _upto: iter(())
    tail.ends.return_value = {(TWEETS, 0): 50}  # the view is not caught up
    verifier.tail = tail
    return verifier


def test_a_page_wrong_for_three_seconds_is_correct_within_10_s_and_counted_transient(clock):
    view = _View(clock, right_at=clock.now + 3.2)
    verifier = _verifier(clock, view)
    assert verifier.pool == []
    for step in range(40):  # a step every 0.25 s: both samplers read user 1 (alone in the pool)
        verifier.step()
        clock.now += 0.25
        if step == 30:  # the view moves on: the suspect is re-checked at the new position
            view.position = {(TWEETS, 0): 1}
    for sampler in verifier.samplers:
        # The first check was right at its first read after 3.2 s (3.25 s: within 10 s, not
        # 1 s); every later one was right when first read.
        total = sampler.nines.total()
        assert total.checks >= 20, sampler.name
        assert total.within == (total.checks - 1, total.checks, total.checks), sampler.name
    shown = summary(generate_latest(verifier.metrics.registry).decode())
    # Re-reads at the suspect's own position fed the nines only: one transient mismatch,
    # settled once the view moved, and the samples after it checked.
    assert shown["transient"] == 1 and shown["divergent"] == 0 and shown["checked"] == 9
    assert shown["consistent_within"]["total"]["a"]["10s"] == 1.0


def test_the_two_samplers_draw_users_independently():
    verifier = LiveVerifier(VerifierSettings(), KafkaSettings(bootstrap="x:1"),
                            MagicMock(spec_set=ApiReader), seed=3)
    a, b = verifier.samplers
    draws = [[s.random.randrange(1000) for _ in range(20)] for s in (a, b)]
    assert draws[0] != draws[1] and a.primary and not b.primary


def test_records_naming_a_celebrity_stay_recent_for_the_api_s_full_reload(monkeypatch):
    """How long the verifier waits is the API's own bounds, read from its settings."""
    monkeypatch.setenv("FANOUT_CELEBRITY_REFRESH_S", "0.25")
    monkeypatch.setenv("FANOUT_CELEBRITY_FULL_RELOAD_S", "12")
    settle = Settle.of(ServingSettings(), ViewSettings())
    assert settle.seconds == pytest.approx(0.5 + SETTLE_MARGIN_S)
    assert settle.celebrity_seconds == pytest.approx(12 + 0.5 + SETTLE_MARGIN_S)
    monkeypatch.delenv("FANOUT_CELEBRITY_FULL_RELOAD_S")
    assert Settle.of(ServingSettings(), ViewSettings()).celebrity_seconds == pytest.approx(
        60 + 0.5 + SETTLE_MARGIN_S)
