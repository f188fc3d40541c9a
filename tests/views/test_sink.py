"""The spooling sink: overlap without loss — recovery, idempotence, failure."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from ingest.events import Follow, Post
from serving.timeline import home_top
from views.delta import DELTA_COLUMNS, DELTA_FIELDS, Delta
from views.errors import StoreError
from views.join import JoinConfig
from views.local import LocalJoin
from views.row import arrow_schema
from views.sink import SpoolingSink, deltas_from_arrow
from views.stores.contract import Store
from views.stores.rows import Entry, Relations, TweetRow, UserRow
from views.stores.sqlite import SQLiteStore

#: The delta row's Arrow schema, as Spark hands it to foreachBatch.
_SCHEMA = arrow_schema(DELTA_COLUMNS)


class Frame:
    """What foreachBatch hands the sink, as far as the sink uses it."""

    def __init__(self, deltas: list[Delta]) -> None:
        self.deltas = deltas

    def toArrow(self) -> pa.Table:  # noqa: N802 (Spark's name)
        return pa.table({f: [getattr(d, f) for d in self.deltas] for f in DELTA_FIELDS},
                        schema=_SCHEMA)


class Recorder(LocalJoin):
    """Runs the pure join and keeps each batch's deltas instead of applying them."""

    def __init__(self) -> None:
        super().__init__(JoinConfig(cap=5, promote_at=50, demote_below=40),
                         SQLiteStore(":memory:").open())
        self.batches: list[list[Delta]] = []
        self.store.apply = self._keep  # type: ignore[method-assign]

    def _keep(self, deltas, batch_id=-1):
        self.batches.append(list(deltas))


def _batches() -> list[list[Delta]]:
    recorder = Recorder()
    recorder.run([Follow(2, 1, 1), Follow(3, 1, 1), Post(10, 1, 2, "a")])
    recorder.run([Post(11, 1, 3, "b"), Follow(2, 1, 4, active=False)])
    recorder.run([Post(12, 1, 5, "c"), Follow(4, 1, 6)])
    return recorder.batches


def _timelines(store: Store) -> dict[int, list[int]]:
    return {u: [e.tweet_id for e in home_top(store, u, 10)] for u in (2, 3, 4)}


def _store(tmp_path: Path, name: str) -> SQLiteStore:
    return SQLiteStore(tmp_path / f"{name}.sqlite", cap=5).open()


def test_batches_apply_in_order_and_close_drains(tmp_path):
    store = _store(tmp_path, "a")
    sink = SpoolingSink(store, tmp_path / "spool")
    for i, deltas in enumerate(_batches()):
        sink(Frame(deltas), i)
    sink.close()
    assert _timelines(store) == {2: [], 3: [12, 11, 10], 4: [12, 11, 10]}
    assert [b for b, _, _ in sink.history] == [0, 1, 2]
    assert not list((tmp_path / "spool").iterdir())


def test_a_batch_spooled_but_never_applied_is_recovered_in_order(tmp_path):
    batches = _batches()
    crashed = SpoolingSink(_store(tmp_path, "a"), tmp_path / "spool")
    store = crashed.store
    store.apply(batches[0], 0)
    crashed._spool(Frame(batches[1]).toArrow(), 1)  # spooled; the process died here
    crashed._spool(Frame(batches[2]).toArrow(), 2)
    restarted = SpoolingSink(store, tmp_path / "spool")
    assert restarted.recover() == 2
    assert _timelines(store) == {2: [], 3: [12, 11, 10], 4: [12, 11, 10]}
    assert not list((tmp_path / "spool").iterdir())


def test_a_recovered_batch_that_spark_runs_again_changes_nothing(tmp_path):
    batches = _batches()
    once, twice = _store(tmp_path, "once"), _store(tmp_path, "twice")
    for i, deltas in enumerate(batches):
        once.apply(deltas, i)
        twice.apply(deltas, i)
        if i == 1:
            twice.apply(deltas, i)  # recovered from the spool, then replayed by Spark
    assert _timelines(once) == _timelines(twice)
    assert once.tweets([10, 11, 12]) == twice.tweets([10, 11, 12])


class Failing(SQLiteStore):
    def _write(self, plan, batch_id):
        if batch_id == 1:
            raise OSError("disk full")
        super()._write(plan, batch_id)


def test_a_failed_store_write_stops_the_query_and_keeps_the_batch(tmp_path):
    store = Failing(tmp_path / "f.sqlite", cap=5).open()
    sink = SpoolingSink(store, tmp_path / "spool")
    batches = _batches()
    sink(Frame(batches[0]), 0)
    sink(Frame(batches[1]), 1)
    with pytest.raises(StoreError, match="disk full"):
        for _ in range(50):  # the failure surfaces at a later call (bounded)
            sink(Frame(batches[2]), 2)
    with pytest.raises(StoreError):
        sink.close()
    assert sorted(p.name for p in (tmp_path / "spool").iterdir())[0] == "batch-000000000001.arrow"


def test_delta_kinds_survive_the_spool(tmp_path):
    deltas = [Delta.dead_letter("tweets", 1, 7, "bad", b"\x00\xff"),
              Delta.source_offset("tweets", 1, 7, 5)]
    store = _store(tmp_path, "d")
    sink = SpoolingSink(store, tmp_path / "spool")
    sink._spool(Frame(deltas).toArrow(), 0)
    assert sink.recover() == 1
    (letter,) = store.dead_letters()
    assert (letter.topic, letter.partition, letter.offset, letter.raw) == ("tweets", 1, 7,
                                                                           b"\x00\xff")
    assert store.applied_offsets() == {("tweets", 1): 7}


def test_reposts_replies_relations_and_deleted_accounts_survive_the_spool(tmp_path):
    deltas = [Delta.tweet(10, 1, 5, "re", reply_to=2), Delta.tweet(2**62, 2, 6, "big"),
              Delta.repost(11, 3, 7, (2**62, 2), True),
              Delta.relation(4, 1, "block", True, 8), Delta.relation(4, 2, "mute", True, 8),
              Delta.profile(5, 1, "h", "n"), Delta.account_deleted(5, 9)]
    store = _store(tmp_path, "k")
    sink = SpoolingSink(store, tmp_path / "spool")
    path = sink._spool(Frame(deltas).toArrow(), 0)
    with ipc.open_file(path) as reader:
        assert deltas_from_arrow(reader.read_all()) == deltas
    assert sink.recover() == 1
    assert store.tweets([10, 11]) == {10: TweetRow(10, 1, 5, "re", False, reply_to=2),
                                      11: TweetRow(11, 3, 7, "", False, 0, 2**62, 2)}
    assert store.reposts_of([2**62]) == {2**62: [Entry(7, 11, 3)]}
    assert store.relations(4) == Relations(frozenset({1}), frozenset({2}))
    assert store.relations(1) == Relations(frozenset({4}))
    assert store.users([5]) == {5: UserRow(5, "", "", True)}
