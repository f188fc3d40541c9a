"""A local Apache Cassandra node from the Maven jar cache: one JVM on loopback.

This module owns the node's lifecycle for ``fanout up --store cassandra`` and the tests
(DESIGN §6, §9, §10): write a ``cassandra.yaml`` and a logback config into the data
directory, spawn ``CassandraDaemon`` on Java 17 from the cached ``cassandra-all`` jars
(:mod:`infra.services.jars`), detached in its own session with its log in a file, wait (bounded)
until cassandra-driver runs a query on it, and stop it (SIGTERM, on which Cassandra
drains its memtables to disk; SIGKILL after a timeout). The node is sized to share a
2-core machine with Spark and Kafka: a small heap, few request and compaction
threads, one token, small caches. Everything it writes — data, commit log, hints,
saved caches — lives under the caller's data directory, so a stop and a start keep
the data; the ports it used are recorded there too and taken again when still free.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from infra.errors import InfraError
from infra.services import procs
from infra.services.jars import CASSANDRA, classpath
from infra.services.ports import PORT_ATTEMPTS, PortTaken, on_other_ports
from infra.services.process import (
    JIT_OPTIONS,
    LOOPBACK,
    free_port,
    log_tail,
    logged_since,
    port_free,
    terminate,
    timer_slack,
)

log = logging.getLogger(__name__)

MAIN_CLASS: Final = "org.apache.cassandra.service.CassandraDaemon"
PORTS_FILE: Final = "ports.json"
PID_FILE: Final = "cassandra.pid"
#: Lines of Cassandra's log a failed start reports.
_TAIL_LINES: Final = 25
#: What Cassandra (or the JVM's JMX agent) logs when a port it wants is taken.
_BIND_FAILURES: Final = ("Address already in use", "Failed to bind port", "Unable to bind",
                         "Port already in use", "in use by another process")

#: The module-system lines of Cassandra 5.0's ``conf/jvm17-server.options``: without
#: them Java 17 refuses the reflection Cassandra's internals do at startup.
_JPMS: Final = (
    "--add-exports", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports", "java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports", "java.sql/java.sql=ALL-UNNAMED",
    "--add-exports", "java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports", "jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports", "jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports", "jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/java.io=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens", "jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
)
#: Milliseconds between ticks of the node's approximate clock, which times requests out
#: (Cassandra's default: 2). At 10 an idle node takes 0.66 CPU-s a minute, not 0.94
#: (design §10).
CLOCK_TICK_MS: Final = 10
#: G1 as Cassandra's jvm17-server.options sets it, with the GC threads capped for 2 cores.
_GC: Final = ("-XX:+UseG1GC", "-XX:+ParallelRefProcEnabled", "-XX:MaxTenuringThreshold=1",
              "-XX:MaxGCPauseMillis=300", "-XX:InitiatingHeapOccupancyPercent=70",
              "-XX:ParallelGCThreads=2", "-XX:ConcGCThreads=1")
#: The node's timer slack (ns): how late the kernel may wake its sleeping threads. After
#: each burst of requests the shared request pool's idle workers poll in ~10 µs sleeps
#: for ~10 ms. At Linux's default slack (50 µs) a read 20 ms after the last cost the
#: node 8.5 ms of CPU, at 1 ms 2.8 ms, for at most ~0.5 ms more latency
#: (``benchmarks/bench_cassandra_idle.py``); on a busy node the pool rarely idles.
TIMER_SLACK_NS: Final = 1_000_000
_LOGBACK: Final = """<configuration scan="false">
  <appender name="OUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%-5level %date{ISO8601} [%thread] %logger{0} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="OUT"/></root>
</configuration>
"""


class CassandraError(InfraError):
    """The local Cassandra node could not be started, or did not answer in time."""


@dataclass(frozen=True)
class Ports:
    """The node's loopback ports: CQL (native), inter-node (storage), and local JMX."""

    native: int
    storage: int
    jmx: int


