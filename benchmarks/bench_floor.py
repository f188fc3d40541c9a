"""Spark's floor under the pipeline: the same records through the job's stages, one more each time.

    .venv/bin/python benchmarks/bench_floor.py [--edges 300000] [--tweets 50000]
        [--max-records 50000] [--name floor]

The events are ``bench_parts.events(edges, tweets)`` (396,581 by default, as in
``bench_peers.py``), produced once into Apache Kafka. Then each *layer* reads all of
them with a streaming query of its own (a fresh checkpoint, ``availableNow``, micro-batches
of ``--max-records`` as the job's, Spark's ``noop`` sink), in one ``local[2]`` session:

- ``kafka``: Spark's Kafka source and the bucket of each key, in the JVM;
- ``python hop``: the same, through a ``mapInArrow`` that returns nothing (the cost of
  handing the records to a Python worker);
- ``decode``: the job's decode and packing (``views.connector.read_stream``);
- ``shuffle + state call``: that, grouped by bucket into ``transformWithStateInPandas``
  with a processor that reads its rows and does nothing;
- ``join``: the job's query as it runs (the join, its state in RocksDB), its deltas
  dropped by the ``noop`` sink instead of written to SQLite.

The whole pipeline is the ``join`` layer plus the SQLite sink: ``bench_peers.py``. The
pure join (``views.local``, one core, 100k-event batches) runs first as the yardstick. A
layer's ``running`` rate counts the micro-batches after its first (which plans the query and,
for the first Python layer, starts the workers), from Spark's ``triggerExecution``. Results
go to ``benchmarks/results/NAME.json``, and a plot of the layers' wall time per event
against the pure join's and the issue's 0.6× line to ``NAME.png``
(``--plot NAME.json`` redraws it from a saved run).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from bench_parts import events as parts_events
from harness import argument_parser, save
from pipeline import pipeline, scratch
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from ingest.producer import ChangelogProducer
from views.connector import kafka_rows, key_bucket, read_stream
from views.delta import PACKED_DELTA_DDL
from views.join import JoinConfig
from views.local import LocalJoin
from views.packed import PACKED_DDL
from views.processor import JoinProcessor
from views.settings import ViewSettings

CAP = 800
CELEBRITY_THRESHOLD = 1000


class Drain(StatefulProcessor):
    """Reads every row Spark hands it; keeps no state and yields nothing."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        for _ in rows:
            pass
        return iter(())

    def close(self) -> None:
        pass


def _nothing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        pass
    return iter(())


def layers(spark: SparkSession, view: ViewSettings, kafka: Any
           ) -> list[tuple[str, Callable[[], DataFrame]]]:
    buckets = view.key_buckets
    records = view.records_per_batch(view.store())

    def raw() -> DataFrame:
        rows = kafka_rows(spark, kafka, records, view.broker_retry_s)
        return rows.withColumn("bucket", key_bucket(buckets))

    def packed() -> DataFrame:
        return read_stream(spark, kafka, max_records_per_batch=records,
                           broker_retry_s=view.broker_retry_s, buckets=buckets)

    def grouped(processor: StatefulProcessor) -> DataFrame:
        return packed().groupBy("bucket").transformWithStateInPandas(
            statefulProcessor=processor, outputStructType=PACKED_DELTA_DDL,
            outputMode="Append", timeMode="None")

    return [
        ("kafka", raw),
        ("python hop", lambda: raw().coalesce(spark.sparkContext.defaultParallelism)
         .mapInArrow(_nothing, PACKED_DDL)),
        ("decode", packed),
        ("shuffle + state call", lambda: grouped(Drain())),
        ("join", lambda: grouped(JoinProcessor(view.join_config()))),
    ]


