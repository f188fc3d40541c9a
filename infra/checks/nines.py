"""Time-bounded consistency of the live verifier's checks: its "nines" (DESIGN §8).

Meta reports cache consistency as the fraction of writes whose cached value was right
within a bound of time; :class:`Nines` keeps the same figure for the live verifier
(:mod:`infra.checks.verifier`). A *check* is one sampled user at one log position P, the
offsets the view had applied (and held still) during the read; P was *reached* when
the verifier first saw the view there. The check's *time to correct* is:

- 0 if its first read equalled the SQL of P: it was never seen wrong;
- else the age (time since P was reached) of the first later read that equalled the
  SQL of the position the view then stood at (P or later: a page that has caught up).
  A wrong check is read again at the ages of :data:`RECHECK_AGES` (each as soon as a
  stable position allows after its age; a user drawn again at random meanwhile is a
  re-read too), and counts as never
  correct (infinity) if no read found it right by the last window, or if
  :data:`MAX_OPEN` wrong checks are already being followed.

A check is *correct within t* when its time to correct is at most t; a check is
*settled* (counted) once that is known for every window: at once if its first read was
right, when a re-read finds it right, or when the last window has passed. The ratios
are over the last :data:`RECENT` settled checks and over all of them. A re-read is
seen at the first step after it is due, so a window's resolution is one sampling
interval (0.5 s at the default rate).

The bookkeeping takes its times from the caller (``now``), so it is tested with any
clock; :class:`NinesGauges` exports it, :func:`shown` reads it back for ``fanout status``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.samples import Sample

#: The bounds reported (seconds), as their metric labels.
WINDOWS: Final = (1.0, 10.0, 60.0)
#: Ages (seconds after the view reached the position) at which a wrong page is read
#: again; each just under a window so that a page right by then is seen in time.
RECHECK_AGES: Final = (0.5, 0.9, 3.0, 9.5, 20.0, 40.0, 59.5)
#: Settled checks in the recent ratios.
RECENT: Final = 300
#: Wrong checks followed at once; a wrong check beyond them counts as never correct.
MAX_OPEN: Final = 100


def window_label(window: float) -> str:
    """``1s``, ``10s``, ``60s``: a window as a metric label."""
    return f"{window:g}s"


@dataclass
class _Open:
    """A wrong check being followed: when its position was reached, its next re-read."""

    reached: float
    due: float


@dataclass(frozen=True)
class Counts:
    """Settled checks, and how many of them were correct within each window."""

    checks: int
    within: tuple[int, ...]

    def ratios(self) -> tuple[float, ...]:
        """Correct within each window over settled checks (NaN: none settled yet)."""
        return tuple(w / self.checks if self.checks else math.nan for w in self.within)


class Nines:
    """One sampler's checks: followed while wrong, settled into ratios (module doc)."""

    def __init__(self, windows: tuple[float, ...] = WINDOWS, recent: int = RECENT,
                 recheck_ages: tuple[float, ...] = RECHECK_AGES,
                 max_open: int = MAX_OPEN) -> None:
        self.windows, self.recheck_ages, self.max_open = windows, recheck_ages, max_open
        self.open: dict[int, _Open] = {}
        self._recent: deque[float] = deque(maxlen=recent)  # times to correct
        self._checks = 0
        self._within = [0] * len(windows)

    def read(self, user: int, reached: float, now: float, correct: bool) -> None:
        """A read of ``user``'s page at a position the view reached at ``reached``.

        A first read of a check if ``user`` has none open, else a re-read of it (whatever
        position this read was at: the open check keeps its own reach time).
        """
        following = self.open.get(user)
        if following is not None:
            if correct:
                del self.open[user]
                self._settle(now - following.reached)
            else:
                self._follow(user, following, now)
            return
        if correct:
            self._settle(0.0)
        elif len(self.open) < self.max_open:
            self._follow(user, _Open(reached, reached), now)
        else:
            self._settle(math.inf)

    def _follow(self, user: int, check: _Open, now: float) -> None:
        """Schedule the next re-read of a wrong check, or settle it as never correct."""
        age = now - check.reached
        later = [a for a in self.recheck_ages if a > age]
        if not later:
            self.open.pop(user, None)
            self._settle(math.inf)
            return
        check.due = check.reached + later[0]
        self.open[user] = check

    def due(self, now: float) -> int | None:
        """The wrong check whose re-read has waited longest, if one is due."""
        user, check = min(self.open.items(), key=lambda kv: kv[1].due, default=(None, None))
        return user if check is not None and check.due <= now else None

    def expire(self, now: float) -> None:
        """Settle as never correct the checks no re-read found right by the last window."""
        last = max(self.windows)
        for user, check in list(self.open.items()):
            if now - check.reached > last:
                del self.open[user]
                self._settle(math.inf)

    def _settle(self, time_to_correct: float) -> None:
        self._recent.append(time_to_correct)
        self._checks += 1
        for i, window in enumerate(self.windows):
            self._within[i] += time_to_correct <= window

    def total(self) -> Counts:
        """Every check settled so far."""
        return Counts(self._checks, tuple(self._within))

    def recent(self) -> Counts:
        """The last :data:`RECENT` settled checks."""
        return Counts(len(self._recent), tuple(sum(t <= w for t in self._recent)
                                               for w in self.windows))