#: The memtable implementations a node can default its tables to (Cassandra 5.0 ships
#: both): ``skiplist``, the concurrent skip list of every earlier version, and ``trie``
#: (CEP-19). ``benchmarks/bench_cql_batches.py --memtable`` weighs them.
MEMTABLES: Final = {"skiplist": "SkipListMemtable", "trie": "TrieMemtable"}
MEMTABLE: Final = "skiplist"

#: How far a node's JVM compiles its hot code: ``c1`` stops at C1, as Spark's and the
#: Kafka node's JVMs do (:data:`infra.services.process.JIT_OPTIONS`); ``c2`` is the JVM's
#: default, C2 after C1. ``benchmarks/bench_cql_batches.py --jit`` weighs them on a fresh
#: node, ``benchmarks/bench_sink_requests.py --jits`` over a steady load (docs/design.md §10).
JITS: Final = {"c1": tuple(JIT_OPTIONS.split()), "c2": ()}
JIT: Final = "c1"
#: Chooses the JIT of every local node that does not name one (``fanout up``'s, the
#: benchmarks'); unset, :data:`JIT`.
JIT_ENV: Final = "FANOUT_CASSANDRA_JIT"


def node_jit() -> str:
    """The JIT of a local node that names none: ``FANOUT_CASSANDRA_JIT``, else :data:`JIT`."""
    return os.environ.get(JIT_ENV) or JIT


