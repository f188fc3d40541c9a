"""The one retry policy (``ingest.retry.within``), on a clock that moves only when told."""

from __future__ import annotations

import pytest

from ingest.retry import attempts, within


class Flaky(Exception):
    """A failure worth retrying."""


class Broken(Exception):
    """A failure that another attempt would not change."""


class Clock:
    """Seconds that pass only by sleeping or by an attempt's own cost."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def _policy(clock: Clock, budget: float, **kwargs: object):  # type: ignore[no-untyped-def]
    return within(budget, first=0.5, transient=lambda e: isinstance(e, Flaky),
                  sleep=clock.sleep, clock=clock, **kwargs)  # type: ignore[arg-type]


def test_pauses_double_to_the_most_and_the_last_is_cut_to_the_budget() -> None:
    clock, told, after = Clock(), [], []

    def down() -> None:
        clock.now += 1.0  # each attempt takes a second to fail
        raise Flaky("no answer")

    policy = _policy(clock, 40, say=lambda *a: told.append(a), after=after.append)
    with pytest.raises(Flaky, match="no answer"):
        policy(down)
    assert clock.pauses == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 2.5]
    assert clock.now == 41.0  # the budget, and the last attempt's own second
    assert attempts(policy) == 8 and len(after) == 8  # after every failure, the last too
    assert [(a, p) for a, _, p, _ in told] == list(enumerate(clock.pauses, start=1))
    assert told[0][3] == 39.0  # seconds left when the first pause began


def test_a_failure_not_worth_retrying_is_raised_at_once() -> None:
    clock, calls = Clock(), []

    def broken() -> None:
        calls.append(1)
        raise Broken("bad request")

    with pytest.raises(Broken):
        _policy(clock, 60)(broken)
    assert calls == [1] and clock.pauses == []


def test_a_call_that_recovers_returns_its_answer() -> None:
    clock = Clock()
    answers = iter([Flaky("down"), Flaky("down"), "ok"])

    def flaky() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    policy = _policy(clock, 60)
    assert policy(flaky) == "ok"
    assert clock.pauses == [0.5, 1.0] and attempts(policy) == 3


def test_a_budget_of_nothing_is_one_attempt() -> None:
    clock = Clock()

    def down() -> None:
        clock.now += 0.01
        raise Flaky("no answer")

    policy = _policy(clock, 0)
    with pytest.raises(Flaky):
        policy(down)
    assert attempts(policy) == 1 and clock.pauses == []
