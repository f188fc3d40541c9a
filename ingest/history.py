"""Reading history files into changelog events, streaming, and merging them by time.

Formats, chosen by name: a directory written by ``fanout generate`` (``users.jsonl``,
``follows.jsonl``, ``tweets.jsonl``); a ``.jsonl``/``.ndjson`` file of contract values
in any mix of topics (the ``op`` tells which; ``delete`` is the users topic's when it
names ``user_id`` and the tweets topic's when it names ``tweet_id`` and ``author_id``,
DESIGN §4b); a ``.csv`` of records, whose header has an ``op`` column (below); a
``.csv`` of ``follower_id,followee_id[,created_at]`` with or without a header; anything
else is a SNAP-style edge list, ``follower followee`` separated by whitespace, ``#``
comments allowed. Any of them may be gzipped (``.gz``). Ids of an edge list can be
shifted by an ``id_offset`` (``fanout replay --id-offset 1``): most SNAP graphs count
nodes from 0, and the contract's ids are positive (DESIGN §3).

A CSV of records holds any contract records, one per row, like JSONL: its header names
``op`` and any of the contract's fields (``created_at,op,tweet_id,author_id,text,
in_reply_to_user_id,original_tweet_id,original_author_id,follower_id,followee_id,
user_id,handle,name``, in any order, ``v`` optional); a row sets the fields its record
has and leaves the others empty. An empty cell is an absent field, except the ``name``
of an ``upsert``, which may be empty. Every row needs its ``created_at``; ids are not
shifted.

Edge lists carry no time. Edge ``i`` (counting kept edges, in file order) gets
``created_at = EdgeTimes.start_ms + i * EdgeTimes.step_ms``, so the graph grows in file
order; :func:`census` counts the edges first so the caller can spread them over a
window (see ``ingest.generator.activity_window``).

Nothing is dropped silently: a malformed line is counted in a :class:`ReadReport` with
its place and reason (the first few kept as examples) and the read goes on; a
self-loop is counted as skipped. Readers never hold a whole file in memory;
:func:`follow_edges`, asked for a graph's edges, keeps them as three int64 arrays.
"""

from __future__ import annotations

import csv
import gzip
import heapq
import io
import json
import logging
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, Final, cast

import numpy as np

from ingest.errors import InvalidEvent
from ingest.events import (
    FIELDS,
    KEY_FIELDS,
    KINDS,
    MAX_CREATED_AT,
    MAX_ID,
    TOPIC_RANK,
    TWEETS,
    USERS,
    Event,
    Follow,
    decode,
    load_object,
)
from ingest.generator import DEFAULT_START_MS, FILES, FollowEdges

log = logging.getLogger(__name__)

MAX_EXAMPLES: Final = 5


def _topic_of_op() -> dict[str, str]:
    """The topic of each op only one topic has (``delete`` is two topics': :func:`topic_of`)."""
    topics: dict[str, set[str]] = {}
    for kind in KINDS:
        topics.setdefault(kind.op, set()).add(kind.topic)
    return {op: found.pop() for op, found in topics.items() if len(found) == 1}


_TOPIC_OF_OP: Final = _topic_of_op()
#: The contract's fields, for the header of a CSV of records; these hold integers.
_INT_FIELDS: Final = frozenset({"v", *(name for name, kind in FIELDS.items() if kind is int)})
_RECORD_FIELDS: Final = frozenset({"v", "op", *FIELDS})
_JSONL_SUFFIXES: Final = {".jsonl", ".ndjson", ".json"}
_CSV_HEADER: Final = ("follower_id", "followee_id", "created_at")
#: What to do about node id 0, said with every such line and in the report.
ZERO_ID_HINT: Final = "a 0-based graph? replay with --id-offset 1"


@dataclass
class ReadReport:
    """What readers could not turn into events, by reason, plus the first examples."""

    invalid: int = 0
    #: Invalid lines that name node id 0 (a 0-based graph read without an offset).
    zero_ids: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    out_of_order: int = 0
    examples: list[str] = field(default_factory=list)

    def invalid_line(self, where: str, reason: str) -> None:
        """Count one malformed line."""
        self.invalid += 1
        self.zero_ids += ZERO_ID_HINT in reason
        self._example(f"{where}: {reason}")

    def skip(self, reason: str, where: str) -> None:
        """Count one well-formed line left out on purpose (e.g. a self-loop)."""
        self.skipped[reason] += 1
        self._example(f"{where}: skipped, {reason}")

    def render(self) -> str:
        """One line per kind of problem, then the examples."""
        lines = [f"invalid lines: {self.invalid}"]
        if self.zero_ids:
            lines.append(f"lines with node id 0: {self.zero_ids} ({ZERO_ID_HINT})")
        lines += [f"skipped ({reason}): {n}" for reason, n in sorted(self.skipped.items())]
        if self.out_of_order:
            lines.append(f"events earlier than their predecessor in the file: "
                         f"{self.out_of_order}")
        lines += [f"  e.g. {example}" for example in self.examples]
        return "\n".join(lines)

    def _example(self, text: str) -> None:
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(text)
            log.debug("%s", text)


