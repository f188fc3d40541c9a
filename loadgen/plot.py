"""The report's PNG plots (matplotlib, Agg backend: no display needed).

- :func:`percentiles`: latency by percentile on an HdrHistogram-style axis, where
  x = 1/(1-q), so p90, p99, p99.9 and p99.99 are equally spaced and the tail gets
  the room it deserves;
- :func:`over_time`: p50 and p99 of reads and writes per interval, and throughput
  per endpoint, with the warm-up shaded;
- :func:`fanout_lag`: each probe's post → visible latency by class, timeouts at the
  deadline, and the view job's event-time → applied lag per micro-batch;
- :func:`streams`: each push sample (post accepted → add at a follower's stream) by
  the author's class, and the live streams open and their events per second.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from hdrh.histogram import HdrHistogram  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FixedFormatter,
    FixedLocator,
    NullFormatter,
    NullLocator,
)

from loadgen.summary import percentile_curve  # noqa: E402

_TICKS: Final = (0.0, 90.0, 99.0, 99.9, 99.99, 99.999)
_TOP_PERCENTILE: Final = 99.999
_DPI: Final = 110


def _log_if_drawn(ax: Any) -> None:
    """A log y axis, unless nothing was drawn (matplotlib cannot log-scale no data)."""
    if ax.has_data():
        ax.set_yscale("log")


def percentiles(curves: dict[str, HdrHistogram], out: Path, title: str) -> Path:
    """One line per named histogram: latency (ms, log) against percentile."""
    fig, ax = plt.subplots(figsize=(9, 5))
    for name, h in curves.items():
        points = [(p, v) for p, v in percentile_curve(h) if p <= _TOP_PERCENTILE]
        if points:
            ax.plot([_x(p) for p, _ in points], [max(v, 1e-3) for _, v in points],
                    label=name, linewidth=1.4)
    if ax.has_data():  # matplotlib cannot log-scale an empty plot
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(FixedLocator([_x(p) for p in _TICKS]))
        ax.xaxis.set_major_formatter(FixedFormatter([f"{p:g}%" for p in _TICKS]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, fontsize=8)
    return _save(fig, out)


def over_time(rows: Sequence[dict[str, Any]], start: float, measure_from: float, out: Path,
              title: str) -> Path:
    """Latency percentiles per interval (top) and throughput per endpoint (bottom)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    t = [r["t"] - start for r in rows]
    for key, style in (("read_p50", "-"), ("read_p99", "-"), ("write_p50", "--"),
                       ("write_p99", "--")):
        values = [r.get(key) for r in rows]
        if any(v is not None for v in values):
            top.plot(t, [v if v is not None else float("nan") for v in values], style,
                     label=key.replace("_", " "))
    _log_if_drawn(top)
    top.set_ylabel("latency (ms)")
    top.set_title(title)
    names = sorted({n for r in rows for n in r["rps"]})
    for name in names:
        bottom.plot(t, [r["rps"].get(name, 0.0) for r in rows], label=name, linewidth=1)
    bottom.plot(t, [sum(r["rps"].values()) for r in rows], "k-", label="total", linewidth=1.6)
    bottom.set_ylabel("requests/s")
    bottom.set_xlabel("seconds since start")
    for ax in (top, bottom):
        _shade_warmup(ax, measure_from - start)
        ax.grid(True, alpha=0.3)
        _legend(ax, fontsize=7, loc="upper left")
    return _save(fig, out)


def fanout_lag(samples: Sequence[dict[str, Any]], batches: Sequence[tuple[float, float]],
               start: float, deadline: float, out: Path, title: str) -> Path:
    """Probe lags (dots; x at the deadline for timeouts) and view lag per batch (line)."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for kind, color in (("normal", "tab:blue"), ("celebrity", "tab:orange"),
                        ("repost", "tab:purple")):
        seen = [s for s in samples if s["kind"] == kind and s["lag"] is not None]
        lost = [s for s in samples if s["kind"] == kind and s["lag"] is None]
        if seen:
            ax.scatter([s["posted_at"] - start for s in seen], [s["lag"] * 1000 for s in seen],
                       s=14, color=color, label=f"post → visible, {kind} author")
        if lost:
            ax.scatter([s["posted_at"] - start for s in lost], [deadline * 1000] * len(lost),
                       marker="x", color=color, label=f"not visible by deadline, {kind}")
    if batches:
        ax.plot([b[0] - start for b in batches], [max(b[1], 0.001) * 1000 for b in batches],
                "g-", linewidth=1, label="view job: newest event time → applied, per batch")
    _log_if_drawn(ax)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("lag (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, fontsize=7)
    return _save(fig, out)


def streams(open_series: Sequence[tuple[float, int]], events: Sequence[tuple[float, float]],
            samples: Sequence[Sequence[Any]], celebrities: set[int] | None, start: float,
            out: Path, title: str) -> Path:
    """Push latency per sample above, streams open and events/s below.

    Samples are ``(writer, accepted at, seconds)``, split by the writer's class (all
    together when the celebrities are unknown).
    """
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    classes = (("normal", "tab:blue"), ("celebrity", "tab:orange")) if celebrities is not None \
        else (("all", "tab:blue"),)
    for name, color in classes:
        mine = [s for s in samples if name == "all" or
                (int(s[0]) in (celebrities or set())) == (name == "celebrity")]
        if mine:
            top.scatter([s[1] - start for s in mine], [max(s[2], 1e-4) * 1000 for s in mine],
                        s=6, color=color, label=f"post accepted → add at a follower, {name}")
    _log_if_drawn(top)
    top.set_ylabel("push latency (ms)")
    top.set_title(title)
    bottom.plot([t - start for t, _ in open_series], [n for _, n in open_series], "g-",
                label="streams open (most per interval)")
    bottom.set_ylabel("streams open")
    right = bottom.twinx()
    right.plot([t - start for t, _ in events], [n for _, n in events], "m-", linewidth=1,
               label="events/s")
    right.set_ylabel("events/s")
    bottom.set_xlabel("seconds since start")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        _legend(ax, fontsize=7, loc="upper left")
    _legend(right, fontsize=7, loc="upper right")
    return _save(fig, out)


def _x(percentile: float) -> float:
    return 1.0 / (1.0 - percentile / 100.0)


def _shade_warmup(ax: Axes, until: float) -> None:
    if until > 0:
        ax.axvspan(0, until, color="grey", alpha=0.15, label="warm-up")


def _legend(ax: Any, **style: Any) -> None:
    """The axes' legend, if anything drawn on them has a label (an empty run draws none)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**style)


def _save(fig: Any, out: Path) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=_DPI)
    plt.close(fig)
    return out
