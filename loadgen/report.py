"""The report of a load run: ``summary.json``, PNG plots and a self-contained ``report.html``.

Input is one :class:`ModeRun` per read mode measured (``fanout``: the materialized
view; ``read``: the home query evaluated at read time): the Locust results file
(``hdr.json``, see ``locustfile.py``: histograms, and the expected non-2xx answers
counted apart), the fan-out probe's samples and the view job's lag per micro-batch. :func:`build` writes everything into one directory and
returns the summary; :func:`render_text` is the short table printed at the end.
Every figure comes from HdrHistograms; percentiles are in milliseconds.

**Live streams.** When stream users ran, ``hdr.json`` holds the push samples its
writer joined (:mod:`loadgen.push`: a load user's post or reply accepted with a 202 →
the ``add`` of that tweet at a follower's stream, matched by tweet id across the
Locust processes) and the stream tally. :func:`push_summary` splits the samples by
their writer into normal and celebrity authors — with the celebrities ``hdr.json``
names (the workload's: ``fanout load`` takes them from the store's celebrity table,
or ``--fanout-celebrities``; without them the split is not made) — and gives p50/p99/p99.9/max of each; :func:`stream_summary` gives the streams open,
events per second, resets and cut-off clients.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Final

from hdrh.histogram import HdrHistogram

from loadgen import plot
from loadgen.errors import ReportError
from loadgen.probe import CLASSES, ProbeResult
from loadgen.push import CLASSES as PUSH_CLASSES
from loadgen.push import StreamTally, classify
from loadgen.recording import Recorder, kind
from loadgen.summary import PERCENTILES, label, merged, problems, stats, summarize, table, timeline

log = logging.getLogger(__name__)

SUMMARY: Final = "summary.json"
HTML: Final = "report.html"
COMPARE_COLUMNS: Final = ("p50", "p99", "p99.9")
#: Run-info fields in seconds besides those named ``*_s``: the probe's pace and bounds.
SECONDS: Final = frozenset({"interval", "deadline", "poll"})


@dataclass
class ModeRun:
    """What was measured against one API read mode."""

    mode: str
    results: dict[str, Any]
    probe: ProbeResult | None = None
    batches: list[tuple[float, float]] = field(default_factory=list)
    probe_deadline: float = 30.0
    #: The load generator's own cost: Locust processes, CPU-s and wall-s of its run.
    client: dict[str, Any] | None = None
    #: The API's cost over the same run (processes, CPU-s, wall-s), when it is local.
    server: dict[str, Any] | None = None

    @cached_property
    def recorder(self) -> Recorder:
        return Recorder.from_dict(self.results["recording"])

    @property
    def meta(self) -> dict[str, Any]:
        return self.results["meta"]

    @property
    def expected(self) -> dict[str, dict[str, int]]:
        """Expected non-2xx answers by endpoint and status (none in older results)."""
        return self.results.get("expected") or {}

    def seconds(self) -> float:
        """Measured seconds: from the end of the warm-up to the stop."""
        stop = self.meta.get("stopped_at") or self.meta["measure_from"]
        return max(stop - self.meta["measure_from"], 1e-9)


def load_results(path: Path) -> dict[str, Any]:
    """The ``hdr.json`` a Locust run wrote, or :class:`ReportError` saying why not."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        msg = f"no Locust results in {path}: {exc}"
        raise ReportError(msg) from exc
    if "meta" not in data or "recording" not in data:
        msg = f"{path} is not a results file of loadgen/locustfile.py"
        raise ReportError(msg)
    return data


