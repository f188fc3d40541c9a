"""The home-timeline view as one Flink SQL job on the changelog in Kafka: a peer of fanout.

    python3.11 benchmarks/peers_flink.py --setup            # make .venv-flink, fetch the jar (once)
    .venv-flink/bin/python benchmarks/peers_flink.py --bootstrap HOST:PORT --prefix PREFIX \\
        --events EVENTS.jsonl --out result.json [--mode streaming|batch] [--cap 800] \\
        [--parallelism 2] [--heap 3g]

The engine a Spark user would pick instead of fanout's job: PyFlink 2.2.1 (the local
mini-cluster, in the JVM that PyFlink starts) with Flink's Kafka SQL connector
``org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2``. ``benchmarks/bench_peers.py``
runs it as the engines ``flink`` and ``flink-batch``, on the same events as the others.

Input. Flink reads fanout's own changelog from Kafka: the ``follows`` and ``tweets``
topics (``PREFIXfollows``, ``PREFIXtweets``) exactly as ``ingest/events.py`` encodes and
``ChangelogProducer`` produces them (JSON values, keyed by the join key), which
``bench_peers.py`` produces before the job starts, untimed, as it does for the cold
``pipeline``. Flink's ``json`` format reads those values as they are (unknown fields
ignored); no topic of another format is made. The job reads each topic from the
earliest offset to the end offsets it finds at start (``'scan.bounded.mode' =
'latest-offset'``), so it finishes. The ``users`` topic does not touch the view and is
not read. ``--events`` is the same events as JSONL (``peers.py``'s input format), for
the check only.

The view is DESIGN §4 for every user at once, in Flink SQL:

- follow edges: the latest op per (follower, followee), ``ROW_NUMBER() OVER (PARTITION
  BY follower_id, followee_id ORDER BY created_at DESC, `offset` DESC) = 1``, kept if it
  is a follow (the records of one edge share a key, so a partition: the Kafka offset
  breaks ties in file order);
- tweets: the first post of each tweet id (``ROW_NUMBER`` by offset), minus every id
  that has a delete (``NOT EXISTS``), before or after the post;
- the join on ``followee_id = author_id``, then ``ROW_NUMBER() OVER (PARTITION BY
  follower_id ORDER BY created_at DESC, tweet_id DESC) <= --cap``.

``--mode streaming`` (engine ``flink``) keeps the view incrementally, as fanout does: a
streaming job over the bounded topics, with Flink SQL's mini-batch on (5,000 rows or
1 s), the heap state backend, no checkpoints, no upsert materializer before the sink
(each (user_id, tweet_id) changes in one task, in order). Its plan: the two ``rn = 1``
are append-only Top-1s, the anti-join and the join are regular (unbounded-state)
joins, the capped Top-N is Flink's retracting Top-N (``--explain`` prints it).
``--mode batch`` (``flink-batch``) runs the same SQL once over the whole input with the
batch runtime (sorts, hash joins): a one-shot recompute, like DuckDB's at the end, not
a maintained view. Either writes the view to an ``upsert-kafka`` table keyed by
(user_id, tweet_id) on a topic of the same broker, ``PREFIXflink_home_MODE_PID`` (a row
leaving a timeline is a tombstone), which is read back after the clock stops and
compared, as a set of (user, tweet_id) rows, with ``peers.brute`` on ``--events``.

``seconds`` runs from the ``INSERT`` handed to Flink to the job finished (the sink's
records acknowledged): planning, the mini-cluster's start and the job's deployment are
included (``submit_s`` says how much of it that was); PyFlink's JVM start, the tables'
DDL, reading the JSONL and the check are not. ``--parallelism`` is the job's (default
2, the cores of this machine and the whole pipeline's ``local[2]``). ``--heap`` is the
JVM's heap (``-Xms`` = ``-Xmx``; ``JVM_ARGS`` of PyFlink's gateway, whose JVM runs the
mini-cluster): with 1 GB the default size did not finish, so 2 GB or more. ``peak_rss_mb``
is the JVM's peak RSS (``VmHWM``) plus this process's.

Neither PyFlink nor the jar is a product dependency: PyFlink (about 850 MB with Apache
Beam and pyarrow) lives in its own virtualenv ``.venv-flink`` with ``confluent-kafka``
(to read the result back), made by ``--setup`` or :func:`ensure_venv`; the connector
jar is fetched by Maven into the project's jar cache (``infra/services/jars.py``,
``~/.cache/fanout/jars/flink-kafka-5.0.0-2.2/``) by :func:`ensure_connector`. Java 17
is the one on ``PATH`` (or ``JAVA_HOME``'s). This file imports nothing but the
standard library at module level, so ``bench_peers.py`` imports :func:`ensure_venv`
and :func:`ensure_connector` from it and runs the engine here in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from peers import ROOT, Result, Row, Run, _peak_rss_mb, brute, read_events, summary
from peers import ensure_venv as _ensure_peer_venv

VENV: Final = ".venv-flink"
FLINK_VERSION: Final = "2.2.1"
REQUIREMENTS: Final = (f"apache-flink=={FLINK_VERSION}", "confluent-kafka==2.16.1")
CONNECTOR: Final = "org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2"
MODES: Final = ("streaming", "batch")
#: The engine names of bench_peers.py, by mode.
ENGINES: Final = {"flink": "streaming", "flink-batch": "batch"}
DEFAULT_HEAP: Final = "3g"
MINI_BATCH_ROWS: Final = 5_000


@dataclass
class FlinkResult(Result):
    mode: str = "streaming"
    parallelism: int = 2
    heap: str = DEFAULT_HEAP
    #: Of ``seconds``: the INSERT planned, the mini-cluster started, the job deployed.
    submit_s: float = 0.0
    #: Records the upsert-kafka sink wrote (rows in and out of timelines).
    sink_records: int = 0


# --- setup ------------------------------------------------------------------------


def ensure_venv(root: Path = ROOT) -> Path:
    """Make ``root/.venv-flink`` with PyFlink if it is not there; its python."""
    return _ensure_peer_venv(root, VENV, REQUIREMENTS)


def _jar_set() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from infra.services.jars import JarSet  # stdlib only: importable from .venv-flink too

    return JarSet("flink-kafka", (CONNECTOR,))


def ensure_connector() -> Path:
    """The connector jar, fetched with Maven into the jar cache if it is not there."""
    jars = _jar_set()
    from infra.services.jars import resolve

    return _one_jar(resolve(jars))


def cached_connector() -> Path:
    """The connector jar from the jar cache; ``SystemExit`` saying how to fetch it."""
    jars = _jar_set()
    from infra.services.jars import cached

    folder = cached(jars)
    if folder is None:
        raise SystemExit(f"{CONNECTOR} is not in the jar cache: run "
                         f"`python3.11 benchmarks/peers_flink.py --setup` once")
    return _one_jar(folder)


def _one_jar(folder: Path) -> Path:
    jars = sorted(folder.glob("flink-sql-connector-kafka-*.jar"))
    if len(jars) != 1:
        raise SystemExit(f"expected one flink-sql-connector-kafka jar in {folder}, found {jars}")
    return jars[0]


# --- the SQL ----------------------------------------------------------------------


def source_ddl(name: str, topic: str, columns: str, bootstrap: str, group: str) -> str:
    """A Kafka table over one changelog topic, from the earliest to the end offsets."""
    return f"""
