"""The ``fanout-kafka`` Spark streaming source: changelog records as typed rows.

This module owns the project's Python streaming data source, built on
confluent-kafka when no Spark Kafka connector jar could be had (DESIGN §5); Spark's
own connector (:mod:`views.connector`) is the other source the job can read with, and
it decodes records with this module's :func:`event_row`. The source reads each partition with
``assign()`` at explicit offsets (no consumer group, nothing committed); the offsets
live in Spark's checkpoint as ``{"<physical topic>:<partition>": next_offset}``,
serialized with sorted keys because Spark compares offsets as JSON text.

Every record becomes exactly one row of :data:`SOURCE_SCHEMA` through the pure
function :func:`event_row`: a valid event gets its :class:`~ingest.events.Kind` and
fields, anything else (a tombstone, bad JSON, a wrong key, a contract violation) a
``Kind.INVALID`` row with the reason and the raw bytes, for the dead-letter table.
The row's columns, and the schemas here, come from :mod:`views.row`.

``read()`` yields Arrow batches whose schema is exactly Spark's Arrow schema of
:data:`SOURCE_SCHEMA` (Spark rejects any other). The end of each partition is Kafka's
ListOffsets answer (:class:`~views.kafka_offsets.EndOffsets`), which is exact.

Planning (``latestOffset``, and the first ``partitions`` after a restart) retries an
unreachable broker with backoff for ``brokerRetrySeconds``, and refuses to go on when
the topics end before the offsets already read (:class:`~views.errors.OffsetsPastEnd`,
whose message says how to recover: ``fanout rebuild``).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import pyarrow as pa
from confluent_kafka import Consumer, Message, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ingest.errors import InvalidEvent
from ingest.events import decode_flat
from ingest.settings import KafkaSettings
from views.errors import OffsetsPastEnd
from views.kafka_offsets import TP, EndOffsets, KafkaReadError, consumer_config, retrying
from views.row import (
    NO_EVENT,
    SOURCE_COLUMNS,
    Row,
    arrow_schema,
    ddl,
    struct_type,
)

log = logging.getLogger(__name__)

FORMAT: Final = "fanout-kafka"
#: Raw bytes kept for a dead letter; longer values are cut here.
MAX_RAW: Final = 64 * 1024

SOURCE_DDL: Final = ddl(SOURCE_COLUMNS)
SOURCE_SCHEMA: Final = struct_type(SOURCE_COLUMNS)
#: Spark's Arrow schema of SOURCE_SCHEMA, which read() batches must match exactly.
ARROW_SCHEMA: Final = arrow_schema(SOURCE_COLUMNS)

_T = TypeVar("_T")

#: Consumer settings for bulk reads of a known range.
_READ_CONF: Final = {"fetch.wait.max.ms": 50, "max.partition.fetch.bytes": 8 * 1024 * 1024,
                     "queued.min.messages": 200_000}


# --- rows ------------------------------------------------------------------------------

def event_row(topic: str, partition: int, offset: int, key: bytes | None,
              value: bytes | None) -> Row:
    """The source row of one record of logical ``topic``; never raises."""
    try:
        flat = decode_flat(topic, key, value)
    except InvalidEvent as exc:
        return _invalid_row(topic, partition, offset, value, str(exc))
    except Exception as exc:  # a record must never stop the job, whatever it holds
        return _invalid_row(topic, partition, offset, value,
                            f"undecodable record ({type(exc).__name__}: {exc})")
    return (topic, partition, offset, *flat, None, None)


def _invalid_row(topic: str, partition: int, offset: int, value: bytes | None,
                 reason: str) -> Row:
    raw = None if value is None else bytes(value[:MAX_RAW])
    return (topic, partition, offset, *NO_EVENT, reason or "invalid record", raw)


def rows_to_batch(rows: list[Row]) -> pa.RecordBatch:
    """Arrow batch of ``rows`` with exactly :data:`ARROW_SCHEMA`."""
    # One list comprehension per column: several times faster than zip(*rows).
    arrays = [pa.array([row[i] for row in rows], type=field.type)
              for i, field in enumerate(ARROW_SCHEMA)]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


# --- options and offsets --------------------------------------------------------------

@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed from Spark's string map (keys case-insensitive).

    ``partitions`` 0 means discover them from metadata; ``max_records_per_batch`` 0
    means no limit; ``read_timeout`` bounds how long ``read()`` waits without progress;
    ``broker_retry`` how long planning keeps retrying an unreachable broker.
    """

    bootstrap: str
    topic_prefix: str = ""
    partitions: int = 0
    max_records_per_batch: int = 0
    starting_offsets: str = "earliest"
    read_timeout: float = 60.0
    batch_rows: int = 10_000
    broker_retry: float = 120.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Build from the options given to ``spark.readStream.format(...)``."""
        given = {k.lower(): v for k, v in options.items()}
        if not given.get("bootstrap"):
            msg = f"option 'bootstrap' (host:port of the broker) is required by {FORMAT}"
            raise ValueError(msg)
        parsed = cls(
            bootstrap=given["bootstrap"],
            topic_prefix=given.get("topic_prefix", ""),
            partitions=int(given.get("partitions", 0)),
            max_records_per_batch=int(given.get("maxrecordsperbatch", 0)),
            starting_offsets=given.get("startingoffsets", "earliest").lower(),
            read_timeout=float(given.get("readtimeoutseconds", 60.0)),
            batch_rows=int(given.get("arrowbatchrows", 10_000)),
            broker_retry=float(given.get("brokerretryseconds", 120.0)),
        )
        parsed.validate()
        return parsed

    def validate(self) -> None:
        """Raise ValueError on an option out of range."""
        if self.starting_offsets not in ("earliest", "latest"):
            msg = f"startingOffsets must be earliest or latest, got {self.starting_offsets!r}"
            raise ValueError(msg)
        if min(self.partitions, self.max_records_per_batch) < 0 or self.batch_rows < 1:
            msg = f"partitions/maxRecordsPerBatch must be ≥ 0 and batch rows ≥ 1: {self!r}"
            raise ValueError(msg)
        if self.broker_retry < 0:
            msg = f"brokerRetrySeconds must be ≥ 0, got {self.broker_retry}"
            raise ValueError(msg)

    def settings(self) -> KafkaSettings:
        """The topic layout these options name."""
        return KafkaSettings(bootstrap=self.bootstrap, topic_prefix=self.topic_prefix)


def offset_key(tp: TP) -> str:
    """The checkpoint key of a partition: ``"<topic>:<partition>"``."""
    return f"{tp[0]}:{tp[1]}"


def parse_key(key: str) -> TP:
    """Inverse of :func:`offset_key`."""
    topic, partition = key.rsplit(":", 1)
    return topic, int(partition)


def encode_offsets(offsets: Mapping[str, int]) -> dict[str, int]:
    """``offsets`` with keys in sorted order: Spark compares offsets as JSON text."""
    return {key: int(offsets[key]) for key in sorted(offsets)}


def fair_share(available: Mapping[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` rows over partitions with ``available`` rows, max-min fairly.

    Partitions with little data take all of it; the rest is spread evenly over the
    others, so a busy partition cannot starve a quiet one. Deterministic.
    """
    share = {key: 0 for key in available}
    pending = sorted((n, key) for key, n in available.items() if n > 0)
    left = budget
    for i, (n, key) in enumerate(pending):
        take = min(n, math.ceil(left / (len(pending) - i)))
        share[key] = take
        left -= take
    return share


