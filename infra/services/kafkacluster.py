"""A Kafka cluster on this machine: N KRaft nodes, each broker and controller at once.

This module owns the multi-node Kafka of ``fanout up --nodes N`` (DESIGN §10): every
node is a JVM of its own, started from the cached ``kafka_2.13`` jars like the single
node of :mod:`infra.services.broker`, with the same base ``server.properties`` — plus a static
``controller.quorum.voters`` naming all N controllers, replication factor N and
``min.insync.replicas`` a majority for the topics the brokers create themselves
(consumer offsets, transaction state), and a short broker session so that a killed
node is fenced, and its partitions get new leaders, within seconds. Each node keeps its
log under ``<data_dir>/node-<i>/log``; all are formatted once with one cluster id.

The ports of every node are chosen at the first start and kept in
``<data_dir>/cluster.json``: the voters list names them, so a node cannot move
alone. A restarted node (``fanout up`` after one was killed) takes its old ports; if
another process holds one, the start fails and says which port to free.

On hosts of their own (``fanout up --hosts``, :mod:`infra.services.hosts`) each node runs in
its host's network namespace and listens, advertises and votes on its host's address,
with the same two ports (:data:`HOST_PORTS`) on every host.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from confluent_kafka.admin import AdminClient

from infra.services.broker import (
    JIT,
    KAFKA_METADATA_IDLE_MS,
    LOG4J2,
    SERVER_PROPERTIES,
    BrokerError,
    answers,
    port_clash,
    wait_until_serving,
)
from infra.services.hosts import Host
from infra.services.jars import KAFKA, classpath
from infra.services.ports import PORT_ATTEMPTS, PortTaken, on_other_ports
from infra.services.process import LOOPBACK, free_port, port_free

log = logging.getLogger(__name__)

CLUSTER_FILE: Final = "cluster.json"

#: What a cluster changes in the single node's ``server.properties`` (``{rf}``: the
#: node count, ``{isr}``: a majority of it). A fenced broker loses its leaderships at
#: once; the session is short so that a SIGKILLed node is fenced in ~4 s, not 9.
_CLUSTER_OVERRIDES: Final = {
    "default.replication.factor": "{rf}",
    "min.insync.replicas": "{isr}",
    "offsets.topic.replication.factor": "{rf}",
    "transaction.state.log.replication.factor": "{rf}",
    "transaction.state.log.min.isr": "{isr}",
    "share.coordinator.state.topic.replication.factor": "{rf}",
    "share.coordinator.state.topic.min.isr": "{isr}",
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "1000",
    "replica.lag.time.max.ms": "10000",
    "unclean.leader.election.enable": "false",
}


def min_insync(replicas: int) -> int:
    """``min.insync.replicas`` for ``replicas`` copies: a majority (2 of 3).

    So an acknowledged write survives the loss of any minority of the nodes.
    """
    return replicas // 2 + 1


@dataclass(frozen=True)
class NodePorts:
    """One node's client (PLAINTEXT) and controller ports, on loopback."""

    port: int
    controller_port: int


#: Every node's ports when each has a host (and an address) of its own.
HOST_PORTS: Final = NodePorts(9092, 9093)