CREATE TABLE {name} (
    {columns},
    `offset` BIGINT METADATA VIRTUAL
) WITH (
    'connector' = 'kafka',
    'topic' = '{topic}',
    'properties.bootstrap.servers' = '{bootstrap}',
    'properties.group.id' = '{group}',
    'scan.startup.mode' = 'earliest-offset',
    'scan.bounded.mode' = 'latest-offset',
    'format' = 'json',
    'json.fail-on-missing-field' = 'false',
    'json.ignore-parse-errors' = 'false'
)"""


def sink_ddl(topic: str, bootstrap: str) -> str:
    """The view's rows, upserted into (and tombstoned out of) a Kafka topic."""
    return f"""
CREATE TABLE home (
    user_id BIGINT,
    tweet_id BIGINT,
    created_at BIGINT,
    PRIMARY KEY (user_id, tweet_id) NOT ENFORCED
) WITH (
    'connector' = 'upsert-kafka',
    'topic' = '{topic}',
    'properties.bootstrap.servers' = '{bootstrap}',
    'key.format' = 'json',
    'value.format' = 'json'
)"""


def view_sql(cap: int) -> str:
    """DESIGN §4 for every user: the view's INSERT (``cap`` 0 = no cap)."""
    joined = """
        SELECT f.follower_id AS user_id, t.tweet_id, t.created_at
        FROM live_tweets t JOIN live_follows f ON f.followee_id = t.author_id"""
    if cap:
        joined = f"""
        SELECT user_id, tweet_id, created_at FROM (
            SELECT user_id, tweet_id, created_at,
                   ROW_NUMBER() OVER (PARTITION BY user_id
                                      ORDER BY created_at DESC, tweet_id DESC) AS rn
            FROM ({joined}))
        WHERE rn <= {int(cap)}"""
    return f"""
INSERT INTO home
WITH latest_edges AS (
    SELECT follower_id, followee_id, op FROM (
        SELECT follower_id, followee_id, op,
               ROW_NUMBER() OVER (PARTITION BY follower_id, followee_id
                                  ORDER BY created_at DESC, `offset` DESC) AS rn
        FROM follows_log WHERE op IN ('follow', 'unfollow'))
    WHERE rn = 1
), live_follows AS (
    SELECT follower_id, followee_id FROM latest_edges WHERE op = 'follow'
), posts AS (
    SELECT tweet_id, author_id, created_at FROM (
        SELECT tweet_id, author_id, created_at,
               ROW_NUMBER() OVER (PARTITION BY tweet_id ORDER BY `offset` ASC) AS rn
        FROM tweets_log WHERE op = 'post')
    WHERE rn = 1
), live_tweets AS (
    SELECT p.tweet_id, p.author_id, p.created_at FROM posts p
    WHERE NOT EXISTS (SELECT 1 FROM tweets_log d
                      WHERE d.op = 'delete' AND d.tweet_id = p.tweet_id)
){joined}
"""


