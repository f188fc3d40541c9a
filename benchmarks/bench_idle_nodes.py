"""What a local Kafka node and a local Cassandra node cost the box while they wait.

    .venv/bin/python benchmarks/bench_idle_nodes.py          # ~6 min → results/idle-nodes.json

A test session, a demo and a ``fanout up`` keep nodes running between the moments
they work, and on two cores their idle CPU is CPU the rest did not get. Each node
starts on its own, settles for ``--settle-s`` and is then measured over ``--seconds``
(``utime + stime`` of its JVM, and of each of its threads by name), first with the
settings the local nodes run with, then with the engine's default for the one that
differs:

- Kafka (:class:`infra.services.broker.KafkaBroker`): ``metadata.max.idle.interval.ms``,
  how often the controller appends a no-op record to an idle metadata log (10 s here,
  500 ms by default);
- Cassandra (:class:`infra.services.cassandra.LocalCassandra`):
  ``cassandra.approximate_time_precision_ms``, how often its approximate clock ticks
  (:data:`infra.services.cassandra.CLOCK_TICK_MS` here, 2 ms by default).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from harness import ROOT, argument_parser, save, threads_cpu

sys.path.insert(0, str(ROOT))

from infra.services import broker, cassandra  # noqa: E402

#: Cassandra's own tick of its approximate clock (Kafka's default is the broker module's).
CASSANDRA_CLOCK_TICK_MS = 2


def _idle(pid: int, settle_s: float, seconds: float) -> dict[str, Any]:
    time.sleep(settle_s)
    before = threads_cpu(pid)
    time.sleep(seconds)
    by_thread = Counter({k: v - before.get(k, 0.0) for k, v in threads_cpu(pid).items()})
    spent = by_thread.pop("")
    top = {k: round(v, 2) for k, v in by_thread.most_common(6)}
    print(f"  {spent:.2f} CPU-s over {seconds:.0f} s; threads {top}", flush=True)
    return {"cpu_s": round(spent, 3), "cpu_s_a_minute": round(spent * 60 / seconds, 3),
            "threads": top}


def kafka(default: bool, settle_s: float, seconds: float, scratch: Path) -> dict[str, Any]:
    idle_ms = broker.KAFKA_METADATA_IDLE_MS if default else broker.METADATA_IDLE_MS
    with broker.KafkaBroker(scratch / f"kafka-{default}", metadata_idle_ms=idle_ms) as node:
        return _idle(node.pid, settle_s, seconds)


def cassandra_node(default: bool, settle_s: float, seconds: float,
                   scratch: Path) -> dict[str, Any]:
    tick_ms = CASSANDRA_CLOCK_TICK_MS if default else cassandra.CLOCK_TICK_MS
    with cassandra.LocalCassandra(scratch / f"cassandra-{default}", heap_mb=512,
                                  clock_tick_ms=tick_ms) as node:
        return _idle(node.pid, settle_s, seconds)


def main() -> None:
    ap = argument_parser(__doc__.splitlines()[0], name="idle-nodes")
    ap.add_argument("--settle-s", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    result: dict[str, Any] = {"settle_s": args.settle_s, "seconds": args.seconds}
    with tempfile.TemporaryDirectory(prefix="fanout-bench-idle-") as scratch:
        for label, run in (("kafka", kafka), ("cassandra", cassandra_node)):
            for default in (False, True):
                key = f"{label}-{'default' if default else 'local'}"
                print(f"{key}:", flush=True)
                result[key] = run(default, args.settle_s, args.seconds, Path(scratch))
    print(save(args.name, result))


if __name__ == "__main__":
    main()
