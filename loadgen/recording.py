"""Latency recording into HdrHistograms, per endpoint, mergeable across processes.

Every request's latency goes into an HdrHistogram of microseconds, 1 µs .. 60 s at
3 significant digits (so p99.9 of a 2 ms read is exact to 2 µs), not into Locust's
rounded buckets. Per endpoint name there are two: ``latency``, timed from when the
request was due (the intended send time in an open-loop run, the send time in a
closed-loop one), and ``service``, timed from the actual send. Their difference is
the queueing that coordinated omission hides.

A timeline of fixed-width intervals (by completion time) keeps counts and errors per
endpoint and a coarser histogram (2 digits) per kind, read or write, for the
over-time plots. Requests due before ``measure_from`` (the warm-up) only reach the
timeline.

A :class:`Recorder` drains to a plain dict of base64 encoded histograms
(``HdrHistogram.encode``) and merges such dicts with ``decode_and_add``: that is how
Locust workers report to the master, and how results are written to disk.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from hdrh.histogram import HdrHistogram

LOWEST_US: Final = 1
HIGHEST_US: Final = 60_000_000
DIGITS: Final = 3
INTERVAL_DIGITS: Final = 2
PAYLOAD_VERSION: Final = 1


def histogram(digits: int = DIGITS) -> HdrHistogram:
    """An empty histogram of microseconds, 1 µs .. 60 s."""
    return HdrHistogram(LOWEST_US, HIGHEST_US, digits)


def micros(seconds: float) -> int:
    """Seconds as whole microseconds within the histogram's range."""
    return min(HIGHEST_US, max(LOWEST_US, round(seconds * 1e6)))


def kind(name: str) -> str:
    """``read`` for GET endpoints, ``write`` for the rest (names start with the method)."""
    return "read" if name.startswith("GET") else "write"


def encode(h: HdrHistogram) -> str:
    """A histogram as compressed base64 text."""
    return h.encode().decode("ascii")


def decode(text: str, digits: int = DIGITS) -> HdrHistogram:
    """A histogram from :func:`encode` text (into the standard range and precision)."""
    h = histogram(digits)
    h.decode_and_add(text.encode("ascii"))
    return h


@dataclass
class Interval:
    """One interval of the timeline."""

    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    hists: dict[str, HdrHistogram] = field(default_factory=dict)

    def hist(self, kind_name: str) -> HdrHistogram:
        if kind_name not in self.hists:
            self.hists[kind_name] = histogram(INTERVAL_DIGITS)
        return self.hists[kind_name]


class Recorder:
    """Per-endpoint histograms and a timeline; see the module docstring."""

    def __init__(self, measure_from: float = 0.0, interval: float = 1.0) -> None:
        if not interval > 0:
            msg = f"interval must be > 0 s, got {interval}"
            raise ValueError(msg)
        self.measure_from, self.interval = measure_from, interval
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded."""
        self.latency: dict[str, HdrHistogram] = {}
        self.service: dict[str, HdrHistogram] = {}
        self.errors: Counter[str] = Counter()
        self.timeline: dict[int, Interval] = {}
        self.warmup = 0
        self.clipped = 0

    def record(self, name: str, *, due: float, done: float, latency: float, service: float,
               ok: bool) -> None:
        """One request: due (intended) time and completion time in epoch seconds."""
        self._record_interval(name, done, latency, ok)
        if due < self.measure_from:
            self.warmup += 1
            return
        self.clipped += latency * 1e6 > HIGHEST_US
        _hist(self.latency, name).record_value(micros(latency))
        _hist(self.service, name).record_value(micros(service))
        if not ok:
            self.errors[name] += 1

    def _record_interval(self, name: str, done: float, latency: float, ok: bool) -> None:
        slot = int(done // self.interval)
        bucket = self.timeline.setdefault(slot, Interval())
        bucket.counts[name] += 1
        if not ok:
            bucket.errors[name] += 1
        bucket.hist(kind(name)).record_value(micros(latency))

    def count(self) -> int:
        """Requests measured (after the warm-up)."""
        return sum(h.get_total_count() for h in self.latency.values())

    # -- serialization ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Everything recorded, as JSON- and msgpack-safe data (str keys, str values)."""
        return {
            "v": PAYLOAD_VERSION, "interval": self.interval, "warmup": self.warmup,
            "clipped": self.clipped,
            "latency": {n: encode(h) for n, h in self.latency.items()},
            "service": {n: encode(h) for n, h in self.service.items()},
            "errors": dict(self.errors),
            "timeline": {str(slot): {"counts": dict(b.counts), "errors": dict(b.errors),
                                     "hists": {k: encode(h) for k, h in b.hists.items()}}
                         for slot, b in self.timeline.items()},
        }

    def drain(self) -> dict[str, Any]:
        """What was recorded since the last drain; then forget it (worker → master)."""
        out = self.to_dict()
        self.reset()
        return out

    def merge(self, data: dict[str, Any]) -> None:
        """Add a :meth:`to_dict` payload (another process's, or a file's) to this one."""
        if data.get("v") != PAYLOAD_VERSION:
            msg = f"cannot merge recording version {data.get('v')!r}"
            raise ValueError(msg)
        self.warmup += int(data["warmup"])
        self.clipped += int(data["clipped"])
        for name, text in data["latency"].items():
            _hist(self.latency, name).decode_and_add(text.encode("ascii"))
        for name, text in data["service"].items():
            _hist(self.service, name).decode_and_add(text.encode("ascii"))
        self.errors.update(data["errors"])
        for slot, raw in data["timeline"].items():
            self._merge_interval(int(slot), raw, float(data["interval"]))

    def _merge_interval(self, slot: int, raw: dict[str, Any], interval: float) -> None:
        if interval != self.interval:
            slot = int(slot * interval // self.interval)
        bucket = self.timeline.setdefault(slot, Interval())
        bucket.counts.update(raw["counts"])
        bucket.errors.update(raw["errors"])
        for kind_name, text in raw["hists"].items():
            bucket.hist(kind_name).decode_and_add(text.encode("ascii"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recorder:
        """A recorder holding exactly a :meth:`to_dict` payload."""
        recorder = cls(interval=float(data["interval"]))
        recorder.merge(data)
        return recorder


def _hist(table: dict[str, HdrHistogram], name: str) -> HdrHistogram:
    if name not in table:
        table[name] = histogram()
    return table[name]