@dataclass(frozen=True)
class EdgeTimes:
    """Synthetic ``created_at`` of untimed edges: edge i at ``start_ms + i * step_ms``."""

    start_ms: int = DEFAULT_START_MS
    step_ms: int = 1

    @classmethod
    def spread(cls, edges: int, lo: int, hi: int) -> EdgeTimes:
        """Spread ``edges`` edges evenly over ``[lo, hi)``."""
        return cls(lo, max(1, (hi - lo) // max(edges, 1)))


@dataclass
class GraphCensus:
    """A first pass over edge files: sizes, follower counts and time range."""

    edges: int = 0
    follower_counts: dict[int, int] = field(default_factory=dict)
    timed: bool = False
    first_ms: int | None = None
    last_ms: int | None = None


def is_edge_list(path: Path) -> bool:
    """Whether ``path`` is a CSV or SNAP edge list (not contract JSONL or CSV records)."""
    if path.is_dir() or _suffix(path) in _JSONL_SUFFIXES:
        return False
    return _suffix(path) != ".csv" or not _csv_has_records(path)


def iter_events(path: Path | str, report: ReadReport | None = None,
                edge_times: EdgeTimes | None = None, *, id_offset: int = 0) -> Iterator[Event]:
    """Events of one history file or generator directory, in file (= event-time) order.

    ``id_offset`` is added to every node id of an edge list (not to contract JSONL).
    """
    path = Path(path)
    report = ReadReport() if report is None else report
    if path.is_dir():
        return _iter_dir(path, report)
    if _suffix(path) in _JSONL_SUFFIXES:
        return _in_order(_iter_jsonl(path, report), report)
    if _suffix(path) == ".csv" and _csv_has_records(path):
        return _in_order(_iter_records_csv(path, report), report)
    if _suffix(path) == ".csv":
        return _in_order(_iter_csv(path, report, edge_times or EdgeTimes(), id_offset), report)
    return _iter_edges(path, report, edge_times or EdgeTimes(), id_offset)


def merge_by_time(*streams: Iterable[Event]) -> Iterator[Event]:
    """Merge time-ordered streams into one, lazily (``heapq.merge``).

    Ties on ``created_at`` go follows, tweets, users (``TOPIC_RANK``), then by argument
    order, then by order within a stream: the merge is stable and deterministic.
    """
    return heapq.merge(*streams, key=_time_key)


def census(path: Path | str, *, id_offset: int = 0) -> GraphCensus:
    """Count the edges and followers of an edge-list file (one streaming pass)."""
    result = GraphCensus()
    counts = result.follower_counts
    for event in iter_events(path, ReadReport(), id_offset=id_offset):
        if isinstance(event, Follow) and event.active:
            result.edges += 1
            counts[event.followee_id] = counts.get(event.followee_id, 0) + 1
            counts.setdefault(event.follower_id, 0)
            if result.first_ms is None:
                result.first_ms = event.created_at
            result.last_ms = event.created_at
    result.timed = _suffix(Path(path)) == ".csv" and _csv_has_times(Path(path))
    return result


def follow_edges(path: Path | str, edge_times: EdgeTimes, *, id_offset: int = 0
                 ) -> FollowEdges:
    """The follow edges of an edge-list file, with the times a replay gives them."""
    follower, followee, since = array("q"), array("q"), array("q")
    for event in iter_events(path, ReadReport(), edge_times, id_offset=id_offset):
        if isinstance(event, Follow) and event.active:
            follower.append(event.follower_id)
            followee.append(event.followee_id)
            since.append(event.created_at)
    return FollowEdges(*(np.frombuffer(a, dtype=np.int64) for a in (follower, followee, since)))


def decode_line(line: bytes | str) -> Event:
    """Decode one contract JSON value whose topic follows from its ``op`` (and fields)."""
    body = load_object(line)
    raw = line if isinstance(line, bytes) else line.encode()
    return _decode_body(body, raw)


def topic_of(body: dict[str, Any]) -> str:
    """The topic of a contract record read from a file, which names none.

    The ``op`` tells, except for ``delete`` (DESIGN §4b): ``user_id`` alone deletes an
    account (users topic), ``tweet_id`` and ``author_id`` a tweet (tweets topic).
    """
    op = body.get("op")
    if op == "delete":
        tweet = "tweet_id" in body or "author_id" in body
        if "user_id" in body and not tweet:
            return USERS
        if not tweet:
            msg = ("a delete names neither a tweet (tweet_id, author_id) nor an account "
                   "(user_id)")
            raise InvalidEvent(msg)
        return TWEETS
    topic = _TOPIC_OF_OP.get(op) if isinstance(op, str) else None
    if topic is None:
        msg = f"unknown op {op!r}"
        raise InvalidEvent(msg)
    return topic


def _decode_body(body: dict[str, Any], raw: bytes) -> Event:
    topic = topic_of(body)
    # The file has no Kafka key: derive it, so decode checks everything else.
    key = str(body.get(KEY_FIELDS[topic])).encode()
    return decode(topic, key, raw)


# -- readers -------------------------------------------------------------------------


def _iter_dir(path: Path, report: ReadReport) -> Iterator[Event]:
    files = [path / name for name in FILES.values() if (path / name).exists()]
    files += [path / (name + ".gz") for name in FILES.values()
              if (path / (name + ".gz")).exists()]
    if not files:
        msg = f"{path} has none of {', '.join(FILES.values())}"
        raise FileNotFoundError(msg)
    return merge_by_time(*(_in_order(_iter_jsonl(f, report), report) for f in files))


def _iter_jsonl(path: Path, report: ReadReport) -> Iterator[Event]:
    with _open_binary(path) as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield decode_line(line)
            except InvalidEvent as exc:
                report.invalid_line(f"{path.name}:{number}", str(exc))


def _iter_records_csv(path: Path, report: ReadReport) -> Iterator[Event]:
    with _open_text(path) as fh:
        rows = csv.reader(fh)
        columns = _record_columns(next(rows, []))
        for number, row in enumerate(rows, 2):
            if not row or row[0].startswith("#"):
                continue
            try:
                body = _record(columns, row)
                yield _decode_body(body, json.dumps(body).encode())
            except InvalidEvent as exc:
                report.invalid_line(f"{path.name}:{number}", str(exc))


def _record_columns(header: list[str]) -> tuple[str, ...]:
    names = tuple(h.strip().lower() for h in header)
    unknown = sorted(set(names) - _RECORD_FIELDS)
    if unknown or len(set(names)) != len(names):
        what = f"unknown column(s) {', '.join(unknown)}" if unknown else "a column twice"
        msg = (f"CSV header {header} names {what}; a CSV of records has columns named "
               f"after the contract's fields: {', '.join(sorted(_RECORD_FIELDS))}")
        raise ValueError(msg)
    return names


def _record(columns: tuple[str, ...], row: list[str]) -> dict[str, Any]:
    """The contract body of one CSV row: empty cells left out, integers parsed."""
    if len(row) > len(columns):
        msg = "more fields than the header names"
        raise InvalidEvent(msg)
    body: dict[str, Any] = {"v": 1}
    for name, cell in zip(columns, row, strict=False):
        if name in _INT_FIELDS and cell.strip():
            body[name] = _integer(cell.strip(), name)
        elif cell:
            body[name] = cell
    if body.get("op") == "upsert" and "name" in columns:
        body.setdefault("name", "")  # a profile's name may be empty
    return body


def _iter_csv(path: Path, report: ReadReport, times: EdgeTimes,
              offset: int) -> Iterator[Event]:
    with _open_text(path) as fh:
        rows = csv.reader(fh)
        columns: tuple[str, ...] = _CSV_HEADER
        kept = 0
        for number, row in enumerate(rows, 1):
            if number == 1 and row and not row[0].strip().lstrip("-").isdigit():
                columns = _csv_columns(row)
                continue
            if not row or row[0].startswith("#"):
                continue
            at = times.start_ms + kept * times.step_ms
            event = _edge(dict(zip(columns, row, strict=False)), at,
                          f"{path.name}:{number}", report, len(row) > len(columns), offset)
            if event is not None:
                kept += 1
                yield event


def _iter_edges(path: Path, report: ReadReport, times: EdgeTimes,
                offset: int) -> Iterator[Event]:
    start, step, kept = times.start_ms, times.step_ms, 0
    with _open_text(path) as fh:
        for number, line in enumerate(fh, 1):
            parts = line.split()
            edge = _fast_edge(parts, offset)
            if edge is None:
                if parts and not parts[0].startswith("#"):
                    report.invalid_line(f"{path.name}:{number}", _edge_problem(parts, offset))
            elif edge[0] == edge[1]:
                report.skip("self-loop", f"{path.name}:{number}")
            else:
                yield Follow(edge[0], edge[1], start + kept * step)
                kept += 1


# -- helpers ---------------------------------------------------------------------------


def _fast_edge(parts: list[str], offset: int) -> tuple[int, int] | None:
    """The (follower, followee) of a well-formed line, else None (the hot path)."""
    if len(parts) != 2:
        return None
    try:
        follower, followee = int(parts[0]) + offset, int(parts[1]) + offset
    except ValueError:
        return None
    if 0 < follower <= MAX_ID and 0 < followee <= MAX_ID:
        return follower, followee
    return None


def _edge_problem(parts: list[str], offset: int) -> str:
    """Why ``_fast_edge`` refused a non-comment line."""
    if len(parts) != 2:
        return f"expected 'follower followee', got {len(parts)} fields"
    try:
        _parse_id(parts[0], "follower", offset)
        _parse_id(parts[1], "followee", offset)
    except InvalidEvent as exc:
        return str(exc)
    return "malformed edge"


def _parse_id(text: str, what: str, offset: int) -> int:
    if not text:
        msg = f"missing {what} id"
        raise InvalidEvent(msg)
    value = _integer(text, f"{what} id") + offset
    if not 0 < value <= MAX_ID:
        shifted = f" (with --id-offset {offset})" if offset else ""
        hint = f" ({ZERO_ID_HINT})" if value == 0 and not offset else ""
        msg = f"{what} id {value}{shifted} is not a positive 64-bit id{hint}"
        raise InvalidEvent(msg)
    return value


def _edge(row: dict[str, str], at: int, where: str, report: ReadReport,
          extra: bool, offset: int) -> Follow | None:
    try:
        if extra:
            msg = "more fields than the header names"
            raise InvalidEvent(msg)
        follower = _parse_id(row.get("follower_id", "").strip(), "follower", offset)
        followee = _parse_id(row.get("followee_id", "").strip(), "followee", offset)
        at = _csv_time(row.get("created_at"), at)
    except InvalidEvent as exc:
        report.invalid_line(where, str(exc))
        return None
    if follower == followee:
        report.skip("self-loop", where)
        return None
    return Follow(follower, followee, at)


def _csv_time(text: str | None, default: int) -> int:
    if text is None or not text.strip():
        return default
    return _bounded_int(text, "created_at", 0, MAX_CREATED_AT, "epoch milliseconds")


def _bounded_int(text: str, label: str, lo: int, hi: int, meaning: str) -> int:
    """An integer field of an edge list, or :class:`InvalidEvent` saying what is wrong."""
    value = _integer(text, label)
    if not lo <= value <= hi:
        msg = f"{label} {value} is not {meaning}"
        raise InvalidEvent(msg)
    return value


def _integer(text: str, label: str) -> int:
    try:
        return int(text)
    except ValueError:
        msg = f"{label} {text[:30]!r} is not an integer"
        raise InvalidEvent(msg) from None


def _csv_columns(header: list[str]) -> tuple[str, ...]:
    names = tuple(h.strip().lower() for h in header)
    missing = {"follower_id", "followee_id"} - set(names)
    if missing:
        msg = (f"CSV header {header} lacks {', '.join(sorted(missing))} (a CSV of edges), "
               "and op (a CSV of records)")
        raise ValueError(msg)
    return names


def _csv_header(path: Path) -> list[str] | None:
    """The first row of a CSV file if it is a header (its first cell is not a number)."""
    with _open_text(path) as fh:
        first = next(csv.reader(fh), [])
    return first if first and not first[0].strip().lstrip("-").isdigit() else None


def _csv_has_records(path: Path) -> bool:
    header = _csv_header(path)
    return header is not None and "op" in (h.strip().lower() for h in header)


def _csv_has_times(path: Path) -> bool:
    header = _csv_header(path)
    if header is not None:
        return "created_at" in _csv_columns(header)
    with _open_text(path) as fh:
        return len(next(csv.reader(fh), [])) >= 3


def _in_order(events: Iterator[Event], report: ReadReport) -> Iterator[Event]:
    last = -1
    for event in events:
        if event.created_at < last:
            report.out_of_order += 1
        last = max(last, event.created_at)
        yield event


def _open_binary(path: Path) -> BinaryIO:
    if path.suffix == ".gz" or _is_gzip(path):
        return cast(BinaryIO, gzip.open(path, "rb"))
    return path.open("rb")


def _open_text(path: Path) -> IO[str]:
    # newline="" lets csv see the line endings; split() ignores them for edge lists.
    return io.TextIOWrapper(_open_binary(path), encoding="utf-8", newline="")


def _is_gzip(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def _suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    return suffixes[-1] if suffixes else ""


def _time_key(event: Event) -> tuple[int, int]:
    return event.created_at, TOPIC_RANK[event.topic]