# --- the run ----------------------------------------------------------------------


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)


def read_view(bootstrap: str, topic: str) -> tuple[set[Row], int]:
    """The rows an upsert-kafka topic holds at the end (tombstones applied); its records."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fanout-flink-check",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in partitions}
        pending = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        held: dict[Row, bool] = {}
        records = 0
        deadline = time.monotonic() + 600
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {records} records of {topic}, not to its end")
            for message in consumer.consume(10_000, timeout=1.0):
                error, partition = message.error(), message.partition() or 0
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(partition)
                        continue
                    raise RuntimeError(f"reading {topic}: {error}")
                records += 1
                key = json.loads(message.key() or b"null")
                row = (int(key["user_id"]), int(key["tweet_id"]))
                if message.value() is None:
                    held.pop(row, None)
                else:
                    held[row] = True
                if (message.offset() or 0) + 1 >= ends[partition]:
                    pending.discard(partition)
        return set(held), records
    finally:
        consumer.close()


def _jvm_peak_rss_mb() -> float:
    """Peak RSS (VmHWM) of this process's java children: PyFlink's gateway JVM."""
    total = 0.0
    me = str(os.getpid())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("PPid", "").strip() == me and fields.get("Name", "").strip() == "java":
            total += int(fields.get("VmHWM", "0 kB").split()[0]) / 1024
    return total


def table_env(bootstrap: str, prefix: str, mode: str, parallelism: int, heap: str, jar: Path,
              log_dir: Path) -> Any:
    """PyFlink's TableEnvironment (its JVM started) with the two changelog tables."""
    os.environ["JVM_ARGS"] = f"-Xms{heap} -Xmx{heap}"
    os.environ.setdefault("FLINK_LOG_DIR", str(log_dir))
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    conf = Configuration()
    for key, value in {
        "parallelism.default": str(parallelism),
        "table.exec.resource.default-parallelism": str(parallelism),
        "pipeline.jars": jar.resolve().as_uri(),
        "rest.bind-address": "127.0.0.1",
        "rest.address": "127.0.0.1",
        # Batch mode's sorts and hash joins use managed memory (off the heap).
        "taskmanager.memory.managed.size": "512m",
        "state.backend.type": "hashmap",
        "table.exec.mini-batch.enabled": "true",
        "table.exec.mini-batch.allow-latency": "1 s",
        "table.exec.mini-batch.size": str(MINI_BATCH_ROWS),
        # Every change of one (user_id, tweet_id) comes from the one Top-N task of that
        # user, in order: the sink needs no upsert materializer (state of its own).
        "table.exec.sink.upsert-materialize": "NONE",
        # The connector's admin client logs at its close, after the job's class loader
        # (which loaded the jar) is released: a stack trace on stderr, not an error.
        "classloader.check-leaked-classloader": "false",
    }.items():
        conf.set_string(key, value)
    builder = EnvironmentSettings.new_instance().with_configuration(conf)
    builder = builder.in_streaming_mode() if mode == "streaming" else builder.in_batch_mode()
    env = TableEnvironment.create(builder.build())
    group = f"fanout-flink-{mode}-{os.getpid()}"
    env.execute_sql(source_ddl(
        "follows_log", f"{prefix}follows",
        "op STRING, follower_id BIGINT, followee_id BIGINT, created_at BIGINT",
        bootstrap, group))
    env.execute_sql(source_ddl(
        "tweets_log", f"{prefix}tweets",
        "op STRING, tweet_id BIGINT, author_id BIGINT, created_at BIGINT",
        bootstrap, group))
    return env