class LocalCassandra:
    """One Cassandra 5.0 node on loopback, its files under ``data_dir``.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. The constructor
    does no I/O. Once started, ``hosts`` (``127.0.0.1:PORT``, the form of
    ``FANOUT_CASSANDRA_HOSTS`` and of a ``cassandra://HOSTS/keyspace`` URL), ``port``
    and ``pid`` say where it is; ``started_in`` is the seconds from spawn to the first
    query answered. Starting again on the same ``data_dir`` finds the data there,
    and the same native port when it is still free.
    """

    def __init__(self, data_dir: Path | str, log_path: Path | str | None = None, *,
                 heap_mb: int = 768, start_timeout: float = 180.0, stop_timeout: float = 60.0,
                 java: str = "java", jar_root: Path | None = None,
                 timer_slack_ns: int = TIMER_SLACK_NS, commitlog: str = "batch",
                 memtable: str = MEMTABLE, jit: str | None = None,
                 clock_tick_ms: int = CLOCK_TICK_MS) -> None:
        jit = jit or node_jit()
        if commitlog not in COMMITLOG_SYNC:
            msg = f"commitlog must be one of {', '.join(COMMITLOG_SYNC)}, not {commitlog!r}"
            raise CassandraError(msg)
        if memtable not in MEMTABLES:
            msg = f"memtable must be one of {', '.join(MEMTABLES)}, not {memtable!r}"
            raise CassandraError(msg)
        if jit not in JITS:
            msg = f"jit ({JIT_ENV}) must be one of {', '.join(JITS)}, not {jit!r}"
            raise CassandraError(msg)
        self.jit = jit  # how far the JVM compiles (JITS)
        self.commitlog = commitlog  # how writes wait for the log's fsync (node_yaml)
        self.memtable = memtable  # the tables' default memtable (node_yaml)
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path) if log_path else self.data_dir / "logs" / "system.log"
        self.heap_mb = heap_mb
        self.timer_slack_ns = timer_slack_ns  # 0: the system's own
        self.clock_tick_ms = clock_tick_ms  # cassandra.approximate_time_precision_ms
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.started_in: float | None = None
        self._java = java
        self._jar_root = jar_root
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._ports: Ports | None = None

    # -- where it is ---------------------------------------------------------------------
    @property
    def hosts(self) -> str:
        """``127.0.0.1:PORT``: contact points in the form store URLs take."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def port(self) -> int:
        """The CQL (native protocol) port."""
        self._require_started()
        assert self._ports is not None
        return self._ports.native

    @property
    def ports(self) -> Ports:
        """Every port the node listens on."""
        self._require_started()
        assert self._ports is not None
        return self._ports

    @property
    def pid(self) -> int:
        """Process id of the node's JVM."""
        return self._require_started().pid

    @property
    def marker(self) -> str:
        """Its command line names its data directory, and no other node's does."""
        return str(self.data_dir)

    def ready(self) -> bool:
        """Whether it runs and answers a CQL query now."""
        if self._process is None or self._process.poll() is not None:
            return False
        host, port = self.hosts.rsplit(":", 1)
        return _query(int(port), 2.0, host) is None

    def url(self, keyspace: str, options: str = "") -> str:
        """A ``cassandra://`` store URL naming ``keyspace`` on this node."""
        return f"cassandra://{self.hosts}/{keyspace}" + (f"?{options}" if options else "")

    def rss_bytes(self) -> int:
        """Resident memory of the JVM now, in bytes."""
        pid = self.pid
        if not (found := procs.rss(pid)):
            msg = f"the Cassandra JVM (pid {pid}) is gone"
            raise CassandraError(msg)
        return found

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> LocalCassandra:
        """Spawn the node and return once a CQL query is answered (bounded by start_timeout)."""
        if self._process is not None:
            msg = f"Cassandra already started (pid {self._process.pid})"
            raise CassandraError(msg)
        jars = classpath(CASSANDRA, self._jar_root)  # JarError says to run `make install`
        java = self._find_java()
        self._refuse_a_running_node()
        self._make_dirs()
        self._log_file = self.log_path.open("ab")
        began = time.monotonic()
        deadline = began + self.start_timeout

        def attempt(number: int) -> None:
            self._ports = choose_ports(self.data_dir, reuse=number == 1)
            if not self._spawn(java, jars, deadline):
                raise PortTaken(self.log_path)

        def lost() -> CassandraError:
            return CassandraError(f"Cassandra did not start after {PORT_ATTEMPTS} attempts, "
                                  f"each losing a port to another process; see {self.log_path}")

        on_other_ports(attempt, PORT_ATTEMPTS, "Cassandra", lost=lost, undo=self.stop)
        self.started_in = time.monotonic() - began
        self._record()
        log.info("Cassandra pid %d on %s answered CQL after %.1fs (log %s)",
                 self.pid, self.hosts, self.started_in, self.log_path)
        return self

    def stop(self) -> None:
        """SIGTERM (Cassandra drains to disk), then SIGKILL after ``stop_timeout``."""
        process, self._process = self._process, None
        if process is not None:
            terminate(process, self.stop_timeout, "Cassandra")
            (self.data_dir / PID_FILE).unlink(missing_ok=True)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def kill(self) -> None:
        """SIGKILL the node at once, as a crash would (the commit log has the data)."""
        process = self._require_started()
        process.kill()
        process.wait(self.stop_timeout)
        self.stop()

    def __enter__(self) -> LocalCassandra:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- start, step by step -------------------------------------------------------------
    def _find_java(self) -> str:
        java = shutil.which(self._java)
        if java is None:
            msg = (f"no {self._java!r} on PATH: Cassandra 5.0 needs Java 17 "
                   "(on Debian/Ubuntu: sudo apt-get install -y openjdk-17-jdk-headless)")
            raise CassandraError(msg)
        return java

    def _refuse_a_running_node(self) -> None:
        """Two JVMs on one data directory corrupt it: refuse while a recorded one lives."""
        pid = running_pid(self.data_dir)
        if pid is not None:
            msg = (f"a Cassandra node (pid {pid}) already runs on {self.data_dir}: stop it "
                   "first (`fanout down`, or kill it)")
            raise CassandraError(msg)

    def _make_dirs(self) -> None:
        for sub in ("data", "commitlog", "saved_caches", "hints", "cdc_raw", "logs",
                    "triggers"):
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logback.xml").write_text(_LOGBACK)

    def _spawn(self, java: str, jars: list[Path], deadline: float) -> bool:
        """Start one JVM; True once it answers CQL, False if it lost a port at start."""
        assert self._ports is not None and self._log_file is not None
        (self.data_dir / "cassandra.yaml").write_text(
            node_yaml(self.data_dir, self._ports, self.commitlog, self.memtable))
        offset = self._log_file.seek(0, os.SEEK_END)
        self._process = self._popen([java, *self._jvm_options(jars), MAIN_CLASS])
        (self.data_dir / PID_FILE).write_text(str(self._process.pid))
        if _wait_until_serving(self._process, self._ports.native, deadline, self.log_path):
            return True
        code = self._process.returncode
        self._process = None
        (self.data_dir / PID_FILE).unlink(missing_ok=True)
        if lost_a_port(self.log_path, offset):
            return False
        tail = log_tail(self.log_path, _TAIL_LINES, offset)
        msg = (f"Cassandra exited during start (exit code {code}); the end of its log "
               f"{self.log_path}:\n{tail}")
        raise CassandraError(msg)

    def _popen(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """The JVM, its output to the log, in a session of its own (:data:`TIMER_SLACK_NS`)."""
        with timer_slack(self.timer_slack_ns):
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                    stderr=subprocess.STDOUT, cwd=self.data_dir,
                                    start_new_session=True)

    def _jvm_options(self, jars: list[Path]) -> list[str]:
        assert self._ports is not None
        jamm = next((j for j in jars if j.name.startswith("jamm-")), None)
        agent = [f"-javaagent:{jamm}"] if jamm else []  # measures memtable sizes
        data = self.data_dir.resolve()
        return [
            f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m", "-Xss256k", *_GC, *JITS[self.jit],
            "-XX:+PerfDisableSharedMem", "-XX:+ExitOnOutOfMemoryError", "-Djava.net.preferIPv4Stack=true",
            "-Djdk.attach.allowAttachSelf=true", *_JPMS, *agent,
            "-Dio.netty.tryReflectionSetAccessible=true",
            "-Dio.netty.allocator.useCacheForAllThreads=true", "-Dio.netty.allocator.maxOrder=11",
            f"-Dcassandra.config=file://{data / 'cassandra.yaml'}",
            "-Dcassandra-foreground=yes", f"-Dcassandra.storagedir={data}",
            f"-Dcassandra.logdir={data / 'logs'}", f"-Dcassandra.triggers_dir={data / 'triggers'}",
            f"-Dlogback.configurationFile=file://{data / 'logback.xml'}",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            f"-Dcassandra.approximate_time_precision_ms={self.clock_tick_ms}",
            # JMX for nodetool, bound to loopback only (Cassandra's "local" JMX server).
            f"-Dcassandra.jmx.local.port={self._ports.jmx}",
            f"-Djava.rmi.server.hostname={LOOPBACK}",
            "-cp", os.pathsep.join(map(str, jars)),
        ]

    def _record(self) -> None:
        assert self._ports is not None
        (self.data_dir / PORTS_FILE).write_text(json.dumps(asdict(self._ports)) + "\n")

    def _require_started(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            msg = "Cassandra is not running: call start() first"
            raise CassandraError(msg)
        return self._process


#: ``commitlog_sync`` settings a local node can take: the default, ``batch``, and the two a
#: benchmark weighs it against (``benchmarks/bench_cql_batches.py --commitlog``).
#: ``periodic`` acknowledges writes before their fsync: a SIGKILL loses some.
COMMITLOG_SYNC: Final = {
    "batch": "commitlog_sync: batch",
    "group": "commitlog_sync: group\ncommitlog_sync_group_window: 10ms",
    "periodic": "commitlog_sync: periodic\ncommitlog_sync_period: 10000ms",
}


def node_yaml(data_dir: Path, ports: Ports, commitlog: str = "batch",
              memtable: str = MEMTABLE) -> str:
    """The node's ``cassandra.yaml``: loopback, one token, small pools and caches.

    Only keys Cassandra 5.0's ``Config`` knows (its loader rejects others); the rest
    keep their defaults. ``auto_snapshot: false`` because the tests drop a keyspace
    per module, and a snapshot per drop would only fill the disk.
    """
    data = data_dir.resolve()

    def path(sub: str) -> str:
        return json.dumps(str(data / sub))  # a JSON string is a YAML scalar

    configurations = "\n".join(f"    {name}:\n      class_name: {cls}"
                               for name, cls in MEMTABLES.items())

    return f"""\
cluster_name: fanout-local
num_tokens: 1
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{LOOPBACK}:{ports.storage}"
listen_address: {LOOPBACK}
rpc_address: {LOOPBACK}
storage_port: {ports.storage}
native_transport_port: {ports.native}
start_native_transport: true
data_file_directories: [{path("data")}]
commitlog_directory: {path("commitlog")}
saved_caches_directory: {path("saved_caches")}
hints_directory: {path("hints")}
cdc_raw_directory: {path("cdc_raw")}
# A write is acknowledged once its commit log is synced: the view job never writes an
# applied batch again, so a write the node loses in a crash is lost from the view. With
# the log synced every 10 s (periodic), a SIGKILL lost 120 of 20,000 acknowledged writes.
# A sync per write group (batch), 32 writer threads sharing each: the demo's history went
# through the executor sink in 31.6 s against 45.3 s with group sync's 10 ms window, whose
# wait each of the sink's phases pays, though group took bulk adds alone faster (74k
# against 54k rows/s; benchmarks/RESULTS.md, "The Cassandra store").
{COMMITLOG_SYNC[commitlog]}
commitlog_segment_size: 8MiB
commitlog_total_space: 256MiB
memtable:
  configurations:
{configurations}
    default:
      inherits: {memtable}
concurrent_reads: 4
concurrent_writes: 32
concurrent_counter_writes: 2
concurrent_materialized_view_writes: 2
concurrent_compactors: 1
native_transport_max_threads: 32
memtable_heap_space: 96MiB
memtable_offheap_space: 96MiB
file_cache_size: 32MiB
networking_cache_size: 16MiB
key_cache_size: 16MiB
counter_cache_size: 0MiB
prepared_statements_cache_size: 8MiB
auto_snapshot: false
"""


def choose_ports(data_dir: Path, *, reuse: bool = True) -> Ports:
    """The ports recorded in ``data_dir`` where still free (if ``reuse``), else fresh ones.

    Clients that knew the node find it where it was; a port another process holds
    now is replaced rather than failing the start.
    """
    old = _load_ports(data_dir) if reuse else None
    taken: set[int] = set()

    def pick(previous: int | None) -> int:
        port = previous if previous and previous not in taken and port_free(previous) else None
        while port is None or port in taken:
            port = free_port()
        taken.add(port)
        return port

    return Ports(pick(old.native if old else None), pick(old.storage if old else None),
                 pick(old.jmx if old else None))


def running_pid(data_dir: Path) -> int | None:
    """The pid of a live Cassandra JVM recorded in ``data_dir``, if there is one."""
    try:
        pid = int((data_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    config = f"-Dcassandra.config=file://{(data_dir / 'cassandra.yaml').resolve()}"
    return pid if procs.running(pid, config) else None


def _load_ports(data_dir: Path) -> Ports | None:
    try:
        return Ports(**json.loads((data_dir / PORTS_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def lost_a_port(log_path: Path, since: int) -> bool:
    """Whether the node's log after byte ``since`` says it could not bind a port.

    The whole of it: Cassandra logs the storage port's message before its stack trace
    and its shutdown hooks, past any tail an error message shows.
    """
    try:
        text = logged_since(log_path, since)
    except OSError:
        return False
    return any(marker in text for marker in _BIND_FAILURES)


def _wait_until_serving(process: subprocess.Popen[bytes], port: int, deadline: float,
                        log_path: Path) -> bool:
    """Wait for the CQL port to accept, then for a query to answer; False if it exited."""
    while not _accepts(port):
        if process.poll() is not None:
            return False
        _check_deadline(deadline, f"Cassandra to accept CQL connections on {LOOPBACK}:{port}",
                        log_path)
        time.sleep(0.25)
    while True:
        if process.poll() is not None:
            return False
        error = _query(port, max(1.0, min(10.0, deadline - time.monotonic())))
        if error is None:
            return True
        log.debug("Cassandra on port %d not answering yet: %s", port, error)
        _check_deadline(deadline, f"Cassandra on {LOOPBACK}:{port} to answer a CQL query "
                        f"(last error: {error})", log_path)
        time.sleep(0.5)


def _query(port: int, timeout: float, host: str = LOOPBACK) -> str | None:
    """Run one query on the node; None on success, else the error's text."""
    from cassandra import DriverException
    from cassandra.cluster import Cluster, NoHostAvailable
    from cassandra.policies import RoundRobinPolicy

    cluster = Cluster([host], port=port, protocol_version=5, connect_timeout=timeout,
                      load_balancing_policy=RoundRobinPolicy(), control_connection_timeout=timeout)
    try:
        session = cluster.connect()
        session.execute("SELECT release_version FROM system.local", timeout=timeout)
        return None
    except (DriverException, NoHostAvailable, OSError) as exc:
        return str(exc)
    finally:
        cluster.shutdown()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _check_deadline(deadline: float, awaited: str, log_path: Path) -> None:
    if time.monotonic() >= deadline:
        msg = f"timed out waiting for {awaited}; see {log_path}"
        raise CassandraError(msg)


# -- the foreground service ----------------------------------------------------------------

def register(sub: argparse._SubParsersAction) -> None:
    """``fanout cassandra``: run the local node in the foreground until SIGTERM/SIGINT."""
    p = sub.add_parser("cassandra", help="run a local Cassandra node on loopback (foreground)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="its data, commit log and config (default <run>/cassandra)")
    p.add_argument("--log", type=Path, default=None,
                   help="Cassandra's own log (default <run>/logs/cassandra-node.log)")
    p.add_argument("--heap-mb", type=int, default=768, help="JVM heap in MiB (default 768)")
    p.add_argument("--start-timeout", type=float, default=180.0, metavar="SECONDS",
                   help="how long to wait for the first CQL answer (default 180)")
    p.add_argument("--ready-file", type=Path, default=None,
                   help="write the contact point (127.0.0.1:PORT) here once it answers CQL")
    p.set_defaults(func=_cmd_cassandra)


def _cmd_cassandra(args: argparse.Namespace) -> int:
    run_dir = Path(getattr(args, "run_dir", None) or "run")
    node = LocalCassandra(args.data_dir or run_dir / "cassandra",
                          args.log or run_dir / "logs" / "cassandra-node.log",
                          heap_mb=args.heap_mb, start_timeout=args.start_timeout,
                          stop_timeout=20.0)
    return run_foreground(node, args.ready_file)


def run_foreground(node: LocalCassandra, ready_file: Path | None = None) -> int:
    """Start ``node``, write its contact point to ``ready_file``, stop on SIGTERM/SIGINT."""
    import threading

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with node:
        log.info("Cassandra ready on %s in %.1fs, RSS %.0f MiB", node.hosts,
                 node.started_in or 0.0, node.rss_bytes() / 2**20)
        if ready_file is not None:
            ready_file.write_text(node.hosts)
        while not stop.wait(1.0):
            if node._require_started().poll() is not None:
                log.error("Cassandra pid %d exited; see %s", node.pid, node.log_path)
                return 1
    return 0
