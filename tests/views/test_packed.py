"""Packed rows: the join sees through them exactly what one row per record gave it.

The decode packs source rows per key bucket (``views.packed``) and the processor
packs its deltas (``views.delta.pack_deltas``); these check that packing loses,
adds and reorders nothing that matters, and that the bucket the JVM computes from a
record's Kafka key is the bucket of its decoded join key.
"""

from __future__ import annotations

import marshal
import random
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.events import TOPIC_RANK, Follow, Post, Relation, UserUpsert, encode, encode_key
from views.delta import Delta, DeltaKind, pack_deltas, unpack_deltas
from views.join import Change
from views.packed import Packer, pack_source_batches, read_packed
from views.row import SOURCE_COLUMNS, Kind, arrow_schema
from views.sink import deltas_from_arrow, unpacked_batches
from views.source import event_row

EVENTS = [Post(tweet_id=10, author_id=1, created_at=5, text="hi"),
          Post(tweet_id=11, author_id=2, created_at=6, text="yo", in_reply_to_user_id=1),
          Follow(follower_id=3, followee_id=1, created_at=4),
          Follow(follower_id=3, followee_id=2, created_at=7, active=False),
          Relation(follower_id=2, followee_id=1, created_at=8, relation="mute"),
          UserUpsert(user_id=1, handle="ada", name="Ada", created_at=1)]


def _records(seed: int, n: int) -> list[tuple[str, int, int, bytes | None, bytes | None]]:
    """``n`` Kafka records (topic, partition, offset, key, value); some are invalid."""
    rng = random.Random(seed)
    out, offsets = [], {}
    for _ in range(n):
        event = rng.choice(EVENTS)
        key, value = encode(event)
        if rng.random() < 0.15:
            key, value = rng.choice([(b"x", value), (key, b"{"), (encode_key(99), value),
                                     (key, None)])
        part = rng.randrange(3)
        off = offsets[(event.topic, part)] = offsets.get((event.topic, part), -1) + 1
        out.append((event.topic, part, off, key, value))
    return out


def _one_row_each(rows: list[tuple]) -> tuple[dict[int, list[Change]], list[Delta]]:
    """What the processor made of one source row per record, before packing."""
    changes: dict[int, list[Change]] = {}
    marks: dict[tuple[str, int], tuple[int, int]] = {}
    dead = []
    for row in rows:
        topic, part, off, kind, key, at = row[:6]
        seen = marks.get((topic, part), (-1, 0))
        marks[(topic, part)] = (max(seen[0], off), max(seen[1], at))
        if kind == Kind.INVALID:
            dead.append(Delta.dead_letter(topic, part, off, row[11], row[12]))
        else:
            changes.setdefault(key, []).append(
                Change(at, TOPIC_RANK[topic], off, kind, *row[6:11], part))
    return changes, dead + [Delta.source_offset(t, p, o, at) for (t, p), (o, at) in marks.items()]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(0, 120), chunks=st.integers(1, 5))
def test_packed_rows_carry_what_one_row_per_record_did(seed: int, n: int, chunks: int) -> None:
    rows = [event_row(*r) for r in _records(seed, n)]
    rng = random.Random(seed)
    blobs = []
    packer = Packer()
    for i, row in enumerate(rows):  # one bucket; flushed at random, as Arrow batches end
        packer.add(7, row)
        if rng.randrange(chunks) == 0 or i == len(rows) - 1:
            batch = packer.batch()
            assert batch.column("bucket").to_pylist() == [7]
            blobs += batch.column("rows").to_pylist()
    got_changes, got_deltas = read_packed([pd.DataFrame({"rows": blobs[:1]}),
                                           pd.DataFrame({"rows": blobs[1:]})])
    want_changes, want_deltas = _one_row_each(rows)
    assert {k: sorted(v) for k, v in got_changes.items()} == \
           {k: sorted(v) for k, v in want_changes.items()}
    assert all(type(c) is Change for cs in got_changes.values() for c in cs)
    assert sorted(got_deltas, key=repr) == sorted(want_deltas, key=repr)


def test_the_python_sources_rows_are_packed_by_their_bucket_column() -> None:
    rows = [event_row(*r) for r in _records(3, 50)]
    buckets = [row[4] % 4 for row in rows]
    schema = arrow_schema(SOURCE_COLUMNS).append(pa.field("bucket", pa.int64(), False))
    batch = pa.RecordBatch.from_arrays(
        [pa.array([row[i] for row in rows], type=f.type)
         for i, f in enumerate(arrow_schema(SOURCE_COLUMNS))]
        + [pa.array(buckets, pa.int64())], schema=schema)
    out = list(pack_source_batches([batch]))
    by_bucket = dict(zip(out[0].column("bucket").to_pylist(), out[0].column("rows").to_pylist(),
                         strict=True))
    assert sorted(by_bucket) == sorted(set(buckets))
    for bucket, blob in by_bucket.items():
        mine = [row for row, b in zip(rows, buckets, strict=True) if b == bucket]
        got, _ = read_packed([pd.DataFrame({"rows": [blob]})])
        want, _ = _one_row_each(mine)
        assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}


def test_packed_deltas_round_trip_every_kind() -> None:
    deltas = [Delta.fanout(1, 2, 3, [4, 5, 2**63 - 1]), Delta.timeline_add(4, 1, 2, 3),
              Delta.dead_letter("tweets", 1, 9, "bad", b"\x00{"), Delta.source_offset("users", 0, 7),
              Delta.relation(1, 2, "mute", True, 5), Delta.profile(1, 2, "h", None),
              Delta.account_deleted(3, 4), Delta.horizon((5, 6), [7])]
    assert {d.kind for d in deltas} >= {DeltaKind.FANOUT, DeltaKind.DEAD, DeltaKind.USER}
    back = unpack_deltas(pack_deltas(deltas))
    assert back == deltas and all(type(d) is Delta for d in back)
    assert unpack_deltas(pack_deltas([])) == []
    table = pa.table({"deltas": [pack_deltas(deltas[:3]), pack_deltas(deltas[3:])]})
    assert deltas_from_arrow(table) == deltas
    rows = pa.Table.from_batches(list(unpacked_batches(table.to_batches())))
    assert deltas_from_arrow(rows) == deltas  # one delta a row, as the executor sink routes them
    assert back[0].raw == deltas[0].raw and back[-1].user_id == deltas[-1].user_id


def test_deltas_packed_with_other_fields_are_refused() -> None:
    kind, *rest = Delta.timeline_add(4, 1, 2, 3)
    short = marshal.dumps([(int(kind), *rest[:-1])], 4)  # as a build with one field less
    with pytest.raises(ValueError, match="fields"):
        unpack_deltas(short)


@pytest.mark.spark
def test_the_bucket_of_a_kafka_key_is_the_bucket_of_its_join_key(spark: Any) -> None:
    from pyspark.sql import functions as F

    from views.packed import bucket_of

    keys = [0, 1, 7, 42, 10**12, 2**63 - 1]
    raw = spark.createDataFrame([(encode_key(k), k) for k in keys], "key binary, id long")
    kafka_key = F.col("key").cast("string").try_cast("long")
    got = raw.select(bucket_of(kafka_key, 64).alias("a"), bucket_of(F.col("id"), 64).alias("b"))
    rows = got.collect()
    assert [r.a for r in rows] == [r.b for r in rows]
    assert len({r.a for r in rows}) > 1
    odd = spark.createDataFrame([(b"x",), (b"",), (None,)], "key binary")
    assert odd.select(bucket_of(kafka_key, 64).alias("a")).count() == 3  # never an error
