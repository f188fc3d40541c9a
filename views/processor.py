"""The ``transformWithStateInPandas`` processor: moves rows between Spark and the join.

All decisions live in :mod:`views.join`; this module only turns the source's typed
rows into :class:`~views.join.Change` objects, loads and stores the per-author state
(one binary value per key, see :mod:`views.codec`), and yields the join's deltas as a
pandas frame with the :data:`~views.delta.DELTA_DDL` schema. Invalid records (kind 0,
grouped under key 0) become dead-letter deltas; every key also reports the highest
offset it saw per partition, which the sink records as applied.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    ValueState,
)
from pyspark.sql.types import BinaryType, StructField, StructType

from views.codec import decode_state, encode_state
from views.delta import DELTA_FIELDS, Delta, DeltaKind
from views.join import Change, JoinConfig, apply_batch
from views.kinds import Kind, to_event

log = logging.getLogger(__name__)

STATE_SCHEMA = StructType([StructField("blob", BinaryType(), False)])
_COLUMNS = ("topic", "partition", "offset", "kind", "key", "created_at", "tweet_id",
            "other_id", "text", "name", "error", "raw")


def read_rows(frames: Iterator[pd.DataFrame]) -> tuple[list[Change], list[Delta]]:
    """Split a key's input rows into join changes and bookkeeping deltas."""
    changes: list[Change] = []
    dead: list[Delta] = []
    marks: dict[tuple[str, int], tuple[int, int]] = {}
    for frame in frames:
        cols: list[list[Any]] = [frame[c].tolist() for c in _COLUMNS]
        for topic, part, off, kind, key, at, tweet, other, text, name, err, raw in zip(
                *cols, strict=True):
            seen = marks.get((topic, part), (-1, 0))
            marks[(topic, part)] = (max(seen[0], off), max(seen[1], at))
            if kind == Kind.INVALID:
                dead.append(Delta(DeltaKind.DEAD, text=err, topic=topic, partition=part,
                                  offset=off, raw=raw))
            else:
                changes.append(Change(to_event(kind, key, at, tweet, other, text, name), off))
    offsets = [Delta(DeltaKind.OFFSET, created_at=at, topic=t, partition=p, offset=o)
               for (t, p), (o, at) in marks.items()]
    return changes, dead + offsets


class JoinProcessor(StatefulProcessor):
    """Per-author state in Spark; the join logic in :func:`views.join.apply_batch`."""

    def __init__(self, config: JoinConfig) -> None:
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state: ValueState = handle.getValueState("author", STATE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        changes, deltas = read_rows(rows)
        if changes:
            join_key = int(key[0])
            stored = self.state.get() if self.state.exists() else None
            before = decode_state(stored[0]) if stored else None
            after, out = apply_batch(before, join_key, changes, self.config)
            self.state.update((encode_state(after),))
            deltas += out
        if deltas:
            yield pd.DataFrame.from_records(deltas, columns=DELTA_FIELDS)

    def close(self) -> None:
        pass