# --- Spark source ---------------------------------------------------------------------

@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """The records [start, end) of one partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


class KafkaSource(DataSource):
    """``spark.readStream.format("fanout-kafka")``: the three changelogs as rows."""

    @classmethod
    def name(cls) -> str:
        """The format name given to ``readStream.format``."""
        return FORMAT

    def schema(self) -> StructType:
        """Always :data:`SOURCE_SCHEMA`."""
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        """A reader for this query; no I/O until Spark asks for offsets."""
        if schema != SOURCE_SCHEMA:
            msg = f"{FORMAT} has a fixed schema; do not pass one (got {schema.simpleString()})"
            raise ValueError(msg)
        return KafkaStreamReader(SourceOptions.parse(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over per-partition offset ranges and reads them.

    One instance lives in the driver's source process for the whole query (so it
    caches end offsets); copies are pickled to the tasks that call :meth:`read`.
    Planning retries an unreachable broker with backoff for ``broker_retry`` seconds,
    then fails the query (:func:`~views.kafka_offsets.retrying`). It also refuses to
    go on from offsets the topics no longer reach (:class:`~views.errors.OffsetsPastEnd`):
    records the views were built from are gone, so resuming would silently skip or
    misapply whatever the topics hold now.
    """

    def __init__(self, options: SourceOptions) -> None:
        _log_to_stderr()
        self.options = options
        # Each broker call is bounded so that retries fit the budget.
        timeout = min(10.0, max(1.0, options.broker_retry / 4))
        self._offsets = EndOffsets(options.bootstrap, timeout=timeout)
        self._target: dict[str, int] | None = None
        self._latest: dict[str, int] | None = None
        self._checked = False

    def initialOffset(self) -> dict[str, int]:
        """Where a new query starts: each partition's earliest (or end) offset."""
        tps = self._topic_partitions()
        if self.options.starting_offsets == "latest":
            return self._ends(tps)
        earliest = self._broker("listing the earliest offsets",
                                lambda: self._offsets.earliest(tps))
        return encode_offsets({offset_key(tp): n for tp, n in earliest.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        """ReadMaxRows(maxRecordsPerBatch) when that option is set."""
        if self.options.max_records_per_batch > 0:
            return ReadMaxRows(self.options.max_records_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target: the query ends at today's ends, whatever comes later."""
        self._target = self._ends(self._topic_partitions())

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """End of the next micro-batch: the partitions' ends, cut fairly to ``limit``."""
        ends = self._target if self._target is not None else self._ends(self._topic_partitions())
        begin = self._positions(start, ends.keys())
        self._check_reachable(begin, ends)
        available = {key: max(0, ends[key] - begin[key]) for key in ends}
        if isinstance(limit, ReadMaxRows):
            available = fair_share(available, limit.max_rows)
        return encode_offsets({key: begin[key] + n for key, n in available.items()})

    def reportLatestOffset(self) -> dict[str, int] | None:
        """The ends found last (for the query's progress report); no I/O."""
        return self._latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[KafkaRange]:
        """One task per partition with records in [start, end)."""
        begin = self._positions(start, end.keys())
        if not self._checked:
            # After a restart Spark replays a batch planned before it from its offset
            # log, without asking latestOffset: check that its records still exist.
            self._check_reachable(end, self._ends(map(parse_key, end)))
        return [KafkaRange(*parse_key(key), begin[key], end[key])
                for key in sorted(end) if end[key] > begin[key]]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Arrow batches of one :class:`KafkaRange` (runs in a Spark task)."""
        if not isinstance(partition, KafkaRange):
            msg = f"{FORMAT} cannot read partition {partition!r}"
            raise TypeError(msg)
        return read_range(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        """Drop the admin client (a fresh, unconnected EndOffsets)."""
        self._offsets = EndOffsets(self.options.bootstrap, timeout=self._offsets.timeout)

    def _topic_partitions(self) -> list[TP]:
        topics = self.options.settings().physical_topics()
        if self.options.partitions > 0:
            return [(t, p) for t in topics for p in range(self.options.partitions)]
        return self._broker("listing the topics' partitions",
                            lambda: self._offsets.topic_partitions(topics))

    def _ends(self, tps: Iterable[TP]) -> dict[str, int]:
        tps = list(tps)
        found = self._broker("finding the end offsets", lambda: self._offsets.ends(tps))
        ends = encode_offsets({offset_key(tp): n for tp, n in found.items()})
        self._latest = ends
        return ends

    def _positions(self, start: Mapping[str, int], keys: Iterable[str]) -> dict[str, int]:
        """Start offset of each key; partitions new since ``start`` begin at earliest."""
        keys = list(keys)
        new = [parse_key(k) for k in keys if k not in start]
        found = self._broker("listing the earliest offsets", lambda: self._offsets.earliest(new))
        earliest = {offset_key(tp): n for tp, n in found.items()}
        return {key: int(start[key]) if key in start else earliest[key] for key in keys}

    def _broker(self, what: str, call: Callable[[], _T]) -> _T:
        return retrying(call, what=what, bootstrap=self.options.bootstrap,
                        budget=self.options.broker_retry)

    def _check_reachable(self, wanted: Mapping[str, int], ends: Mapping[str, int]) -> None:
        """Raise :class:`OffsetsPastEnd` if a partition ends before ``wanted``.

        Kafka's listed end is exact and never goes back on a living partition, so a
        short one means the records are gone (the topic was deleted and recreated).
        """
        self._checked = True
        gone = {k: (w, ends.get(k, 0)) for k, w in wanted.items() if w > ends.get(k, 0)}
        if gone:
            raise OffsetsPastEnd(past_end_message(self.options.bootstrap, gone))


def past_end_message(bootstrap: str, gone: Mapping[str, tuple[int, int]]) -> str:
    """What happened and how to recover, for ``{partition: (read up to, ends at)}``."""
    shown = ", ".join(f"{key} read up to offset {read} but it now ends at {end}"
                      for key, (read, end) in sorted(gone.items())[:6])
    return (f"the changelog topics on {bootstrap} end before the offsets this view job's "
            f"checkpoint has already read ({shown}): records the views were built from "
            f"are gone. The topics were deleted and recreated, or the broker lost its "
            f"log. The views cannot continue from this checkpoint. To recover: stop the "
            f"job, run `fanout rebuild` (it moves the checkpoint and the store aside), "
            f"start the job again and replay the history into the broker (`fanout "
            f"replay DIR`).")


def _log_to_stderr() -> None:
    """Make this module's warnings readable in the job's log from Spark's source process.

    The reader lives in a Python worker that Spark starts, where logging is not set
    up; its stderr goes to the job's log. A process that set up logging is left alone.
    """
    if logging.getLogger().handlers or log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("views.source", "views.kafka_offsets"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)


# --- reading one range ----------------------------------------------------------------

def read_range(options: SourceOptions, part: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the rows of records [start, end) of one partition."""
    for _, batch in read_ranges(options, [part]):
        yield batch


def read_ranges(options: SourceOptions,
                parts: Sequence[KafkaRange]) -> Iterator[tuple[KafkaRange, pa.RecordBatch]]:
    """Arrow batches of several ranges, read by one consumer, in the order of ``parts``.

    Each range's batches are in offset order and all come before the next range's.

    One consumer fetches from every partition at once: a consumer each (its connection,
    metadata and first fetch) cost a reader of many small ranges most of its time. One
    range's batches come as they are read; several ranges' once all are.
    """
    if len({(p.topic, p.partition) for p in parts}) < len(parts):
        msg = "read_ranges reads a partition once: two ranges name the same one"
        raise ValueError(msg)
    wanted = [p for p in parts if p.end > p.start]
    if not wanted:
        return
    stream = len(wanted) == 1
    rows: dict[tuple[str, int], list[Row]] = {(p.topic, p.partition): [] for p in wanted}
    logical = {p.topic: options.settings().logical(p.topic) for p in wanted}
    consumer = Consumer(consumer_config(options.bootstrap, **_READ_CONF))
    try:
        consumer.assign([TopicPartition(p.topic, p.partition, p.start) for p in wanted])
        for part, records in _records(consumer, wanted, options.read_timeout):
            got = rows[(part.topic, part.partition)]
            got.extend(event_row(logical[part.topic], part.partition, offset, key, value)
                       for offset, key, value in records)
            if stream and len(got) >= options.batch_rows:
                yield part, rows_to_batch(got)
                got.clear()
    finally:
        consumer.close()
    for part in wanted:
        got = rows[(part.topic, part.partition)]
        for i in range(0, len(got), options.batch_rows):
            yield part, rows_to_batch(got[i:i + options.batch_rows])


def _records(consumer: Consumer, parts: Sequence[KafkaRange], idle_timeout: float
             ) -> Iterator[tuple[KafkaRange, list[tuple[int, bytes | None, bytes | None]]]]:
    """Lists of (offset, key, value) of the records in each range's [start, end).

    Each range's come in offset order.

    Offsets may have gaps (compaction), so a range ends at the first offset ≥ end or
    once its position passes end - 1; its partition is paused then. Raises if no record
    arrives for ``idle_timeout`` seconds while some are still expected.
    """
    by_key = {(p.topic, p.partition): p for p in parts}
    position = {key: p.start for key, p in by_key.items()}
    open_ = set(by_key)
    idle_deadline = time.monotonic() + idle_timeout
    while open_:
        batch = consumer.consume(num_messages=10_000, timeout=0.05)
        got: dict[tuple[str, int], list[tuple[int, bytes | None, bytes | None]]] = {}
        for msg in batch:
            key = (msg.topic() or "", msg.partition() or 0)
            offset = msg.offset()
            if key not in open_ or offset is None or msg.error() is not None:
                if msg.error() is not None:
                    _raise_on_error(msg, by_key.get(key, parts[0]))
                continue
            part = by_key[key]
            if position[key] <= offset < part.end:
                got.setdefault(key, []).append((offset, msg.key(), msg.value()))
            position[key] = max(position[key], offset + 1)
            if position[key] >= part.end:
                open_.discard(key)
                consumer.pause([TopicPartition(*key)])
        for key, records in got.items():
            yield by_key[key], records
        if got:
            idle_deadline = time.monotonic() + idle_timeout
        elif open_ and time.monotonic() >= idle_deadline:
            key = min(open_)
            part = by_key[key]
            text = (f"{part.topic}[{part.partition}]: no record for {idle_timeout:.0f} s at "
                    f"offset {position[key]} while reading [{part.start}, {part.end}); were "
                    f"the records deleted, or is the broker down?")
            raise KafkaReadError(text)


def _raise_on_error(msg: Message, part: KafkaRange) -> None:
    error: Any = msg.error()
    if error is None or error.fatal() or msg.topic() is not None:
        text = f"{part.topic}[{part.partition}] reading [{part.start}, {part.end}): {error}"
        raise KafkaReadError(text)
    # Client-level transient errors (a dropped connection) are retried by the client;
    # the idle deadline bounds how long that may take.