def run_flink(bootstrap: str, prefix: str, mode: str, cap: int, parallelism: int, heap: str,
              jar: Path, log_dir: Path) -> tuple[Run, float, int]:
    """The view as one Flink SQL job; its rows, and of the timing the submit part."""
    from pyflink.version import __version__ as version

    env = table_env(bootstrap, prefix, mode, parallelism, heap, jar, log_dir)
    topic = f"{prefix}flink_home_{mode}_{os.getpid()}"  # a topic per run (--repeat)
    _create_topic(bootstrap, topic, max(1, parallelism))
    env.execute_sql(sink_ddl(topic, bootstrap))

    started = time.perf_counter()
    result = env.execute_sql(view_sql(cap))
    submitted = time.perf_counter()
    result.wait()
    seconds = time.perf_counter() - started
    peak = _peak_rss_mb() + _jvm_peak_rss_mb()
    rows, records = read_view(bootstrap, topic)
    return Run(rows, seconds, 1, version, peak), submitted - started, records


def measure(args: argparse.Namespace) -> FlinkResult:
    """Run the job on the topics and check its view against :func:`peers.brute`."""
    events = read_events(args.events)
    jar = args.jar or cached_connector()
    with tempfile.TemporaryDirectory(prefix="fanout-flink-") as logs:
        run, submit_s, records = run_flink(args.bootstrap, args.prefix, args.mode, args.cap,
                                           args.parallelism, args.heap, jar, Path(logs))
    expected = brute(events, args.cap)
    mismatches = len(run.rows ^ expected)
    engine = next(name for name, mode in ENGINES.items() if mode == args.mode)
    return FlinkResult(
        engine=engine, events=len(events),
        applied=sum(1 for event in events if event.kind != 4),  # peers.OTHER
        seconds=round(run.seconds, 3),
        events_per_s=round(len(events) / run.seconds, 1) if run.seconds else 0.0,
        view_rows=len(run.rows), equal_to_brute=mismatches == 0, mismatches=mismatches,
        threads=args.parallelism, version=run.version, peak_rss_mb=round(run.peak_rss_mb, 1),
        cap=args.cap, batch=MINI_BATCH_ROWS if args.mode == "streaming" else 0,
        steps=run.steps, mode=args.mode, parallelism=args.parallelism, heap=args.heap,
        submit_s=round(submit_s, 3), sink_records=records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true",
                        help=f"make {VENV} with {' '.join(REQUIREMENTS)} and fetch {CONNECTOR}")
    parser.add_argument("--bootstrap", help="host:port of the broker holding the changelog")
    parser.add_argument("--prefix", default="", help="the changelog topics' name prefix")
    parser.add_argument("--events", type=Path, help="the same events as JSONL, for the check")
    parser.add_argument("--out", type=Path, help="where to write the result JSON")
    parser.add_argument("--mode", choices=MODES, default="streaming")
    parser.add_argument("--cap", type=int, default=800, help="N of LIMIT N; 0 = no cap")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--heap", default=DEFAULT_HEAP, help="the JVM's heap, e.g. 3g")
    parser.add_argument("--jar", type=Path, help="the connector jar (default: the jar cache's)")
    parser.add_argument("--explain", action="store_true",
                        help="print Flink's plan of the view's INSERT and exit (no broker needed)")
    args = parser.parse_args(argv)
    if args.setup:
        print(ensure_venv())
        print(ensure_connector())
        return 0
    if args.explain:
        with tempfile.TemporaryDirectory(prefix="fanout-flink-") as logs:
            env = table_env(args.bootstrap or "127.0.0.1:9", args.prefix, args.mode,
                            args.parallelism, args.heap, args.jar or cached_connector(),
                            Path(logs))
            env.execute_sql(sink_ddl(f"{args.prefix}flink_home_{args.mode}", "127.0.0.1:9"))
            print(env.explain_sql(view_sql(args.cap)))
        return 0
    if args.bootstrap is None or args.events is None or args.out is None:
        parser.error("--bootstrap, --events and --out are required (or --setup)")
    if args.cap < 0 or args.parallelism < 1:
        parser.error("--cap >= 0 and --parallelism >= 1")
    result = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(result), indent=2) + "\n")
    print(f"{summary(result)}, {args.mode}, parallelism {args.parallelism}, heap {args.heap}, "
          f"{result.sink_records:,} sink records", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
