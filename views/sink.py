"""The ``foreachBatch`` sink: one micro-batch of deltas into the store, once.

It runs exactly one action on the batch (``toArrow``), so the stateful step above it
is computed once (DESIGN §10), then hands the deltas to :meth:`Store.apply`, which
writes them in one transaction. If the job dies after the store commits but before
Spark records the batch, Spark replays the same batch with the same state and the
store's keyed upserts make the second write a no-op.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from views.delta import DELTA_FIELDS, Delta
from views.stores.base import BatchStats, Store

log = logging.getLogger(__name__)


def deltas_from_arrow(table: pa.Table) -> list[Delta]:
    """Rows of a delta table as :class:`Delta` tuples (column-wise, no per-row dicts)."""
    if table.num_rows == 0:
        return []
    columns = [table.column(name).to_pylist() for name in DELTA_FIELDS]
    return [Delta(*row) for row in zip(*columns, strict=True)]


@dataclass
class Sink:
    """Callable for ``foreachBatch``; keeps per-batch figures for progress and metrics."""

    store: Store
    on_batch: Callable[[BatchStats, float], None] | None = None
    history: list[tuple[int, float, BatchStats]] = field(default_factory=list)

    def __call__(self, frame: Any, batch_id: int) -> None:
        start = time.perf_counter()
        deltas = deltas_from_arrow(frame.toArrow())
        stats = self.store.apply(deltas, batch_id)
        total = time.perf_counter() - start
        self.history.append((batch_id, total, stats))
        log.info("batch %d: %d deltas (%d timeline adds, %d removes, %d dead) in %.2fs "
                 "(store %.2fs)", batch_id, stats.deltas, stats.timeline_adds,
                 stats.timeline_removes, stats.dead_letters, total, stats.seconds)
        if self.on_batch is not None:
            self.on_batch(stats, total)