def build(runs: list[ModeRun], info: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write summary.json, the PNGs and report.html into ``out``; return the summary."""
    if not runs:
        msg = "nothing was measured: no run to report"
        raise ReportError(msg)
    out.mkdir(parents=True, exist_ok=True)
    celebrities = {r.mode: celebrities_of(r) for r in runs}
    summary: dict[str, Any] = {"run": info, "modes": {
        r.mode: mode_summary(r, celebrities[r.mode]) for r in runs}}
    summary["compare"] = compare_rows(summary)
    images = _plots(runs, out, celebrities)
    summary["images"] = [p.name for p in images]
    (out / SUMMARY).write_text(json.dumps(summary, indent=2, default=_json_default))
    (out / HTML).write_text(render_html(summary, images))
    return summary


def mode_summary(run: ModeRun, celebrities: set[int] | None = None) -> dict[str, Any]:
    """Figures of one mode: endpoints, reads/writes/all, fan-out, streams, view lag, checks."""
    seconds = run.seconds()
    figures = summarize(run.recorder, seconds, run.expected)
    figures["meta"] = run.meta
    figures["fanout_latency"] = probe_summary(run.probe, seconds) if run.probe else None
    push, streams = run.results.get("push"), run.results.get("streams")
    figures["push_latency"] = push_summary(push, celebrities, seconds) if push else None
    figures["streams"] = stream_summary(streams, run.meta, seconds) if streams else None
    figures["view_lag"] = lag_summary(run.batches)
    figures["problems"] = problems(figures)
    for name, cost in (("client", run.client), ("server", run.server)):
        if cost is not None:
            wall = cost["wall_s"]
            figures[name] = {**cost, "cores": round(cost["cpu_s"] / wall, 2) if wall > 0 else None}
    return figures


def probe_summary(result: ProbeResult, seconds: float) -> dict[str, Any]:
    """Per probe class: write → visible percentiles, timeouts and errors; all samples.

    ``read_your_writes``: the ``?after=`` reads of the author's own write, their
    percentiles and ``misses`` (answers that did not show the write).
    """
    out: dict[str, Any] = {k: stats(result.hists[k], seconds, result.errors[k])
                           | {"timeouts": result.timeouts[k]} for k in CLASSES}
    out["read_your_writes"] = stats(result.own, seconds) | {"misses": result.own_misses}
    out["skipped"] = result.skipped
    out["samples"] = [asdict(s) for s in result.samples]
    return out


def celebrities_of(run: ModeRun) -> set[int] | None:
    """The celebrities the run's results name (the workload's; None: unknown)."""
    named = run.meta.get("celebrities")
    return {int(u) for u in named} if named is not None else None


def push_summary(push: dict[str, Any], celebrities: set[int] | None,
                 seconds: float) -> dict[str, Any]:
    """Push latency (post accepted → ``add`` at a follower's stream) by author class, ms.

    ``normal`` and ``celebrity`` (None each when the celebrities are unknown) and
    ``all``; the counts that stayed out of the percentiles: ``caught_up`` (receipts
    of tweets accepted before the stream connected: sent by a (re)connect, not
    pushed), ``unmatched`` (no load user's accept: a probe's post), ``warmup``;
    ``accepted``: posts and replies accepted in the measured part.
    """
    samples = push.get("samples") or []
    out: dict[str, Any] = {"all": stats(classify(samples, set())["normal"], seconds)}
    split = classify(samples, celebrities) if celebrities is not None else None
    for k in PUSH_CLASSES:
        out[k] = stats(split[k], seconds) if split is not None else None
    out |= {"celebrities_known": celebrities is not None,
            **{k: int(push.get(k, 0)) for k in ("accepted", "unmatched", "caught_up",
                                                "warmup", "negative", "dropped")},
            "samples": samples}
    return out


def stream_summary(streams: dict[str, Any], meta: dict[str, Any],
                   seconds: float) -> dict[str, Any]:
    """Streams open (most at once, mean), events/s, resets and cut-off clients.

    Events and open streams per interval cover the measured part only (from
    ``measure_from`` to the stop); the counts cover the whole run. A client is *cut
    off* when the server ended its stream for it: ``end`` with ``too_slow`` (its queue
    was full), or the connection closed with no ``end`` (``dropped``: a send that
    timed out closes the socket).
    """
    tally = StreamTally(float(streams.get("interval", 1.0)))
    tally.merge(streams)
    begin, stop = meta["measure_from"], meta.get("stopped_at") or meta["measure_from"]
    opened = [n for t, n in tally.open_series() if begin <= t < stop]
    events = sum(n * tally.interval for t, n in tally.event_series() if begin <= t < stop)
    counts, ended = tally.counts, tally.ended
    return {"connects": counts["connects"], "resumes": counts["resumes"],
            "failed_connects": counts["failed_connects"],
            "open_max": max(opened, default=0),
            "open_mean": round(sum(opened) / len(opened), 1) if opened else 0,
            "events": {k: v for k, v in tally.events.items() if k != "comment"},
            "events_per_s": round(events / seconds, 2) if seconds > 0 else 0.0,
            "heartbeats": tally.events["comment"], "resets": tally.events["reset"],
            "ended": dict(ended),
            "cut_off": {"too_slow": ended["too_slow"], "dropped": counts["dropped"]},
            "errors": counts["error"],
            "series": {"open": tally.open_series(), "events": tally.event_series()}}


def lag_summary(batches: list[tuple[float, float]]) -> dict[str, Any]:
    """Event time → applied lag over the run's micro-batches (ms)."""
    lags = sorted(lag * 1000 for _, lag in batches)
    out: dict[str, Any] = {"batches": len(lags), "series": batches}
    for p in (50.0, 99.0):
        out[label(p)] = lags[min(len(lags) - 1, math.ceil(p / 100 * len(lags)) - 1)] if lags \
            else None
    out["max"] = lags[-1] if lags else None
    return out


def compare_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Read percentiles per mode (all reads and first home pages), side by side."""
    rows = []
    for mode, figures in summary["modes"].items():
        home = figures["endpoints"].get("GET home", {})
        rows.append({"mode": mode, "rate": figures["meta"]["options"].get("fanout_rate"),
                     "reads": figures["reads"]["count"], "read_errors": figures["reads"]["errors"],
                     **{f"read {c}": figures["reads"].get(c) for c in COMPARE_COLUMNS},
                     **{f"home {c}": home.get(c) for c in COMPARE_COLUMNS},
                     "api cores": (figures.get("server") or {}).get("cores")})
    return rows


# -- plots ----------------------------------------------------------------------------
def _plots(runs: list[ModeRun], out: Path,
           celebrities: dict[str, set[int] | None]) -> list[Path]:
    images = [plot.percentiles(_curves(runs), out / "latency-percentiles.png",
                               "Latency by percentile (HdrHistogram, from intended send time "
                               "in open loop)")]
    for run in runs:
        start, rec = run.meta["started_at"], run.recorder
        images.append(plot.over_time(timeline(rec), start, run.meta["measure_from"],
                                     out / f"over-time-{run.mode}.png",
                                     f"Latency and throughput over time ({run.mode} mode)"))
        streams = run.results.get("streams")
        if streams:
            tally = StreamTally(float(streams.get("interval", 1.0)))
            tally.merge(streams)
            push = (run.results.get("push") or {}).get("samples") or []
            images.append(plot.streams(tally.open_series(), tally.event_series(), push,
                                       celebrities.get(run.mode), start,
                                       out / f"streams-{run.mode}.png",
                                       f"Live streams ({run.mode} mode)"))
        if run.probe is not None or run.batches:
            samples = [asdict(s) for s in run.probe.samples] if run.probe else []
            images.append(plot.fanout_lag(samples, run.batches, start, run.probe_deadline,
                                          out / f"fanout-lag-{run.mode}.png",
                                          f"Fan-out lag over time ({run.mode} mode)"))
    return images


def _curves(runs: list[ModeRun]) -> dict[str, HdrHistogram]:
    """Every endpoint for one mode; reads per endpoint and all writes for several."""
    curves: dict[str, HdrHistogram] = {}
    for run in runs:
        rec = run.recorder
        prefix = f"{run.mode}: " if len(runs) > 1 else ""
        for name in sorted(rec.latency):
            if len(runs) == 1 or kind(name) == "read":
                curves[prefix + name] = rec.latency[name]
        writes = [h for n, h in rec.latency.items() if kind(n) == "write"]
        if len(runs) > 1 and writes:
            curves[prefix + "all writes"] = merged(writes)
    return curves


# -- text and HTML ----------------------------------------------------------------------
def render_text(summary: dict[str, Any]) -> str:
    """The short end-of-run table: per mode, fan-out latency, and the comparison."""
    parts = []
    for mode, figures in summary["modes"].items():
        parts.append(table(figures, f"== {mode} mode: latency in ms over "
                                    f"{figures['seconds']:.0f} s"))
        client = figures.get("client")
        if client:
            parts.append(f"load generator: {client['processes']} Locust process(es), "
                         f"{client['cpu_s']} CPU-s over {client['wall_s']} s "
                         f"({client['cores']} cores), {os.cpu_count()} cores on this box")
        server = figures.get("server")
        if server:
            parts.append(f"API: {server['processes']} process(es), {server['cpu_s']} CPU-s over "
                         f"{server['wall_s']} s ({server['cores']} cores)")
        fan = figures.get("fanout_latency")
        if fan:
            parts.append(_fanout_text(fan))
        if figures.get("streams"):
            parts.append(_streams_text(figures["streams"], figures.get("push_latency")))
        for problem in figures["problems"]:
            parts.append(f"INCONSISTENT: {problem}")
    if len(summary["compare"]) > 1:
        parts.append(_compare_text(summary["compare"]))
    return "\n\n".join(parts)


def _fanout_text(fan: dict[str, Any]) -> str:
    lines = ["fan-out latency (post or repost → visible in a follower's home timeline), ms"]
    for k in CLASSES:
        s = fan[k]
        lines.append(f"  {k:<10} n={s['count']:<5} p50={_ms(s.get('p50'))} "
                     f"p99={_ms(s.get('p99'))} max={_ms(s.get('max'))} "
                     f"timeouts={s['timeouts']} errors={s['errors']}")
    own = fan.get("read_your_writes")
    if own:
        lines.append(f"read-your-writes (?after= read of the author's own post), ms: "
                     f"n={own['count']} p50={_ms(own.get('p50'))} p99={_ms(own.get('p99'))} "
                     f"misses={own['misses']}")
    return "\n".join(lines)


def _streams_text(streams: dict[str, Any], push: dict[str, Any] | None) -> str:
    cut = streams["cut_off"]
    lines = [f"live streams: {streams['open_max']} open at most ({streams['open_mean']} on "
             f"average), {streams['connects']} connects ({streams['resumes']} resumed, "
             f"{streams['failed_connects']} failed), {streams['events_per_s']} events/s, "
             f"{streams['resets']} resets, cut off: {cut['too_slow']} too slow, "
             f"{cut['dropped']} dropped, {streams['errors']} errors"]
    if push:
        lines.append("push latency (post accepted 202 → add at a follower's stream), ms")
        for k in (*PUSH_CLASSES, "all"):
            s = push[k]
            if s is None:
                lines.append(f"  {k:<10} - (the celebrities are unknown)")
                continue
            lines.append(f"  {k:<10} n={s['count']:<6} p50={_ms(s.get('p50'))} "
                         f"p99={_ms(s.get('p99'))} p99.9={_ms(s.get('p99.9'))} "
                         f"max={_ms(s.get('max'))}")
        lines.append(f"  {push['accepted']} posts accepted; {push['caught_up']} receipts "
                     f"caught up on a (re)connect, {push['unmatched']} unmatched")
    return "\n".join(lines)


def _compare_text(rows: list[dict[str, Any]]) -> str:
    head = f"{'read mode':<10}{'rate/s':>8}{'reads':>9}" + "".join(
        f"{'read ' + c:>14}" for c in COMPARE_COLUMNS) + f"{'API cores':>11}"
    lines = ["fan-out-on-write vs fan-out-on-read, same open-loop load (ms):", head]
    for r in rows:
        lines.append(f"{r['mode']:<10}{r['rate'] or 0:>8g}{r['reads']:>9}" + "".join(
            f"{_ms(r['read ' + c]):>14}" for c in COMPARE_COLUMNS) + f"{_ms(r['api cores']):>11}")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_html(summary: dict[str, Any], images: list[Path]) -> str:
    """A single HTML page with the tables and the PNGs embedded as data URIs."""
    body = [f"<h1>fanout load report — {_e(summary['run'].get('name', ''))}</h1>",
            _info_html(summary["run"])]
    if len(summary["compare"]) > 1:
        body.append("<h2>Fan-out on write vs fan-out on read</h2>" + _compare_html(summary))
    for mode, figures in summary["modes"].items():
        body.append(_mode_html(mode, figures))
    body.append("<h2>Plots</h2>")
    body += [f'<figure><img alt="{_e(p.stem)}" src="data:image/png;base64,'
             f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{_e(p.name)}'
             f"</figcaption></figure>" for p in images]
    return _PAGE.format(title=_e(summary["run"].get("name", "fanout load")),
                        body="\n".join(body))


def _info_html(info: dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{_e(name)}</th><td>{_e(text)}</td></tr>"
                   for name, text in map(_field, info.items()))
    return f"<table class='info'>{rows}</table>"


def _field(item: tuple[str, Any]) -> tuple[str, str]:
    """A run-info field as a person reads it: ``("duration_s", 60.0)`` → duration, 60 s."""
    key, value = item
    seconds = key.endswith("_s") or key in SECONDS
    name = key.removesuffix("_s").replace("_", " ")
    return name, _words(value) + (" s" if seconds and isinstance(value, int | float) else "")


def _words(value: Any) -> str:
    """A value as words, never a Python repr: lists comma-separated, dicts as "key value"."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(map(_words, value))
    if isinstance(value, dict):
        return ", ".join(" ".join(_field((str(k), v))) for k, v in value.items())
    return str(value)


def _compare_html(summary: dict[str, Any]) -> str:
    cols = ["mode", "rate", "reads", "read_errors",
            *(f"read {c}" for c in COMPARE_COLUMNS), *(f"home {c}" for c in COMPARE_COLUMNS),
            "api cores"]
    return _table_html(cols, [[r[c] for c in cols] for r in summary["compare"]],
                       "Read latency in ms at the same open-loop rate, on the same store; "
                       "api cores: the CPU the API processes used over the run.")


def _mode_html(mode: str, figures: dict[str, Any]) -> str:
    cols = ["endpoint", "count", "errors", "expected", "rps",
            *(label(p) for p in PERCENTILES), "max"]
    rows = [[name, *(s.get(c) for c in cols[1:])] for name, s in
            {**figures["endpoints"], **{g: figures[g] for g in ("reads", "writes", "all")}}.items()]
    open_loop = bool(figures["meta"]["options"].get("fanout_rate"))
    note = ("Timed from the intended send time (open loop, coordinated omission corrected)."
            if open_loop else "Timed from the actual send time (closed loop).")
    note += (" expected: answers that are refusals by design, not errors (a deleted "
             "account's timeline, a repost of a tweet deleted since it was read).")
    parts = [f"<h2>{_e(mode)} mode</h2>", _table_html(cols, rows, note)]
    if open_loop:
        service = [[n, s["count"], s.get("p50"), s.get("p99"), s.get("p99.9"), s.get("max")]
                   for n, s in figures["service"].items()]
        parts.append(_table_html(["endpoint", "count", "p50", "p99", "p99.9", "max"], service,
                                 "Service time only (from the actual send): what a "
                                 "closed-loop tool would have reported."))
    parts.append(_fanout_html(figures.get("fanout_latency"), figures["view_lag"]))
    if figures.get("streams"):
        parts.append(_streams_html(figures["streams"], figures.get("push_latency")))
    checks = figures["problems"] or ["counts add up and percentiles are monotonic"]
    parts.append("<p class='checks'>Checks: " + "; ".join(map(_e, checks)) + "</p>")
    return "\n".join(parts)


def _fanout_html(fan: dict[str, Any] | None, lag: dict[str, Any]) -> str:
    rows = [[k, fan[k]["count"], fan[k]["timeouts"], fan[k]["errors"], fan[k].get("p50"),
             fan[k].get("p99"), fan[k].get("max")] for k in CLASSES] if fan else []
    if fan and "read_your_writes" in fan:
        own = fan["read_your_writes"]
        rows.append(["read-your-writes", own["count"], f"{own['misses']} missed", "",
                     own.get("p50"), own.get("p99"), own.get("max")])
    rows.append(["view job, per batch", lag["batches"], "", "", lag.get("p50"), lag.get("p99"),
                 lag.get("max")])
    return _table_html(["fan-out", "count", "timeouts", "errors", "p50", "p99", "max"], rows,
                       "Post or repost → visible in a follower's home timeline (ms); an "
                       "author's ?after= read of their own post (a miss: it did not show "
                       "it); the view job's newest event time → applied per micro-batch.")


def _streams_html(streams: dict[str, Any], push: dict[str, Any] | None) -> str:
    rows = [[k, s["count"], s.get("p50"), s.get("p99"), s.get("p99.9"), s.get("max")]
            for k in (*PUSH_CLASSES, "all") if push and (s := push[k]) is not None]
    parts = [_table_html(["push", "count", "p50", "p99", "p99.9", "max"], rows,
                         "Post or reply accepted by the API (its 202 at the writer) → the "
                         "add event of that tweet at a follower holding a live stream (ms), "
                         "by the author's class; receipts of tweets accepted before the "
                         "stream (re)connected are catch-up, not push, and left out.")]
    cut = streams["cut_off"]
    parts.append(_table_html(
        ["open at most", "open on average", "connects", "resumed", "failed", "events/s",
         "resets", "cut off: too slow", "cut off: dropped", "errors"],
        [[streams["open_max"], streams["open_mean"], streams["connects"], streams["resumes"],
          streams["failed_connects"], streams["events_per_s"], streams["resets"],
          cut["too_slow"], cut["dropped"], streams["errors"]]],
        "Live home streams held by the stream users over the measured part."))
    return "\n".join(parts)


def _table_html(cols: list[str], rows: list[list[Any]], caption: str) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>"
                   for row in rows)
    return f"<table><caption>{_e(caption)}</caption><tr>{head}</tr>{body}</table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return _e("" if value is None else value)


def _e(value: Any) -> str:
    return html.escape(str(value))


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    msg = f"cannot serialize {type(value).__name__}"
    raise TypeError(msg)


_PAGE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
table.info th {{ text-align: left; }}
caption {{ caption-side: bottom; font-size: 0.85em; color: #555; text-align: left; }}
img {{ max-width: 100%; }}
.checks {{ color: #555; font-size: 0.85em; }}
</style></head><body>
{body}
</body></html>
"""