# -- what the verifier exports, and what `fanout status` shows of it ----------------------

#: The two samplers: ``a`` also keeps the verifier's counts, ``b`` is the noise floor.
SAMPLERS: Final = ("a", "b")
SPANS: Final = ("recent", "total")
RATIO: Final = "fanout_verify_consistent_within_ratio"
WITHIN: Final = "fanout_verify_consistent_within"
CHECKS: Final = "fanout_verify_nines_checks"
OPEN: Final = "fanout_verify_nines_open"


class NinesGauges:
    """The nines' series, in the verifier's registry (module docstring; DESIGN §8)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.ratio = Gauge(RATIO, "Settled checks whose page was correct within the window "
                           "of the view reaching their position, by sampler and span "
                           "(recent: the last checks; total: since the start).",
                           ["sampler", "window", "span"], registry=r)
        self.within = Gauge(WITHIN, "Settled checks correct within the window.",
                            ["sampler", "window", "span"], registry=r)
        self.checks = Gauge(CHECKS, "Settled checks behind the ratios.", ["sampler", "span"],
                            registry=r)
        self.open = Gauge(OPEN, "Wrong checks still being read again.", ["sampler"],
                          registry=r)
        for sampler in SAMPLERS:
            self.export(sampler, Nines())

    def export(self, sampler: str, nines: Nines) -> None:
        """Set ``sampler``'s series from its bookkeeping."""
        for span, counts in (("recent", nines.recent()), ("total", nines.total())):
            self.checks.labels(sampler, span).set(counts.checks)
            for window, within, ratio in zip(nines.windows, counts.within, counts.ratios(),
                                             strict=True):
                self.within.labels(sampler, window_label(window), span).set(within)
                self.ratio.labels(sampler, window_label(window), span).set(ratio)
        self.open.labels(sampler).set(len(nines.open))


def shown(samples: list[Sample]) -> dict[str, Any]:
    """The nines as ``fanout status`` shows them, with the samplers' difference (noise)."""
    ratios: dict[str, dict[str, dict[str, float | None]]] = {}
    checks: dict[str, dict[str, int]] = {}
    still_open: dict[str, int] = {}
    for s in samples:
        if s.name == RATIO:
            value = None if math.isnan(s.value) else round(s.value, 6)
            by_sampler = ratios.setdefault(s.labels["span"], {})
            by_sampler.setdefault(s.labels["sampler"], {})[s.labels["window"]] = value
        elif s.name == CHECKS:
            checks.setdefault(s.labels["span"], {})[s.labels["sampler"]] = int(s.value)
        elif s.name == OPEN:
            still_open[s.labels["sampler"]] = int(s.value)
    out: dict[str, Any] = {}
    for span, by_sampler in sorted(ratios.items()):
        a, b = by_sampler.get("a", {}), by_sampler.get("b", {})
        out[span] = {**{name: {"checks": checks.get(span, {}).get(name, 0), **r}
                        for name, r in sorted(by_sampler.items())},
                     "noise": {w: _difference(a.get(w), b.get(w)) for w in a}}
    return {**out, "open": still_open} if out else {}


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(abs(a - b), 6)
