"""The pipeline's parts alone, on the same data, so a run shows how far the whole is.

    .venv/bin/python benchmarks/bench_parts.py [--edges 300000] [--tweets 50000]

- ``source``: the Kafka source's ``read_range`` over every partition (decode + Arrow),
  one process, records/s;
- ``join``: the pure join (views.local, no Spark, no store) over the same events,
  events/s, and the timeline rows it produces;
- ``sink``: SQLiteStore.apply of those deltas alone, timeline rows/s;
- ``spark-source``: Spark micro-batches into a trivial foreachBatch (a count),
  records/s, for each Kafka source the job can read with, in the same session on the
  same topics, alternated ``--rounds`` times: ``python`` (the ``fanout-kafka``
  source, views.source), ``spark`` (Spark's ``format("kafka")`` + the mapInArrow
  decode, views.connector), ``spark-pandas`` (the same decode in mapInPandas) and
  ``spark-raw`` (Spark's source with no decode: the floor the decode sits on).

Results go to benchmarks/results/parts.json (``--name`` picks another file).
Compare with bench_replay.py's figures for the whole pipeline.
"""

from __future__ import annotations

import gzip
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from harness import ROOT, argument_parser, save
from pipeline import scratch

sys.path.insert(0, str(ROOT))

from infra.services.broker import KafkaBroker  # noqa: E402
from infra.services.spark import build_session  # noqa: E402
from ingest import generator, history  # noqa: E402
from ingest.producer import ChangelogProducer  # noqa: E402
from ingest.settings import KafkaSettings  # noqa: E402
from ingest.topics import create_topics  # noqa: E402
from views import connector  # noqa: E402
from views.join import JoinConfig  # noqa: E402
from views.kafka_offsets import EndOffsets  # noqa: E402
from views.local import LocalJoin  # noqa: E402
from views.source import (  # noqa: E402
    FORMAT,
    SOURCE_SCHEMA,
    KafkaRange,
    SourceOptions,
    event_row,
    read_range,
)
from views.stores.base import Store  # noqa: E402
from views.stores.sqlite import SQLiteStore  # noqa: E402

EGO = ROOT.parent / "shared" / "data" / "ego-twitter" / "follows.txt.gz"


def events(edges: int, tweets: int, work: Path) -> list:
    path = work / "ego.txt"
    with gzip.open(EGO, "rt") as src, path.open("w") as out:
        for i, line in enumerate(src):
            if i >= edges:
                break
            out.write(line)
    census = history.census(path)
    made = generator.for_graph(census.follower_counts, tweets, seed=5)
    edge_events = history.iter_events(path, edge_times=history.EdgeTimes.spread(
        census.edges, *generator.activity_window(generator.DEFAULT_START_MS,
                                                 generator.DEFAULT_SPAN_MS)))
    return list(history.merge_by_time(edge_events, made.events()))


