"""Figures from recorded histograms: percentiles, throughput, timelines and checks.

Turns a :class:`~loadgen.recording.Recorder` into plain numbers in milliseconds —
what ``summary.json``, the plots, the HTML report and the end-of-run table show — and
checks that they hang together (:func:`problems`): endpoint counts add up to the
totals, percentiles never decrease, no error count exceeds its request count.

Beside the histograms, :class:`Expected` counts the answers that are not 2xx but not
failures either (a deleted account's timeline, a repost of a tweet deleted since it
was read: ``loadgen.action`` says which); their requests are in the histograms as
answered, and each endpoint's figures say how many of them there were.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final

from hdrh.histogram import HdrHistogram

from loadgen.recording import Recorder, histogram, kind

PERCENTILES: Final = (50.0, 90.0, 95.0, 99.0, 99.9, 99.99)
TABLE_PERCENTILES: Final = ("p50", "p95", "p99", "p99.9", "max")


def label(p: float) -> str:
    """``99.9`` → ``"p99.9"``, ``50.0`` → ``"p50"``."""
    return f"p{p:g}"


def stats(h: HdrHistogram, seconds: float, errors: int = 0) -> dict[str, Any]:
    """Count, errors, throughput and latency percentiles (ms) of one histogram."""
    count = h.get_total_count()
    out: dict[str, Any] = {"count": count, "errors": errors,
                           "rps": round(count / seconds, 3) if seconds > 0 else 0.0}
    if not count:
        return out | {label(p): None for p in PERCENTILES} | {"mean": None, "max": None}
    values = h.get_percentile_to_value_dict(list(PERCENTILES))
    out |= {label(p): values[p] / 1000 for p in PERCENTILES}
    out |= {"mean": round(h.get_mean_value() / 1000, 3), "max": h.get_max_value() / 1000,
            "min": h.get_min_value() / 1000}
    return out


def merged(hists: Iterable[HdrHistogram]) -> HdrHistogram:
    """One histogram holding all of ``hists``."""
    total = histogram()
    for h in hists:
        total.add(h)
    return total


class Expected:
    """Expected non-2xx answers per endpoint and status, from ``measure_from`` on.

    Requests due before ``measure_from`` (the warm-up) are left out, as the
    recorder leaves them out of the histograms. It travels as a plain dict
    (``{name: {status: count}}``, string keys): worker to master, and into ``hdr.json``.
    """

    def __init__(self, measure_from: float = 0.0) -> None:
        self.measure_from = measure_from
        self.counts: dict[str, Counter[str]] = {}

    def add(self, name: str, status: int, due: float) -> None:
        """One expected answer ``status`` to a request ``name`` due at ``due`` (epoch s)."""
        if due >= self.measure_from:
            self.counts.setdefault(name, Counter())[str(status)] += 1

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {name: dict(c) for name, c in self.counts.items()}

    def drain(self) -> dict[str, dict[str, int]]:
        """What was counted since the last drain; then forget it (worker → master)."""
        out = self.to_dict()
        self.counts = {}
        return out

    def merge(self, data: Mapping[str, Mapping[str, int]]) -> None:
        """Add a :meth:`to_dict` payload (another process's) to this one."""
        for name, by_status in data.items():
            self.counts.setdefault(name, Counter()).update(by_status)


def summarize(recorder: Recorder, seconds: float,
              expected: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, Any]:
    """Per endpoint, per kind (reads, writes) and overall figures over ``seconds``.

    ``expected`` (an :meth:`Expected.to_dict`) adds each endpoint's expected answers:
    ``expected``, their total, and ``expected_status``, by status.
    """
    names = sorted(recorder.latency)
    endpoints = {n: stats(recorder.latency[n], seconds, recorder.errors[n]) for n in names}
    service = {n: stats(recorder.service[n], seconds, recorder.errors[n]) for n in names}
    groups = {"reads": [n for n in names if kind(n) == "read"],
              "writes": [n for n in names if kind(n) == "write"], "all": names}
    totals = {g: stats(merged(recorder.latency[n] for n in members), seconds,
                       sum(recorder.errors[n] for n in members))
              for g, members in groups.items()}
    for name, s in endpoints.items():
        by_status = dict((expected or {}).get(name, {}))
        s |= {"expected": sum(by_status.values()), "expected_status": by_status}
    for group, members in groups.items():
        totals[group]["expected"] = sum(endpoints[n]["expected"] for n in members)
    return {"seconds": seconds, "endpoints": endpoints, "service": service, **totals,
            "warmup_requests": recorder.warmup, "clipped": recorder.clipped}


def percentile_curve(h: HdrHistogram, ticks: int = 5) -> list[tuple[float, float]]:
    """(percentile, ms) points of the full distribution, HdrHistogram-plot style."""
    if not h.get_total_count():
        return []
    points = [(item.percentile_level_iterated_to, item.value_iterated_to / 1000)
              for item in h.get_percentile_iterator(ticks)]
    return [(p, v) for p, v in points if p < 100.0] + [(100.0, h.get_max_value() / 1000)]


def timeline(recorder: Recorder, since: float = 0.0) -> list[dict[str, Any]]:
    """Per interval: start (epoch s), requests/s by endpoint, errors, p50/p99 by kind."""
    rows = []
    for slot in sorted(recorder.timeline):
        start = slot * recorder.interval
        if start + recorder.interval <= since:
            continue
        bucket = recorder.timeline[slot]
        row: dict[str, Any] = {
            "t": start, "rps": {n: c / recorder.interval for n, c in bucket.counts.items()},
            "errors": sum(bucket.errors.values())}
        for kind_name, h in bucket.hists.items():
            row[f"{kind_name}_p50"] = h.get_value_at_percentile(50) / 1000
            row[f"{kind_name}_p99"] = h.get_value_at_percentile(99) / 1000
        rows.append(row)
    return rows


def problems(summary: dict[str, Any]) -> list[str]:
    """What is inconsistent in a :func:`summarize` result (empty when all is well)."""
    found = []
    endpoints = summary["endpoints"]
    for group, names in (("reads", [n for n in endpoints if kind(n) == "read"]),
                         ("writes", [n for n in endpoints if kind(n) == "write"]),
                         ("all", list(endpoints))):
        for field in ("count", "errors", "expected"):
            parts = sum(endpoints[n].get(field, 0) for n in names)
            if parts != summary[group].get(field, 0):
                found.append(f"{group}.{field} = {summary[group][field]} but endpoints add "
                             f"up to {parts}")
    for name, s in {**endpoints, **{g: summary[g] for g in ("reads", "writes", "all")}}.items():
        found += _row_problems(name, s)
    return found


def _row_problems(name: str, s: dict[str, Any]) -> list[str]:
    found = []
    if s["errors"] + s.get("expected", 0) > s["count"]:
        found.append(f"{name}: {s['errors']} errors and {s.get('expected', 0)} expected "
                     f"answers in {s['count']} requests")
    if not s["count"]:
        return found
    values = [s[label(p)] for p in PERCENTILES] + [s["max"]]
    if any(not math.isfinite(v) or v < 0 for v in values):
        found.append(f"{name}: a percentile is negative or not finite: {values}")
    if any(b < a for a, b in zip(values, values[1:], strict=False)):
        found.append(f"{name}: percentiles decrease: {values}")
    return found


def table(summary: dict[str, Any], title: str = "") -> str:
    """A fixed-width text table: one row per endpoint plus reads, writes and all.

    ``expected`` counts the answers that were expected refusals (not errors); a line
    under the table says which statuses they were.
    """
    head = f"{'endpoint':<24}{'count':>9}{'errors':>8}{'expected':>10}{'rps':>9}" + "".join(
        f"{c + ' ms':>11}" for c in TABLE_PERCENTILES)
    lines = [title, head, "-" * len(head)] if title else [head, "-" * len(head)]
    rows = {**summary["endpoints"], **{g: summary[g] for g in ("reads", "writes", "all")}}
    for name, s in rows.items():
        if name == "reads":
            lines.append("-" * len(head))
        cells = "".join(f"{_ms(s.get(c)):>11}" for c in TABLE_PERCENTILES)
        lines.append(f"{name:<24}{s['count']:>9}{s['errors']:>8}{s.get('expected', 0):>10}"
                     f"{s['rps']:>9.1f}{cells}")
    return "\n".join(lines + _expected_note(summary["endpoints"]))


def _expected_note(endpoints: dict[str, Any]) -> list[str]:
    """``expected answers (not errors): GET home 404 x3; POST repost 409 x1``, if any."""
    parts = [f"{name} {status} x{n}" for name, s in endpoints.items()
             for status, n in sorted(s.get("expected_status", {}).items())]
    return ["expected answers (not errors): " + "; ".join(parts)] if parts else []


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"