def run_layer(name: str, frame: DataFrame, checkpoint: Path, events: int) -> dict[str, Any]:
    start = time.perf_counter()
    query = (frame.writeStream.format("noop").queryName(name.replace(" ", "_"))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - start
    progress = [p for p in query.recentProgress if p.numInputRows]
    rows = sum(p.numInputRows for p in progress)
    later = progress[1:]
    later_rows = sum(p.numInputRows for p in later)
    later_s = sum(p.durationMs.get("triggerExecution", 0) for p in later) / 1000
    if rows != events:
        raise RuntimeError(f"layer {name!r} read {rows} records, not {events}")
    return {"seconds": seconds, "events_per_s": round(events / seconds),
            "batches": len(progress), "first_batch_s": progress[0].durationMs["triggerExecution"] / 1000,
            "running_events_per_s": round(later_rows / later_s) if later_s else 0}


def pure_join(evts: list, batch: int) -> float:
    class _Drop:
        def apply(self, deltas: Any, batch_id: int = -1) -> None:
            pass

    join = LocalJoin(JoinConfig.with_ratio(CAP, CELEBRITY_THRESHOLD), _Drop())  # type: ignore[arg-type]
    start = time.perf_counter()
    for i in range(0, len(evts), batch):
        join.run(evts[i:i + batch])
    return len(evts) / (time.perf_counter() - start)


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="floor", tweets=50_000, edges=300_000)
    ap.add_argument("--max-records", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=100_000, help="events per pure-join batch")
    ap.add_argument("--layers", default="", help="only these layers (comma-separated names)")
    ap.add_argument("--plot", type=Path, help="only redraw the plot of this saved result")
    args = ap.parse_args()
    if args.plot is not None:
        print(f"plotted {plot(json.loads(args.plot.read_text()), args.plot.with_suffix('.png'))}")
        return 0
    with scratch("fanout-floor-") as work:
        evts = parts_events(args.edges, args.tweets, work)
        print(f"{len(evts):,} events", file=sys.stderr, flush=True)
        join_rate = pure_join(evts, args.batch)
        print(f"pure join: {join_rate:,.0f} events/s", file=sys.stderr, flush=True)
        with pipeline(celebrity_threshold=CELEBRITY_THRESHOLD, cap=CAP,
                      max_records=args.max_records, start=False) as pipe:
            with ChangelogProducer(pipe.kafka) as producer:
                for event in evts:
                    producer.send(event)
                producer.flush(300)
            spark = SparkSession.getActiveSession()
            assert spark is not None
            results: dict[str, Any] = {}
            chosen = {n.strip() for n in args.layers.split(",") if n.strip()}
            for i, (name, frame) in enumerate(layers(spark, pipe.view, pipe.kafka)):
                if chosen and name not in chosen:
                    continue
                print(f"--- {name}", file=sys.stderr, flush=True)
                results[name] = run_layer(name, frame(), work / f"ck{i}", len(evts))
    out = {"events": len(evts), "pure_join_events_per_s": round(join_rate), "layers": results,
           "settings": vars(args), "load_average_end": os.getloadavg()}
    _print(out)
    path = save(args.name, out)
    print(f"written to {path}; plotted {plot(out, path.with_suffix('.png'))}")
    return 0


def plot(out: dict[str, Any], path: Path) -> Path:
    """Horizontal bars: each layer's wall µs per event (running), the join and 0.6× marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(out["layers"])
    micros = [1e6 / max(1, out["layers"][n]["running_events_per_s"]) for n in names]
    join = 1e6 / out["pure_join_events_per_s"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.barh(names[::-1], micros[::-1], color="#4c72b0")
    ax.axvline(join, color="black", linestyle="-", label=f"pure join, one core ({join:.1f} µs)")
    ax.axvline(join / 0.6, color="#c44e52", linestyle="--",
               label=f"0.6× the pure join ({join / 0.6:.1f} µs)")
    for y, value in enumerate(micros[::-1]):
        ax.text(value, y, f" {value:.1f}", va="center", fontsize=8)
    ax.set_xlabel("wall µs per event, micro-batches after the first (local[2])")
    ax.set_title(f"Spark's floor under the job: {out['events']:,} events, "
                 f"{out['settings']['max_records']:,}-record batches", fontsize=10)
    ax.set_xlim(0, max(*micros, join / 0.6) * 1.12)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _print(out: dict[str, Any]) -> None:
    base = out["pure_join_events_per_s"]
    print(f"\n{out['events']:,} events; pure join {base:,} events/s; "
          f"load average at the end {[round(x, 2) for x in out['load_average_end']]}")
    print(f"{'layer':<22} {'seconds':>8} {'events/s':>9} {'× join':>7} {'running':>9} {'× join':>7}")
    for name, r in out["layers"].items():
        print(f"{name:<22} {r['seconds']:8.1f} {r['events_per_s']:9,} "
              f"{r['events_per_s'] / base:7.2f} {r['running_events_per_s']:9,} "
              f"{r['running_events_per_s'] / base:7.2f}")


if __name__ == "__main__":
    sys.exit(main())