class _Recorder(Store):
    """Collects deltas instead of writing them (the join measured alone)."""

    def __init__(self) -> None:
        super().__init__(800)
        self.recorded: list[list] = []

    def apply(self, deltas, batch_id=-1):  # type: ignore[override]
        self.recorded.append(list(deltas))

    def open(self):  # type: ignore[override]
        return self

    def close(self):
        pass

    def _write(self, *args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError

    cached = horizon = celebrities_followed = followees = author_tweets = _write
    tweets = users = celebrities = applied_offsets = dead_letters = counts = _write
    home_users = batches = dead_letter_count = relations = reposts_of = _write


def bench_join_and_sink(evts: list, batch: int, work: Path) -> dict:
    recorder = _Recorder()
    join = LocalJoin(JoinConfig.with_ratio(800, 500), recorder)
    start = time.perf_counter()
    for i in range(0, len(evts), batch):
        join.run(evts[i:i + batch])
    join_s = time.perf_counter() - start
    store = SQLiteStore(work / "sink.sqlite", cap=800).open()
    start = time.perf_counter()
    rows = 0
    for batch_id, deltas in enumerate(recorder.recorded):
        rows += store.apply(deltas, batch_id).timeline_adds
    sink_s = time.perf_counter() - start
    return {"join": {"events": len(evts), "seconds": round(join_s, 2),
                     "events_per_s": round(len(evts) / join_s)},
            "sink": {"timeline_rows": rows, "deltas": sum(map(len, recorder.recorded)),
                     "seconds": round(sink_s, 2), "rows_per_s": round(rows / sink_s)}}


def bench_source(evts: list, work: Path, spark_too: bool, rounds: int = 1) -> dict:
    with KafkaBroker(work / "kafka") as broker:
        kafka = KafkaSettings(bootstrap=broker.bootstrap, partitions=4, topic_prefix="p_")
        create_topics(kafka)
        with ChangelogProducer(kafka) as producer:
            for event in evts:
                producer.send(event)
            producer.flush(120)
        offsets = EndOffsets(kafka.bootstrap)
        tps = offsets.topic_partitions(kafka.physical_topics())
        ends = offsets.ends(tps)
        options = SourceOptions(bootstrap=kafka.bootstrap, topic_prefix="p_")
        start = time.perf_counter()
        rows = sum(b.num_rows for (t, p), end in ends.items() if end
                   for b in read_range(options, KafkaRange(t, p, 0, end)))
        seconds = time.perf_counter() - start
        out = {"source": {"records": rows, "seconds": round(seconds, 2),
                          "records_per_s": round(rows / seconds)}}
        if spark_too:
            out["spark-source"] = _spark_sources(kafka, work, rows, rounds)
        return out


def _readers(spark, kafka: KafkaSettings) -> dict:
    """The stream of each source variant, made fresh for each query."""
    def python():
        return (spark.readStream.format(FORMAT).option("bootstrap", kafka.bootstrap)
                .option("topic_prefix", kafka.topic_prefix).option("partitions", "4")
                .option("maxRecordsPerBatch", "100000").load())

    def spark_kafka():
        return connector.read_stream(spark, kafka, max_records_per_batch=100_000,
                                     broker_retry_s=60)

    def raw():
        return (spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", kafka.bootstrap)
                .option("subscribe", ",".join(kafka.physical_topics()))
                .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100000")
                .load().select("topic", "partition", "offset", "key", "value"))

    def spark_pandas():
        return raw().mapInPandas(_decode_pandas(kafka.topic_prefix), SOURCE_SCHEMA)

    return {"python": python, "spark": spark_kafka, "spark-pandas": spark_pandas,
            "spark-raw": raw}


def _decode_pandas(prefix: str):
    names = SOURCE_SCHEMA.fieldNames()

    def decode(frames):
        import pandas as pd

        for frame in frames:
            rows = [event_row(t.removeprefix(prefix), p, o, k, v) for t, p, o, k, v in zip(
                frame["topic"], frame["partition"], frame["offset"], frame["key"],
                frame["value"], strict=True)]
            yield pd.DataFrame.from_records(rows, columns=names)
    return decode


def _spark_sources(kafka: KafkaSettings, work: Path, expected: int, rounds: int) -> dict:
    spark = build_session("fanout-parts", shuffle_partitions=2)
    out: dict[str, list[dict]] = {}
    try:
        for i in range(rounds):
            for name, make in _readers(spark, kafka).items():
                out.setdefault(name, []).append(
                    _drain(make(), work / f"ck-{name}-{i}", expected))
                print(f"  spark-source {name} round {i}: {out[name][-1]}", flush=True)
    finally:
        spark.stop()
    return {name: {"records_per_s": [r["records_per_s"] for r in runs], "runs": runs}
            for name, runs in out.items()}


def _drain(frame, checkpoint: Path, expected: int) -> dict:
    seen: list[tuple[int, float]] = []
    query = (frame.writeStream.foreachBatch(
        lambda df, _id: seen.append((df.count(), time.perf_counter())))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
        .start())
    start = time.perf_counter()
    query.awaitTermination(900)
    seconds = time.perf_counter() - start
    assert query.exception() is None, query.exception()
    rows = sum(n for n, _ in seen)
    assert rows == expected, f"spark read {rows} of {expected}"
    return {"records": rows, "batches": len(seen), "seconds": round(seconds, 2),
            "records_per_s": round(rows / seconds)}


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="parts", tweets=50_000, edges=300_000,
                         rounds=2)
    ap.add_argument("--batch", type=int, default=100_000, help="events per micro-batch")
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    with scratch("fanout-parts-") as work:
        evts = events(args.edges, args.tweets, work)
        result = {"events": len(evts), **bench_join_and_sink(evts, args.batch, work),
                  **bench_source(evts, work, not args.no_spark, args.rounds),
                  "settings": vars(args), "load_average": os.getloadavg()}
    for part in ("source", "spark-source", "join", "sink"):
        if part in result:
            print(f"{part:>13}: {result[part]}")
    print(f"written to {save(args.name, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
