"""Source rows packed per key bucket: how the changelogs cross from the decode to the join.

Spark hands ``transformWithStateInPandas`` its input one row at a time: its serializer
turns every Arrow batch into pandas, walks it with ``itertuples`` and builds a new
frame per group, and the JVM serializes, shuffles and deserializes every row on the
way. Per changelog record that cost more than the join itself (``benchmarks/
RESULTS.md``). So the decode packs instead: each ``mapInArrow`` batch of
source rows becomes one row per key bucket, ``(bucket, rows)``, where ``rows`` is a
:mod:`marshal` blob of that bucket's records already in the join's form
(:class:`~views.join.Change` tuples by key), its dead letters and the highest offset
per partition it saw. The shuffle then moves a few dozen rows per batch, and the
processor unpacks them with one ``marshal.loads`` each (:func:`read_packed`).

The bucket is computed in the JVM before the decode (:func:`bucket_of`), from the
same key the join uses, so it is the bucket the job has always used: for a valid
record the Kafka key is exactly its join key in decimal (``ingest.events``), and a
record whose key is anything else is a dead letter, whichever bucket reports it.

marshal's format (version 4) is the same for every CPython 3 since 3.4, so the
driver, the executors and a cluster's workers read each other's blobs.
"""

from __future__ import annotations

import gc
import marshal
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

from ingest.events import TOPIC_RANK
from views.delta import Delta
from views.join import Change
from views.row import BIGINT, BINARY, Column, Kind, Row, arrow_schema, ddl

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

#: The packed rows: one per key bucket and decoded Arrow batch.
PACKED_COLUMNS: Final = (Column("bucket", BIGINT), Column("rows", BINARY))
PACKED_DDL: Final = ddl(PACKED_COLUMNS)

#: marshal's format version; 4 is what every CPython 3.4+ reads and writes.
_MARSHAL: Final = 4

Mark = tuple[str, int, int, int]  # topic, partition, highest offset, highest event time


_settled = False


def settle_worker() -> None:
    """Once per Python worker: hide what it has loaded from the garbage collector.

    PySpark's daemon runs ``gc.collect()`` after every task of a reused worker; with
    pyspark, pandas and pyarrow loaded that walks ~90k objects, ~50 ms a task, a
    dozen tasks a micro-batch. :func:`gc.freeze` moves the objects alive now (the
    imported modules, before any task's data) out of every later collection.
    """
    global _settled  # noqa: PLW0603 (one flag per worker process)
    if not _settled:
        _settled = True
        gc.freeze()


def bucket_of(key: Any, buckets: int) -> Any:
    """Spark's bucket of a BIGINT join-key column: ``pmod(xxhash64(key), buckets)``."""
    from pyspark.sql import functions as F  # only where Spark runs

    return F.pmod(F.xxhash64(key), F.lit(buckets))


class Packer:
    """Collects source rows by bucket; :meth:`batch` packs and empties it."""

    def __init__(self) -> None:
        self._keyed: dict[int, dict[int, list[tuple]]] = {}
        self._dead: dict[int, list[tuple]] = {}
        self._marks: dict[int, dict[tuple[str, int], list[int]]] = {}

    def add(self, bucket: int, row: Row) -> None:
        """One source row of ``bucket`` (a :data:`views.row.Row` tuple)."""
        topic, partition, offset, kind, key, created_at = row[:6]
        marks = self._marks.get(bucket)
        if marks is None:
            marks = self._marks[bucket] = {}
        seen = marks.get((topic, partition))
        if seen is None:
            marks[(topic, partition)] = [offset, created_at]
        else:
            if offset > seen[0]:
                seen[0] = offset
            if created_at > seen[1]:
                seen[1] = created_at
        if kind == Kind.INVALID:
            self._dead.setdefault(bucket, []).append((topic, partition, offset, row[11], row[12]))
            return
        keyed = self._keyed.get(bucket)
        if keyed is None:
            keyed = self._keyed[bucket] = {}
        # Change's fields: created_at, rank, offset, kind, tweet_id, other_id, ref_id,
        # text, name, partition (views.join.Change); int() drops the IntEnum marshal
        # refuses.
        change = (created_at, TOPIC_RANK[topic], offset, int(kind), *row[6:11], partition)
        found = keyed.get(key)
        if found is None:
            keyed[key] = [change]
        else:
            found.append(change)

    def batch(self) -> pa.RecordBatch:
        """The packed rows of everything added since the last call."""
        import pyarrow as pa  # only where Spark runs

        buckets = sorted(self._marks)
        blobs = [marshal.dumps((self._keyed.get(b, {}), self._dead.get(b, []),
                                [(t, p, o, at) for (t, p), (o, at) in self._marks[b].items()]),
                               _MARSHAL)
                 for b in buckets]
        self._keyed, self._dead, self._marks = {}, {}, {}
        return pa.RecordBatch.from_arrays([pa.array(buckets, pa.int64()),
                                           pa.array(blobs, pa.binary())],
                                          schema=arrow_schema(PACKED_COLUMNS))


def pack_source_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``: source rows with a ``bucket`` column in, packed rows out.

    The project's Python source yields source rows; this packs them as the
    connector's decode does (``views.connector``).
    """
    from views.row import SOURCE_COLUMNS

    settle_worker()
    names = [c.name for c in SOURCE_COLUMNS]
    packer = Packer()
    for batch in batches:
        if batch.num_rows == 0:
            continue
        rows = zip(*(batch.column(n).to_pylist() for n in names), strict=True)
        for bucket, row in zip(batch.column("bucket").to_pylist(), rows, strict=True):
            packer.add(bucket, row)
        yield packer.batch()


def read_packed(frames: Iterable[pd.DataFrame]) -> tuple[dict[int, list[Change]], list[Delta]]:
    """A bucket's packed rows as per-author changes and bookkeeping deltas.

    The deltas are the dead letters and, per partition, the highest offset (and its
    event time) seen, which the sink records as applied.
    """
    changes: dict[int, list[Change]] = {}
    dead: list[Delta] = []
    marks: dict[tuple[str, int], tuple[int, int]] = {}
    make = Change._make
    for frame in frames:
        for blob in frame["rows"].tolist():
            keyed, invalid, seen = marshal.loads(blob)  # noqa: S302 (the decode's own blobs)
            for key, rows in keyed.items():
                found = changes.get(key)
                if found is None:
                    changes[key] = list(map(make, rows))
                else:
                    found.extend(map(make, rows))
            dead += [Delta.dead_letter(*d) for d in invalid]
            for topic, partition, offset, at in seen:
                old = marks.get((topic, partition), (-1, 0))
                marks[(topic, partition)] = (max(old[0], offset), max(old[1], at))
    offsets = [Delta.source_offset(t, p, o, at) for (t, p), (o, at) in marks.items()]
    return changes, dead + offsets
