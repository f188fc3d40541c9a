"""The join driven in-process, without Spark: group by key, apply, write to a store.

Does exactly what the Spark job does per micro-batch — group the batch's events by
join key, run :func:`views.join.apply_batch` per key with that key's state, apply
all deltas to the store in one step — with the state in a dict. Tests and
benchmarks use it to build views quickly; it is also the reference for what one
micro-batch means.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ingest.events import Event
from views.join import AuthorState, Change, JoinConfig, apply_batch
from views.stores.base import BatchStats, Store


class LocalJoin:
    """Per-key state in memory; one :meth:`run` call is one micro-batch."""

    def __init__(self, config: JoinConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self.states: dict[int, AuthorState] = {}
        self.offset = 0
        self.batch_id = 0

    def run(self, batch: Iterable[Event]) -> BatchStats:
        by_key: dict[int, list[Change]] = defaultdict(list)
        for event in batch:
            by_key[event.key].append(Change.of(event, self.offset))
            self.offset += 1
        deltas = []
        for key, changes in by_key.items():
            state, out = apply_batch(self.states.get(key), key, changes, self.config)
            self.states[key] = state
            deltas += out
        stats = self.store.apply(deltas, self.batch_id)
        self.batch_id += 1
        return stats
