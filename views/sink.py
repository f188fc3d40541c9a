"""The ``foreachBatch`` sink: one micro-batch of deltas into the store, exactly once in effect.

Each call runs exactly one action on the batch (``toArrow``), so the stateful step
above it is computed once (DESIGN §10), then hands the deltas to
:meth:`~views.stores.contract.ViewWriter.apply`, which writes them in one transaction.

:class:`Sink` applies before returning. :class:`SpoolingSink` (what the job uses)
overlaps the store write with Spark's next micro-batch: it writes the batch's deltas
to a spool file (Arrow IPC, written aside then renamed into place), queues them for a
writer thread, and returns; Spark then commits the batch and plans the next one while
the writer applies this one. Why nothing is lost or applied twice in effect:

- Spark commits batch N only after the call returns, i.e. after N's spool file
  exists. A crash before that makes Spark run N again, with the same state and offsets
  (so the same deltas).
- A spool file is deleted only after the store committed its batch. On start,
  :meth:`SpoolingSink.recover` applies every spool file left behind, in batch order,
  before the query runs: a batch Spark committed but the store never saw is applied.
- Store writes are keyed upserts and deletes, so applying a batch twice (recovered,
  then run again by Spark) leaves the store as once.

The queue is bounded (``max_pending``): when the store falls behind, the call blocks,
which slows Spark down instead of piling batches up in memory. A failed store write
stops the query at the next call, with the error. Spool files are flushed but not
fsynced by default: they survive a killed process, not a lost machine
(``fsync=True`` for that).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from views.delta import DELTA_COLUMNS, DELTA_FIELDS, Delta, unpack_deltas
from views.errors import StoreError
from views.row import arrow_schema
from views.stores.contract import BatchStats, ViewWriter

log = logging.getLogger(__name__)

OnBatch = Callable[[BatchStats, float], None]


def deltas_from_arrow(table: pa.Table) -> list[Delta]:
    """The deltas of a table of packed deltas (what the job emits) or of delta rows.

    Delta rows are read column-wise (no per-row dicts); spool files written before
    the join packed its output hold them.
    """
    if table.num_rows == 0:
        return []
    if "deltas" in table.column_names:  # views.delta.PACKED_DELTA_COLUMNS
        return [d for blob in table.column("deltas").to_pylist() for d in unpack_deltas(blob)]
    columns = [table.column(name).to_pylist() for name in DELTA_FIELDS]
    return [Delta(*row) for row in zip(*columns, strict=True)]


def deltas_table(deltas: Iterable[Delta]) -> pa.Table:
    """Deltas as delta rows (``DELTA_COLUMNS``): what :func:`deltas_from_arrow` reads back."""
    rows = list(deltas)
    return pa.table({f.name: [getattr(d, f.name) for d in rows] for f in DELTA_COLUMNS},
                    schema=arrow_schema(DELTA_COLUMNS))


def unpacked_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``: packed deltas in, one delta row each out (``DELTA_DDL``).

    For the executor sink, which routes single deltas through Spark's shuffle.
    """
    schema = arrow_schema(DELTA_COLUMNS)
    for batch in batches:
        deltas = deltas_from_arrow(pa.Table.from_batches([batch]))
        if deltas:
            columns = list(zip(*deltas, strict=True))
            yield pa.RecordBatch.from_arrays(
                [pa.array(col, type=field.type) for col, field in zip(columns, schema, strict=True)],
                schema=schema)


@dataclass
class Sink:
    """Callable for ``foreachBatch`` that applies before returning."""

    store: ViewWriter
    on_batch: OnBatch | None = None
    #: The most recent batches (bounded: the job runs for days).
    history: deque[tuple[int, float, BatchStats]] = field(
        default_factory=lambda: deque(maxlen=10_000))

    def __call__(self, frame: Any, batch_id: int) -> None:
        start = time.perf_counter()
        self._apply(frame.toArrow(), batch_id, start)

    def _apply(self, table: pa.Table, batch_id: int, start: float) -> BatchStats:
        stats = self.store.apply(deltas_from_arrow(table), batch_id)
        total = time.perf_counter() - start
        self.history.append((batch_id, total, stats))
        log.info("batch %d: %d deltas (%d timeline adds, %d removes, %d dead) in %.2fs "
                 "(store %.2fs)", batch_id, stats.deltas, stats.timeline_adds,
                 stats.timeline_removes, stats.dead_letters, total, stats.seconds)
        if self.on_batch is not None:
            self.on_batch(stats, total)
        return stats

    def close(self) -> None:
        """Nothing pending in the synchronous sink."""


class SpoolingSink(Sink):
    """Spool, queue and return; a writer thread applies (see the module docstring)."""

    def __init__(self, store: ViewWriter, spool_dir: Path, *, max_pending: int = 1,
                 fsync: bool = False, on_batch: OnBatch | None = None) -> None:
        super().__init__(store, on_batch)
        self.spool_dir = spool_dir
        self.fsync = fsync
        self._queue: queue.Queue[tuple[int, pa.Table, Path, float] | None] = queue.Queue(
            max_pending)
        self._failure: BaseException | None = None
        self._writer: threading.Thread | None = None

    def recover(self) -> int:
        """Apply spool files left by an earlier run, oldest batch first; return how many."""
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        for partial in self.spool_dir.glob("*.partial"):
            partial.unlink()  # never returned to Spark: it runs that batch again
        files = sorted(self.spool_dir.glob("batch-*.arrow"))
        for path in files:
            batch_id = int(path.stem.removeprefix("batch-"))
            with ipc.open_file(path) as reader:
                table = reader.read_all()
            log.info("recovering spooled batch %d (%d rows)", batch_id, table.num_rows)
            self._apply(table, batch_id, time.perf_counter())
            path.unlink()
        return len(files)

    def __call__(self, frame: Any, batch_id: int) -> None:
        self._raise_if_failed()
        start = time.perf_counter()
        table = frame.toArrow()
        path = self._spool(table, batch_id)
        self._start_writer()
        while True:  # blocks while the store is behind, but notices a dead writer
            try:
                self._queue.put((batch_id, table, path, start), timeout=1.0)
                return
            except queue.Full:
                self._raise_if_failed()

    def close(self) -> None:
        """Apply what is queued, then stop the writer (what it could not apply stays spooled)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            while writer.is_alive():
                try:
                    self._queue.put(None, timeout=1.0)
                    break
                except queue.Full:
                    continue
            writer.join()
        self._raise_if_failed()

    def _spool(self, table: pa.Table, batch_id: int) -> Path:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        path = self.spool_dir / f"batch-{batch_id:012d}.arrow"
        partial = path.with_suffix(".partial")
        with pa.OSFile(str(partial), "wb") as out, ipc.new_file(out, table.schema) as writer:
            writer.write_table(table)
        if self.fsync:
            with open(partial, "rb+") as handle:
                os.fsync(handle.fileno())
        partial.replace(path)
        return path

    def _start_writer(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="fanout-sink",
                                            daemon=True)
            self._writer.start()

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            batch_id, table, path, start = item
            try:
                self._apply(table, batch_id, start)
                path.unlink(missing_ok=True)
            except BaseException as exc:
                log.exception("store write of batch %d failed; the query stops", batch_id)
                self._failure = exc
                return

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            msg = f"the store write of an earlier batch failed: {self._failure}"
            raise StoreError(msg) from self._failure
