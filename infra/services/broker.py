"""The local broker: one Apache Kafka node in KRaft mode, its log on disk.

This module owns the broker's lifecycle for ``fanout up`` and the tests (DESIGN §9,
§10): one JVM that is both broker and controller, listening on loopback, started
from the cached ``kafka_2.13`` jars (:mod:`infra.services.jars`) with ``kafka.Kafka``. Its
topics live in ``<data_dir>/log``, formatted once (``kafka.tools.StorageTool``), so a
restart — ``fanout down``/``up``, a SIGKILL, a reboot — finds every record again.

Ports are chosen at the first start and reused after (recorded in
``<data_dir>/ports.json``), so clients that outlive the broker find it again; when a
port is taken by something else, another is chosen and the caller sees the new
:attr:`KafkaBroker.bootstrap`. Small heap, few threads: it shares two cores with Spark
and Cassandra. Retention is unlimited: the log is the source of truth.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from infra.errors import InfraError
from infra.services.jars import KAFKA, classpath
from infra.services.ports import PORT_ATTEMPTS, PortTaken, on_other_ports
from infra.services.process import (
    JIT_OPTIONS,
    LOOPBACK,
    Heartbeat,
    free_port,
    log_tail,
    logged_since,
    port_free,
    terminate,
)

log = logging.getLogger(__name__)

_NODE_ID: Final = 1

#: How often the controller appends a no-op record to an idle metadata log: Kafka's
#: default, and this node's. At 10 s an idle node takes 1.02 CPU-s a minute, not 1.26
#: (design §10).
KAFKA_METADATA_IDLE_MS: Final = 500
METADATA_IDLE_MS: Final = 10_000

SERVER_PROPERTIES: Final = """\
# Written by fanout (infra/services/broker.py) at every start; edits are overwritten.
process.roles=broker,controller
node.id={node}
controller.quorum.voters={node}@{host}:{controller_port}
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={log_dir}
auto.create.topics.enable=false
num.partitions=4
log.retention.ms=-1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.cleaner.dedupe.buffer.size=2097152
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=2
num.replica.fetchers=1
metadata.max.idle.interval.ms={metadata_idle_ms}
"""

LOG4J2: Final = """\
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = info
"""


class BrokerError(InfraError):
    """The broker could not be started or did not answer in time."""


#: The node's JIT (:data:`infra.services.process.JIT_OPTIONS`): it shares the machine with the job.
JIT: Final = tuple(JIT_OPTIONS.split())


class KafkaBroker:
    """One KRaft Kafka node on loopback with its log in ``data_dir``.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. The constructor
    does no I/O. ``bootstrap`` and ``pid`` are available once started. ``port`` asks
    for a port (e.g. the one clients already use); by default the one of the last
    start, or a free one. The JVM runs in its own session, so it outlives the Python
    process that started it (``fanout up``); :meth:`stop` stops it.

    ``heap_mb`` is the JVM's whole heap (``-Xms`` = ``-Xmx``). 256 MB serves one
    machine's stack: with it the broker's RSS during the ego-twitter replay was
    353–366 MB against 411–518 MB at 512, at the same replay speed
    (benchmarks/RESULTS.md, "Bulk replay, burst and memory"). Kafka's own start script: 1 GB.
    """

    def __init__(self, data_dir: Path | str, log_path: Path | str | None = None, *,
                 port: int | None = None, heap_mb: int = 256, start_timeout: float = 90.0,
                 stop_timeout: float = 30.0, jar_root: Path | None = None,
                 metadata_idle_ms: int = METADATA_IDLE_MS) -> None:
        self.data_dir = Path(data_dir)
        self.metadata_idle_ms = metadata_idle_ms
        self.log_path = Path(log_path) if log_path else self.data_dir / "kafka.out"
        self.heap_mb = heap_mb
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._jar_root = jar_root
        self._wanted_port = port
        self._ports: tuple[int, int] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for Kafka clients."""
        self._require_started()
        assert self._ports is not None
        return f"{LOOPBACK}:{self._ports[0]}"

    @property
    def pid(self) -> int:
        """Process id of the broker's JVM."""
        return self._require_started().pid

    @property
    def config_path(self) -> Path:
        """The ``server.properties`` this broker runs with (its command line names it)."""
        return self.data_dir / "server.properties"

    @property
    def marker(self) -> str:
        """Its command line names its config file, and no other broker's does."""
        return str(self.config_path)

    def ready(self) -> bool:
        """Whether it runs and answers a metadata request now."""
        if self._process is None or self._process.poll() is not None:
            return False
        return answers(AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2}), 1.0)

    def start(self) -> KafkaBroker:
        """Start the JVM (formatting the log on first use); return once it answers."""
        if self._process is not None:
            msg = f"broker already started (pid {self._process.pid})"
            raise BrokerError(msg)
        jars = classpath(KAFKA, self._jar_root)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("ab")
        deadline = time.monotonic() + self.start_timeout

        def attempt(number: int) -> None:
            self._ports = self._choose_ports(fresh=number > 1)
            self._write_config()
            self._format(jars)
            logged = self.log_path.stat().st_size
            if self._spawn(jars, deadline):
                return
            if port_clash(self.log_path, logged):
                raise PortTaken(self.log_path)
            msg = (f"Kafka exited before it answered; the end of its log "
                   f"{self.log_path}:\n{log_tail(self.log_path)}")
            raise BrokerError(msg)

        def lost() -> BrokerError:
            return BrokerError(f"Kafka lost a port to another process at each of "
                               f"{PORT_ATTEMPTS} starts; the end of its log "
                               f"{self.log_path}:\n{log_tail(self.log_path)}")

        on_other_ports(attempt, PORT_ATTEMPTS, "Kafka", lost=lost, undo=self.stop)
        self._remember_ports()
        log.info("Kafka pid %d on %s (data %s, log %s)", self.pid, self.bootstrap,
                 self.data_dir, self.log_path)
        return self

    def stop(self) -> None:
        """Stop the broker: SIGTERM (a controlled shutdown), SIGKILL after ``stop_timeout``."""
        process, self._process = self._process, None
        if process is not None:
            terminate(process, self.stop_timeout, "Kafka")
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- start-up steps ----------------------------------------------------------------------

    def _choose_ports(self, *, fresh: bool) -> tuple[int, int]:
        """The wanted (or last) ports while free; free ones otherwise."""
        last = self._last_ports()
        port = None if fresh else (self._wanted_port or (last[0] if last else None))
        controller = None if fresh or last is None else last[1]
        if port is None or not port_free(port):
            if port is not None:
                log.warning("port %d is taken: Kafka moves to another", port)
            port = free_port()
        if controller is None or controller == port or not port_free(controller):
            controller = free_port()
            while controller == port:
                controller = free_port()
        return port, controller

    def _last_ports(self) -> tuple[int, int] | None:
        try:
            recorded = json.loads((self.data_dir / "ports.json").read_text())
            return int(recorded["port"]), int(recorded["controller_port"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _remember_ports(self) -> None:
        assert self._ports is not None
        port, controller = self._ports
        (self.data_dir / "ports.json").write_text(
            json.dumps({"port": port, "controller_port": controller}))

    def _write_config(self) -> None:
        assert self._ports is not None
        port, controller = self._ports
        self.config_path.write_text(SERVER_PROPERTIES.format(
            node=_NODE_ID, host=LOOPBACK, port=port, controller_port=controller,
            log_dir=self.data_dir / "log", metadata_idle_ms=self.metadata_idle_ms))
        (self.data_dir / "log4j2.properties").write_text(LOG4J2)

    def _java(self, jars: list[Path], main: str, *args: str) -> list[str]:
        return ["java", f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m", "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError", *JIT,
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile=file:{self.data_dir / 'log4j2.properties'}",
                "-cp", os.pathsep.join(map(str, jars)), main, *args]

    def _format(self, jars: list[Path]) -> None:
        """Format the log directory once (a KRaft node refuses an unformatted one)."""
        if (self.data_dir / "log" / "meta.properties").exists():
            return
        cluster_id = "-"
        while not cluster_id[0].isalnum():  # the tool's parser takes "-..." for an option
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        argv = [*self._java(jars, "kafka.tools.StorageTool"), "format", "-t", cluster_id,
                "-c", str(self.config_path)]
        argv[1:3] = ["-Xms64m", "-Xmx256m"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            said = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
            msg = f"formatting Kafka's log in {self.data_dir / 'log'} failed:\n{said}"
            raise BrokerError(msg)

    def _spawn(self, jars: list[Path], deadline: float) -> bool:
        """Start the JVM; False if it exited before answering (a port taken, say)."""
        argv = self._java(jars, "kafka.Kafka", str(self.config_path))
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        if wait_until_serving(self._process, self.bootstrap, deadline, self.log_path):
            return True
        self._process = None
        return False

    def _require_started(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            msg = "broker is not running: call start() first"
            raise BrokerError(msg)
        return self._process


def port_clash(log_path: Path, since: int) -> bool:
    """Whether the log written after byte ``since`` says a port was taken."""
    text = logged_since(log_path, since)
    return "BindException" in text or "Address already in use" in text


def wait_until_serving(process: subprocess.Popen[bytes], bootstrap: str,
                       deadline: float, log_path: Path) -> bool:
    """Wait until the broker answers a metadata request; False if it exited."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    beat = Heartbeat(f"waiting for Kafka on {bootstrap}")
    while True:
        beat()
        if process.poll() is not None:
            return False
        if time.monotonic() >= deadline:
            msg = (f"timed out waiting for Kafka on {bootstrap} to answer; the end of its log "
                   f"{log_path}:\n{log_tail(log_path)}")
            raise BrokerError(msg)
        if answers(admin, max(0.1, min(2.0, deadline - time.monotonic()))):
            return True
        time.sleep(0.2)


def answers(admin: AdminClient, timeout: float) -> bool:
    """Whether the cluster behind ``admin`` answers a metadata request within ``timeout``."""
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        log.debug("Kafka not answering yet: %s", exc)
        return False
    return True
