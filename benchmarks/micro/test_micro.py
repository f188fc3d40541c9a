"""Micro-benchmarks: one piece of the job or of the store, timed alone in this process.

    .venv/bin/python benchmarks/run.py micro              # timed, summary in results/micro.json
    .venv/bin/pytest benchmarks/micro --benchmark-disable  # each once, as a check

The input of each is built before the clock starts, from the first 100,000 edges of
ego-twitter and 20,000 generated tweets (``bench_parts.events``): the decode (a Kafka
record to a source row, packed into key buckets, what the job's ``mapInArrow`` runs),
the join (:func:`views.join.apply_batch` over one micro-batch of every author), the
state codec (every author's state encoded and decoded) and the SQLite store's apply
of a burst batch (``bench_store_apply``: 2,000 tweets into 78 timelines each), and an
HTTP client made as httpx makes one (a TLS context and the CA bundle loaded each time)
against one given the process's shared context (``infra.webclient``). Each checks what
it computed, so a benchmark of a broken piece fails instead of timing it.
"""

from __future__ import annotations

import random
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from bench_decode import records
from bench_parts import events
from bench_store_apply import _batch

from infra import webclient
from views.codec import decode_state, encode_state
from views.join import AuthorState, Change, JoinConfig, apply_batch
from views.packed import Packer
from views.source import event_row
from views.stores.sqlite import SQLiteStore

EDGES = 100_000
TWEETS = 20_000
CONFIG = JoinConfig.with_ratio(800, 1000)


@pytest.fixture(scope="module")
def made() -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="fanout-micro-") as work:
        return events(EDGES, TWEETS, Path(work))


@pytest.fixture(scope="module")
def by_author(made: list[Any]) -> dict[int, list[Change]]:
    keyed: dict[int, list[Change]] = defaultdict(list)
    for offset, event in enumerate(made):
        keyed[event.key].append(Change.of(event, offset))
    return dict(keyed)


@pytest.fixture(scope="module")
def states(by_author: dict[int, list[Change]]) -> list[AuthorState]:
    return [apply_batch(None, key, changes, CONFIG)[0] for key, changes in by_author.items()]


def test_decode(benchmark: Any) -> None:
    recs = records(EDGES, TWEETS)

    def decode() -> Any:
        packer = Packer()
        for topic, partition, offset, key, value, bucket in recs:
            packer.add(bucket, event_row(topic, partition, offset, key, value))
        return packer.batch()

    assert benchmark(decode).num_rows == 64
    benchmark.extra_info["records"] = len(recs)


def test_join(benchmark: Any, by_author: dict[int, list[Change]]) -> None:
    def join() -> int:
        return sum(len(apply_batch(None, key, changes, CONFIG)[1])
                   for key, changes in by_author.items())

    assert benchmark(join) > 0
    benchmark.extra_info["authors"] = len(by_author)
    benchmark.extra_info["changes"] = sum(map(len, by_author.values()))


def test_codec(benchmark: Any, states: list[AuthorState]) -> None:
    def round_trip() -> int:
        return sum(len(decode_state(encode_state(s)).followers) for s in states)

    assert benchmark(round_trip) == sum(len(s.followers) for s in states)
    benchmark.extra_info["states"] = len(states)
    benchmark.extra_info["state_bytes"] = sum(len(encode_state(s)) for s in states)


def test_store_apply(benchmark: Any, tmp_path: Path) -> None:
    deltas = _batch(random.Random(1), 0, 2_000, 78, 80_000)
    stores: list[SQLiteStore] = []

    def fresh() -> tuple[tuple[Any, ...], dict[str, Any]]:
        store = SQLiteStore(tmp_path / f"v{len(stores)}.sqlite").open()
        stores.append(store)
        return (store,), {}

    stats = benchmark.pedantic(lambda store: store.apply(deltas, 0), setup=fresh, rounds=5)
    for store in stores:
        store.close()
    assert stats.timeline_adds == 2_000 * 78
    benchmark.extra_info["timeline_adds"] = stats.timeline_adds


@pytest.mark.parametrize("made_by", ["httpx", "webclient"])
def test_http_client(benchmark: Any, made_by: str) -> None:
    make = httpx.Client if made_by == "httpx" else webclient.client

    def client() -> bool:
        with make(timeout=5.0) as http:
            return http.timeout.read == 5.0

    assert benchmark(client)