class KafkaCluster:
    """``nodes`` KRaft nodes on loopback; node ids are 1..nodes.

    The constructor does no I/O. :meth:`start` starts the nodes that are not running
    (all of them the first time) and returns once each answers; the JVMs run in
    sessions of their own, so they outlive the process that started them and are
    stopped by pid (``fanout down``) or :meth:`stop`.
    """

    def __init__(self, data_dir: Path | str, log_dir: Path | str, *, nodes: int = 3,
                 heap_mb: int = 256, start_timeout: float = 180.0,
                 jar_root: Path | None = None, hosts: dict[int, Host] | None = None) -> None:
        if nodes < 1:
            msg = f"a Kafka cluster needs at least one node, not {nodes}"
            raise BrokerError(msg)
        self.data_dir = Path(data_dir).resolve()
        self.log_dir = Path(log_dir).resolve()
        self.nodes = nodes
        self.heap_mb = heap_mb
        self.start_timeout = start_timeout
        self._jar_root = jar_root
        self.hosts = hosts or {}
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._ports: dict[int, NodePorts] = {}
        self._cluster_id = ""

    # -- where it is ---------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        """``host:port,...`` of every node, for Kafka clients."""
        self._load()
        return ",".join(self.node_bootstrap(n) for n in self.node_ids)

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.nodes + 1))

    def node_bootstrap(self, node: int) -> str:
        self._load()
        return f"{self.address(node)}:{self._ports[node].port}"

    def address(self, node: int) -> str:
        """Where node ``node`` listens: its host's address, or loopback."""
        host = self.hosts.get(node)
        return host.address if host else LOOPBACK

    def config_path(self, node: int) -> Path:
        """Node ``node``'s ``server.properties``; its JVM's command line names it."""
        return self.data_dir / f"node-{node}" / "server.properties"

    def log_path(self, node: int) -> Path:
        return self.log_dir / f"kafka-{node}.log"

    def pid(self, node: int) -> int:
        return self._processes[node].pid

    def member(self, node: int) -> KafkaNode:
        """Node ``node`` as a service (:class:`~infra.services.service.Service`)."""
        return KafkaNode(self, node)

    @property
    def started(self) -> dict[int, subprocess.Popen[bytes]]:
        """The nodes this object started and has not stopped, by node id, in start order.

        A failed :meth:`start` stops the nodes it started: none of them is here then.
        """
        return dict(self._processes)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, which: list[int] | None = None) -> KafkaCluster:
        """Start nodes ``which`` (default: all); return once every one answers.

        A new cluster's ports are chosen free now and bound seconds later; a port
        another process took in between starts the cluster again on other ports
        (:func:`~infra.services.ports.on_other_ports`). A cluster that has run keeps
        its ports, named in its voters list: a taken one fails, saying which.
        """
        which = self.node_ids if which is None else which
        jars = classpath(KAFKA, self._jar_root)
        new = self._load()
        deadline = time.monotonic() + self.start_timeout

        def attempt(number: int) -> None:
            if number > 1:
                self._forget(which)
                self._load()
            logged = {}
            try:
                for node in which:
                    self._prepare(node, jars, new=new)
                for node in which:
                    path = self.log_path(node)
                    logged[node] = path.stat().st_size if path.exists() else 0
                    self._spawn(node, jars)
                for node in which:
                    if not wait_until_serving(self._processes[node], self.node_bootstrap(node),
                                              deadline, self.log_path(node)):
                        if new and port_clash(self.log_path(node), logged[node]):
                            raise PortTaken(self.log_path(node))
                        msg = (f"Kafka node {node} exited during start; see the end of "
                               f"{self.log_path(node)}")
                        raise BrokerError(msg)
            except BaseException:
                self.stop(which)
                raise

        def lost() -> BrokerError:
            return BrokerError(f"the Kafka nodes lost a port to another process at each of "
                               f"{PORT_ATTEMPTS} starts; see the ends of their logs in "
                               f"{self.log_dir}")

        on_other_ports(attempt, PORT_ATTEMPTS if new else 1, "Kafka", lost=lost)
        log.info("Kafka nodes %s up (%s)", which, self.bootstrap)
        return self

    def stop(self, which: list[int] | None = None, timeout: float = 30.0) -> None:
        """SIGTERM the nodes this object started (a controlled shutdown); SIGKILL late ones."""
        from infra.services.process import terminate

        for node in list(self._processes) if which is None else which:
            process = self._processes.pop(node, None)
            if process is not None:
                terminate(process, timeout, f"Kafka node {node}")

    # -- start-up steps ------------------------------------------------------------------
    def _load(self) -> bool:
        """The cluster id and every node's ports: recorded ones, else chosen now.

        True when every node's were chosen now, on loopback: a new cluster, whose ports
        may be chosen again.
        """
        if self._ports:
            return False
        path = self.data_dir / CLUSTER_FILE
        try:
            recorded = json.loads(path.read_text())
            self._cluster_id = str(recorded["cluster_id"])
            self._ports = {int(n): NodePorts(**p) for n, p in recorded["nodes"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            self._cluster_id, self._ports = _new_cluster_id(), {}
        missing = [n for n in self.node_ids if n not in self._ports]
        if len(self._ports) not in (0, self.nodes) or missing and self._ports:
            msg = (f"{path} records {len(self._ports)} Kafka node(s), not {self.nodes}: a "
                   "cluster keeps its size; use a fresh run directory for another")
            raise BrokerError(msg)
        taken: set[int] = set()
        for node in missing:
            if self.hosts:
                self._ports[node] = HOST_PORTS
                continue
            ports = [free_port(), free_port()]
            while len(set(ports) | taken) < len(taken) + 2:
                ports = [free_port(), free_port()]
            taken.update(ports)
            self._ports[node] = NodePorts(*ports)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"cluster_id": self._cluster_id,
                                    "nodes": {n: asdict(p) for n, p in self._ports.items()}},
                                   indent=2) + "\n")
        return len(missing) == self.nodes and not self.hosts

    def _forget(self, which: list[int]) -> None:
        """Drop a new cluster's ports and its nodes' logs (formatted, never served)."""
        self._ports = {}
        (self.data_dir / CLUSTER_FILE).unlink(missing_ok=True)
        for node in which:
            shutil.rmtree(self.config_path(node).parent / "log", ignore_errors=True)

    def _prepare(self, node: int, jars: list[Path], *, new: bool = False) -> None:
        """Check the node's ports, write its config, format its log once.

        ``new``: the ports were chosen for this start, and a taken one is chosen again.
        """
        ports = self._ports[node]
        for port in () if self.hosts else (ports.port, ports.controller_port):
            if not port_free(port):
                if new:
                    raise PortTaken(self.config_path(node))
                msg = (f"port {port} of Kafka node {node} is taken by another process: the "
                       f"cluster's voters list names it ({self.data_dir / CLUSTER_FILE}); "
                       "free the port and run `fanout up` again")
                raise BrokerError(msg)
        home = self.config_path(node).parent
        home.mkdir(parents=True, exist_ok=True)
        self.config_path(node).write_text(self._properties(node))
        (home / "log4j2.properties").write_text(LOG4J2)
        if (home / "log" / "meta.properties").exists():
            return
        argv = [*self._java(node, jars, "kafka.tools.StorageTool", heap="-Xmx256m"), "format",
                "-t", self._cluster_id, "-c", str(self.config_path(node))]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            said = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
            msg = f"formatting Kafka node {node}'s log in {home / 'log'} failed:\n{said}"
            raise BrokerError(msg)

    def _properties(self, node: int) -> str:
        """The single node's properties, with this node's id and ports.

        Plus the cluster's voters, replication factors and timeouts.
        """
        ports = self._ports[node]
        base = SERVER_PROPERTIES.format(node=node, host=self.address(node), port=ports.port,
                                         controller_port=ports.controller_port,
                                         log_dir=self.config_path(node).parent / "log",
                                         # Kafka's own: the quorum's fault tests were
                                         # measured under it (broker.METADATA_IDLE_MS
                                         # only saves an idle node's CPU).
                                         metadata_idle_ms=KAFKA_METADATA_IDLE_MS)
        voters = ",".join(f"{n}@{self.address(n)}:{self._ports[n].controller_port}"
                          for n in self.node_ids)
        overrides = {"controller.quorum.voters": voters} | {
            k: v.format(rf=self.nodes, isr=min_insync(self.nodes))
            for k, v in _CLUSTER_OVERRIDES.items()}
        lines = []
        for line in base.splitlines():
            key = line.split("=", 1)[0]
            lines.append(f"{key}={overrides.pop(key)}" if key in overrides else line)
        lines += [f"{k}={v}" for k, v in overrides.items()]
        return "\n".join(lines).replace("infra/services/broker.py", "infra/services/kafkacluster.py") + "\n"

    def _java(self, node: int, jars: list[Path], main: str, *, heap: str = "") -> list[str]:
        home = self.config_path(node).parent
        memory = [heap] if heap else [f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m"]
        return ["java", *memory, "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                "-XX:+ExitOnOutOfMemoryError", "-XX:ParallelGCThreads=1",
                "-XX:ConcGCThreads=1", *JIT, "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile=file:{home / 'log4j2.properties'}",
                "-cp", os.pathsep.join(map(str, jars)), main]

    def _spawn(self, node: int, jars: list[Path]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [*self._java(node, jars, "kafka.Kafka"), str(self.config_path(node))]
        host = self.hosts.get(node)
        if host is not None:
            argv = host.argv(argv)
        with self.log_path(node).open("ab") as out:
            self._processes[node] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)


class KafkaNode:
    """One node of a :class:`KafkaCluster`, behind the local service interface.

    Its process is the cluster's: :meth:`start` starts this node alone (the others
    must be there for it to join the quorum), :meth:`stop` stops it alone.
    """

    def __init__(self, cluster: KafkaCluster, node: int) -> None:
        self.cluster, self.node = cluster, node

    @property
    def pid(self) -> int:
        return self.cluster.pid(self.node)

    @property
    def log_path(self) -> Path:
        return self.cluster.log_path(self.node)

    @property
    def marker(self) -> str:
        """Its command line names its config file, and no other node's does."""
        return str(self.cluster.config_path(self.node))

    def start(self) -> KafkaNode:
        self.cluster.start([self.node])
        return self

    def ready(self) -> bool:
        process = self.cluster.started.get(self.node)
        if process is None or process.poll() is not None:
            return False
        bootstrap = self.cluster.node_bootstrap(self.node)
        return answers(AdminClient({"bootstrap.servers": bootstrap, "log_level": 2}), 1.0)

    def stop(self) -> None:
        self.cluster.stop([self.node])


def _new_cluster_id() -> str:
    """A random KRaft cluster id: base64 of a UUID.

    Never starting with '-', which the format tool would take for an option.
    """
    cluster_id = "-"
    while not cluster_id[0].isalnum():
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return cluster_id
