"""Faults under load: one nemesis fault held while the checker's workload runs, then healed.

:func:`hold` applies a fault (:mod:`infra.faults.nemesis`) on a stack whose nodes have hosts,
sends a probe write a second while it holds (each probe's status, time and, for a
503, its reason: a partitioned broker must give a prompt 503, never a hung request),
heals it, and waits for the first write answered 202 after the heal. What the
workload (:class:`infra.checks.checker.Workload`) recorded meanwhile is in its
:class:`~infra.checks.checker.History`; :class:`Window` says what happened in the fault's
window. ``tests/stack/nodes/test_partitions.py`` holds one fault at a time in CI;
``benchmarks/bench_soak.py`` holds several in sequence, at random.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from infra import webclient
from infra.checks.checker import REQUEST_TIMEOUT_S, History, Op, caller_headers, read_stats
from infra.errors import InfraError
from infra.faults.nemesis import MAX_FLAPS, Nemesis

#: How long a write answered 202 after the heal is waited for (seconds).
RECOVER_S = 120.0


@dataclass
class Window:
    """One fault: when it held, the probes sent meanwhile, and the first 202 after it."""

    name: str
    began: float
    healed: float
    probes: list[dict[str, Any]] = field(default_factory=list)
    first_ack_s: float = float("nan")

    def during(self, ops: list[Op]) -> list[Op]:
        return [op for op in ops if self.began <= op.began < self.healed]

    def figures(self, history: History) -> dict[str, Any]:
        """The window's writes, 503s, reads and recovery, as numbers (for a results file)."""
        writes, reads = self.during(history.writes), self.during(history.reads)
        refused = [op for op in writes if op.status == 503]
        stats = read_stats(history.reads, self.began, self.healed)
        return {"fault": self.name, "held_s": round(self.healed - self.began, 1),
                "writes": len(writes), "acked": sum(op.status == 202 for op in writes),
                "refused_503": len(refused), "no_answer": sum(op.status == 0 for op in writes),
                "write_max_s": round(max((op.took for op in writes), default=0.0), 3),
                "refused_max_s": round(max((op.took for op in refused), default=0.0), 3),
                "reads": stats.count, "read_errors": stats.errors,
                "read_p99_ms": round(stats.p99_ms, 1),
                "reads_no_answer": sum(op.status == 0 for op in reads),
                "first_202_after_heal_s": round(self.first_ack_s, 2)}

    def render(self, history: History) -> str:
        f = self.figures(history)
        return (f"[{self.name} {f['held_s']:.0f}s] writes {f['writes']}: 202 {f['acked']}, "
                f"503 {f['refused_503']}, no answer {f['no_answer']}; latency max "
                f"{f['write_max_s']:.2f}s, the 503s' max {f['refused_max_s']:.2f}s\n"
                f"probes: {render_probes(self.probes)}\n"
                f"reads during the fault: "
                f"{read_stats(history.reads, self.began, self.healed).render()}, no answer "
                f"within {REQUEST_TIMEOUT_S:.0f}s: {f['reads_no_answer']}\n"
                f"first 202 {self.first_ack_s:.1f}s after the heal")


def flapping(host: str, on_s: float = 4.0, off_s: float = 4.0
             ) -> Callable[[Nemesis], tuple[threading.Thread, threading.Event]]:
    """A fault for :func:`hold`: ``host`` isolated ``on_s``, healed ``off_s``, until healed."""
    def apply(nemesis: Nemesis) -> tuple[threading.Thread, threading.Event]:
        stop = threading.Event()
        thread = threading.Thread(target=nemesis.flap, args=(host,), daemon=True, kwargs={
            "count": MAX_FLAPS, "on_s": on_s, "off_s": off_s, "stop": stop})
        thread.start()
        return thread, stop
    return apply


def acked(history: History, since: float) -> int:
    """Writes answered 202 that began at or after ``since`` (epoch seconds)."""
    return sum(1 for op in history.writes if op.status == 202 and op.began >= since)


def hold(nemesis: Nemesis, name: str, apply: Callable[[Nemesis], object], api_url: str,
         history: History, seconds: float, users: int,
         token_of: Callable[[int], str | None] = lambda _: None) -> Window:
    """Apply a fault, probe writes for ``seconds``, heal; wait for a 202 after the heal.

    A fault that plays out over time (:meth:`Nemesis.flap`) runs on a thread of its own
    with a stop event: ``apply`` then returns ``(thread, stop)``, and the heal stops and
    joins it first. Raises :class:`InfraError` when the nemesis made no rule for the
    fault, left rules after the heal, or no write was answered 202 within
    :data:`RECOVER_S` of it.
    """
    began = time.time()
    running: tuple[threading.Thread, threading.Event] | None = None
    try:
        applied = apply(nemesis)
        if isinstance(applied, tuple) and isinstance(applied[0], threading.Thread):
            running = applied  # type: ignore[assignment]
        deadline = time.monotonic() + 5.0
        while not any(nemesis.status().values()):
            if time.monotonic() > deadline:
                msg = f"the nemesis made no rule for {name}"
                raise InfraError(msg)
            time.sleep(0.1)
        probes = probe(api_url, seconds, users, token_of)
    finally:
        if running is not None:
            running[1].set()
            running[0].join(60)
        nemesis.heal()
    healed = time.time()
    if any(nemesis.status().values()):
        msg = f"rules of {name} left after the heal: {nemesis.status()}"
        raise InfraError(msg)
    window = Window(name, began, healed, probes)
    deadline = time.monotonic() + RECOVER_S
    while not acked(history, healed):
        if time.monotonic() > deadline:
            msg = f"no write was answered 202 within {RECOVER_S:.0f}s of healing {name}"
            raise InfraError(msg)
        time.sleep(0.2)
    window.first_ack_s = min(op.ended for op in history.writes
                             if op.status == 202 and op.began >= healed) - healed
    return window


def probe(api_url: str, seconds: float, users: int,
          token_of: Callable[[int], str | None] = lambda _: None) -> list[dict[str, Any]]:
    """A write a second for ``seconds``, as users 1..``users`` in turn (every partition).

    ``token_of(user)``: the user's bearer token, None with auth off (the user is named
    in the header for it then).
    """
    probes: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    user = 0
    with webclient.client(base_url=api_url, timeout=REQUEST_TIMEOUT_S) as client:
        while time.monotonic() < deadline:
            user = user % users + 1
            clock = time.monotonic()
            status, reason = 0, ""
            try:
                response = client.post("/v1/tweets", json={"text": "probe"},
                                       headers=caller_headers(user, token_of(user)))
                status = response.status_code
                if status == 503:
                    reason = str(response.json().get("message", ""))
            except (httpx.HTTPError, ValueError) as exc:
                reason = repr(exc)
            probes.append({"status": status, "took": round(time.monotonic() - clock, 3),
                           "reason": reason})
            time.sleep(max(0.0, 1.0 - (time.monotonic() - clock)))
    return probes


def render_probes(probes: list[dict[str, Any]]) -> str:
    """The probes' statuses, slowest and median time, and two of their 503 reasons."""
    statuses: dict[object, int] = {}
    for p in probes:
        statuses[p["status"]] = statuses.get(p["status"], 0) + 1
    took = sorted(float(p["took"]) for p in probes) or [0.0]
    reasons = sorted({str(p["reason"]) for p in probes if p["reason"]})[:2]
    return (f"{len(probes)} writes, statuses {statuses}, max {took[-1]:.2f}s, median "
            f"{took[len(took) // 2]:.2f}s; reasons {reasons}")
