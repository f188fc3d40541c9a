"""The one retry policy: a transient failure is run again, with backoff, within a budget.

A call that failed transiently runs again after a doubling pause, until a time budget
is spent. Every place that rides out a service that does not answer for a while — the job's
Kafka reads (:func:`views.kafka_offsets.retrying`), the Cassandra store's requests and
its opening (:mod:`views.stores.cassandra.executor`), a connection to a ring that is
still starting (:func:`views.stores.cassandra.schema.connect`) — retries the same way,
through :func:`within`, built on tenacity:

- only a failure ``transient`` says is worth it is retried; any other is raised at once;
- the pause after the n-th failure is ``first * 2**(n-1)``, at most ``most`` seconds,
  and never past the budget's end: the last pause is cut to what is left;
- once the budget is spent, the last failure is raised, for the caller to say what to
  do about it;
- ``say`` is told of each retry (the attempt, the failure, the pause, the seconds left),
  to log one line per attempt rather than one per reconnect.

``clock`` and ``sleep`` are parameters so that a test can run the policy in no time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

#: The longest pause between two attempts (seconds).
MOST_S: Final = 15.0

#: Told of each retry: (attempt, its failure, the pause before the next, seconds left).
Say = Callable[[int, BaseException, float, float], object]


def within(budget: float, *, first: float, transient: Callable[[BaseException], bool],
           say: Say | None = None, most: float = MOST_S,
           after: Callable[[BaseException], object] | None = None,
           sleep: Callable[[float], object] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> Retrying:
    """A tenacity ``Retrying`` for ``budget`` seconds from now (module docstring).

    ``after`` runs after every transient failure, the last one included (to drop a
    client that may be wedged, say). Use it as tenacity's own::

        for attempt in within(30, first=0.5, transient=is_timeout):
            with attempt:
                answer = call()
    """
    give_up = clock() + budget
    backoff = wait_exponential(multiplier=first, exp_base=2, max=most)

    def left() -> float:
        return give_up - clock()

    def pause(state: RetryCallState) -> float:
        return max(0.0, min(backoff(state), left()))

    def stop(state: RetryCallState) -> bool:
        return left() <= 0

    def failure(state: RetryCallState) -> BaseException:
        assert state.outcome is not None
        error = state.outcome.exception()
        assert error is not None
        return error

    def before_sleep(state: RetryCallState) -> None:
        if say is not None:
            say(state.attempt_number, failure(state), state.upcoming_sleep, left())

    def after_failure(state: RetryCallState) -> None:
        if after is not None and state.outcome is not None and state.outcome.failed:
            after(failure(state))

    def nap(seconds: float) -> None:
        sleep(seconds)

    return Retrying(retry=retry_if_exception(transient), wait=pause, stop=stop,
                    sleep=nap, before_sleep=before_sleep, after=after_failure,
                    reraise=True)


def attempts(retrying: Retrying) -> int:
    """How many attempts the last run of ``retrying`` made (on this thread)."""
    return int(retrying.statistics.get("attempt_number", 0))
