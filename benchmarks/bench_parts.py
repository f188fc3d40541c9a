"""The pipeline's parts alone, on the same data, so a run shows how far the whole is.

    .venv/bin/python benchmarks/bench_parts.py [--edges 300000] [--tweets 50000]

- ``source``: the Kafka source's ``read_range`` over every partition (decode + Arrow),
  one process, records/s;
- ``join``: the pure join (views.local, no Spark, no store) over the same events,
  events/s, and the timeline rows it produces;
- ``sink``: SQLiteStore.apply of those deltas alone, timeline rows/s;
- ``spark-source``: Spark micro-batches through the source into a trivial
  foreachBatch (a count), records/s.

Results go to benchmarks/results/parts.json. Compare with bench_replay.py's
figures for the whole pipeline.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from pathlib import Path

from pipeline import ROOT, save

sys.path.insert(0, str(ROOT))

from infra.broker import KafkaBroker  # noqa: E402
from infra.spark import build_session  # noqa: E402
from ingest import generator, history  # noqa: E402
from ingest.producer import ChangelogProducer  # noqa: E402
from ingest.settings import KafkaSettings  # noqa: E402
from ingest.topics import create_topics  # noqa: E402
from views.join import JoinConfig  # noqa: E402
from views.kafka_offsets import EndOffsets  # noqa: E402
from views.local import LocalJoin  # noqa: E402
from views.source import FORMAT, KafkaRange, SourceOptions, read_range  # noqa: E402
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
        self.batches: list[list] = []

    def apply(self, deltas, batch_id=-1):  # type: ignore[override]
        self.batches.append(list(deltas))

    def open(self):  # type: ignore[override]
        return self

    def close(self):
        pass

    def _write(self, plan, batch_id):
        raise NotImplementedError

    cached = horizon = celebrities_followed = followees = author_tweets = _write
    tweets = users = celebrities = applied_offsets = dead_letters = counts = _write


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
    for batch_id, deltas in enumerate(recorder.batches):
        rows += store.apply(deltas, batch_id).timeline_adds
    sink_s = time.perf_counter() - start
    return {"join": {"events": len(evts), "seconds": round(join_s, 2),
                     "events_per_s": round(len(evts) / join_s)},
            "sink": {"timeline_rows": rows, "deltas": sum(map(len, recorder.batches)),
                     "seconds": round(sink_s, 2), "rows_per_s": round(rows / sink_s)}}


def bench_source(evts: list, work: Path, spark_too: bool) -> dict:
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
            out["spark-source"] = _spark_source(kafka, work, rows)
        return out


def _spark_source(kafka: KafkaSettings, work: Path, expected: int) -> dict:
    spark = build_session("fanout-parts", shuffle_partitions=2)
    seen: list[tuple[int, float]] = []
    frame = (spark.readStream.format(FORMAT).option("bootstrap", kafka.bootstrap)
             .option("topic_prefix", kafka.topic_prefix).option("partitions", "4")
             .option("maxRecordsPerBatch", "100000").load())
    query = (frame.writeStream.foreachBatch(
        lambda df, _id: seen.append((df.count(), time.perf_counter())))
        .option("checkpointLocation", str(work / "ck-source")).trigger(availableNow=True)
        .start())
    start = time.perf_counter()
    query.awaitTermination(600)
    seconds = time.perf_counter() - start
    spark.stop()
    rows = sum(n for n, _ in seen)
    assert rows == expected, f"spark read {rows} of {expected}"
    return {"records": rows, "batches": len(seen), "seconds": round(seconds, 2),
            "records_per_s": round(rows / seconds)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--edges", type=int, default=300_000)
    ap.add_argument("--tweets", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=100_000, help="events per micro-batch")
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fanout-parts-"))
    evts = events(args.edges, args.tweets, work)
    result = {"events": len(evts), **bench_join_and_sink(evts, args.batch, work),
              **bench_source(evts, work, not args.no_spark), "settings": vars(args)}
    for part in ("source", "spark-source", "join", "sink"):
        if part in result:
            print(f"{part:>13}: {result[part]}")
    print(f"written to {save('parts', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
