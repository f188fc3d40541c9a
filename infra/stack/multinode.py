"""``fanout up --nodes N``: the clusters of a multi-node stack, node by node.

A multi-node stack runs, on this one machine, a Kafka cluster of N KRaft nodes
(:mod:`infra.services.kafkacluster`), a Cassandra ring of N nodes on 127.0.0.1..N
(:mod:`infra.services.cassandraring`) and a Spark standalone master with
:data:`~infra.stack.stack.SPARK_WORKERS` workers (:class:`SparkWorkers`); the job and the API
are pointed at all of it: the bootstrap lists every broker, the store URL every
Cassandra node with the keyspace at RF N (reads and writes at LOCAL_QUORUM, the
store's default), and the job runs on the master. Each node is a service of the stack
of its own (``kafka-2``, ``cassandra-3``, ``spark-worker-1``; see
:meth:`infra.stack.stack.Stack.members`), so ``fanout status`` shows each, ``fanout down``
stops each, and ``fanout up`` starts exactly the nodes that are not running — a node
killed by a fault comes back on its own data and ports, and rejoins its cluster.

Every node keeps its data under the run directory (``kafka/node-<i>``,
``cassandra/node-<i>``, ``spark/``), and its addresses stay fixed, so the job and
the API never need restarting for a node's sake: only a Spark master that had to be
started anew moves, and then the job is restarted on it.

With ``--hosts`` every node runs on a host of its own (:mod:`infra.services.hosts`): ``node-<i>``
holds Kafka node i and Cassandra node i, ``spark-m`` the master, ``spark-<j>`` worker
j; ``up`` makes (or mends) the network before it starts a node, and ``down`` removes it.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Final

from infra.errors import InfraError
from infra.services.hosts import Host, HostNetwork, require_netns, stack_hosts
from infra.services.sparkcluster import (
    MASTER_CLASS,
    WORKER_CLASS,
    ClusterError,
    LocalSparkCluster,
    _get_json,
    _is_running,
    _own_session,
    _signal,
)
from infra.settings import HOSTS_ENV, HOSTS_NET_ENV, SPARK_MASTER_ENV
from infra.stack.stack import SPARK_WORKERS, Stack, stop_service
from ingest.settings import BOOTSTRAP_ENV, REPLICATION_ENV
from views.settings import STORE_ENV

if TYPE_CHECKING:
    from infra.services.cassandraring import CassandraRing
    from infra.services.kafkacluster import KafkaCluster

log = logging.getLogger(__name__)

#: The keyspace of a multi-node stack's store.
KEYSPACE: Final = "fanout"
#: How long the job's writes keep retrying while the store has no quorum (seconds):
#: a lost quorum is waited out, with a log line per retry, rather than ending the job.
STORE_RETRY_S: Final = 900
#: Heaps: Kafka and Cassandra nodes each, and the Spark daemons (small: the
#: machine runs all of them, the job and the API at once).
KAFKA_HEAP_MB: Final = 256
CASSANDRA_HEAP_MB: Final = 320
SPARK_DAEMON_MEMORY: Final = "256m"


class NodesError(InfraError):
    """A multi-node stack cannot be made as asked; the message says what to do."""


class SparkWorkers(LocalSparkCluster):
    """A standalone master and ``workers`` workers (``worker-1``...), one core each.

    One core and 1 GB per worker: the job gets an executor on each, so losing a
    worker loses half the executors, and the other worker's executor takes its tasks.
    """

    def __init__(self, work_dir: Path | str, *, workers: int = SPARK_WORKERS,
                 memory: str = "1g", daemon_memory: str = SPARK_DAEMON_MEMORY,
                 start_timeout: float = 180.0, hosts: dict[str, Host] | None = None) -> None:
        super().__init__(work_dir, cores=1, memory=memory, daemon_memory=daemon_memory,
                         start_timeout=start_timeout, hosts=hosts)
        self.workers = workers

    def worker_names(self) -> list[str]:
        return [f"worker-{i}" for i in range(1, self.workers + 1)]

    def alive(self) -> bool:
        return len(self._pids) == self.workers + 1 and all(
            _is_running(pid, main) for pid, main in self._mains())

    def executor_pids(self, app_id: str | None = None) -> list[int]:
        return [pid for name in self.worker_names() for pid in self.executors_of(name, app_id)]

    def executors_of(self, worker: str, app_id: str | None = None) -> list[int]:
        """Live executor JVMs worker ``worker`` forked (of ``app_id`` if given)."""
        from infra.services.sparkcluster import EXECUTOR_CLASS

        pid = self._pids.get(worker)
        if pid is None:
            return []
        return [p for p, cmdline in _own_session(pid, WORKER_CLASS)
                if EXECUTOR_CLASS in cmdline and (app_id is None or app_id in cmdline)]

    def spawn_worker(self, name: str) -> int:
        """Start worker ``name`` for the running master; return its pid.

        Registering takes a moment: see :meth:`wait_registered`.
        """
        self._spawn(name, self.worker_args(name))
        return self._pids[name]

    def wait_registered(self, count: int, deadline: float) -> None:
        def registered() -> bool:
            state = _get_json(f"{self.web_ui_url}/json/", 2.0)
            return bool(state and state.get("aliveworkers", 0) >= count)

        self._await(registered, deadline, f"{count} Spark workers to register with the master")

    def _start_worker(self, deadline: float) -> None:
        for name in self.worker_names():
            self.spawn_worker(name)
        self.wait_registered(self.workers, deadline)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the workers (each stops its executors), then the master as the base does."""
        workers = [self._pids[n] for n in self.worker_names() if n in self._pids]
        for pid in workers:
            if _is_running(pid, WORKER_CLASS):
                _signal(pid, signal.SIGTERM)
        self._wait_gone(workers, timeout, "the Spark workers to stop")
        super().stop(timeout)

    def _mains(self):  # type: ignore[no-untyped-def]
        return ((pid, MASTER_CLASS if name == "master" else WORKER_CLASS)
                for name, pid in self._pids.items())

    @classmethod
    def of(cls, run_dir: Path, master_url: str,
           hosts: dict[str, Host] | None = None) -> SparkWorkers:
        """The stack's cluster object for a running master (to start a worker again)."""
        cluster = cls(run_dir / "spark", hosts=hosts)
        state = _get_json_file(cluster.work_dir / "cluster.json")
        cluster._master_url = master_url
        cluster._web_ui_url = str(state.get("web_ui_url", ""))
        return cluster


def _get_json_file(path: Path) -> dict[str, object]:
    import json

    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


# -- what `fanout up` calls ----------------------------------------------------------------

def ensure_nodes(stack: Stack, started: list[str]) -> bool:
    """Start the nodes of ``stack`` that are not running; True if the Spark master moved.

    Kafka first (the job and the API need it), then Cassandra, then Spark while the
    schema is applied (mostly waits on the ring, and the job needs both). ``started``
    gets the name of each node started, so that a failed ``up`` stops what it started.
    """
    from infra.services.cassandraring import CassandraRing
    from infra.services.kafkacluster import KafkaCluster

    run_dir = Path(stack.run_dir)
    network = _network(stack)
    nodes = {i: network.host(f"node-{i}") for i in range(1, stack.nodes + 1)} if network else {}
    kafka = KafkaCluster(run_dir / "kafka", run_dir / "logs", nodes=stack.nodes,
                         heap_mb=KAFKA_HEAP_MB, hosts=nodes)
    if _ensure_cluster(stack, started, "broker", "kafka", kafka):
        stack.bootstrap = kafka.bootstrap
        stack.save()
    ring = CassandraRing(run_dir / "cassandra", run_dir / "logs", nodes=stack.nodes,
                         heap_mb=CASSANDRA_HEAP_MB, hosts=nodes)
    ring_started = _ensure_cluster(stack, started, "cassandra", "cassandra", ring)
    if ring_started:
        stack.store_url = ring.url(KEYSPACE, f"retry={STORE_RETRY_S}")
        stack.save()
    with ThreadPoolExecutor(1, thread_name_prefix="schema") as pool:
        schema = pool.submit(_apply_schema, stack.store_url) if ring_started else None
        moved = _ensure_spark(stack, started, _spark_hosts(network))
        if schema is not None:
            schema.result()
    return moved


def _network(stack: Stack) -> HostNetwork | None:
    """The hosts of a ``--hosts`` stack, made whole (None for a stack on loopback).

    A host whose namespace, veth or address is missing is made again; a whole one, and
    whatever node runs in it, is left as it is.
    """
    if not stack.hosts:
        return None
    return HostNetwork(stack.run_dir, stack_hosts(stack.nodes, SPARK_WORKERS),
                       stack.settings.get(HOSTS_NET_ENV) or None).ensure()


def _spark_hosts(network: HostNetwork | None) -> dict[str, Host]:
    """The Spark daemons' hosts by daemon name (``master``, ``worker-<j>``)."""
    if network is None:
        return {}
    return {"master": network.host("spark-m"),
            **{f"worker-{j}": network.host(f"spark-{j}") for j in range(1, SPARK_WORKERS + 1)}}


def _ensure_cluster(stack: Stack, started: list[str], service: str, prefix: str,
                    cluster: KafkaCluster | CassandraRing) -> bool:
    """Start ``cluster``'s nodes of ``service`` that are not running; False if all run.

    Each node the start left running is recorded as the service ``<prefix>-<node>``
    (its pid, and its marker: the config file its command line names), even when the
    start failed, so that a failed ``up`` stops what did start.
    """
    dead = _dead(stack, service)
    if not dead:
        return False
    try:
        cluster.start(dead)
    finally:
        for node in cluster.started:
            stack.record(f"{prefix}-{node}", cluster.member(node), started)
    return True


def _dead(stack: Stack, service: str) -> list[int]:
    """Node numbers of ``service`` that are not running."""
    return [int(name.rsplit("-", 1)[1]) for name in stack.members(service)
            if not stack.running(name)]


def _apply_schema(url: str) -> None:
    """The keyspace's missing schema steps, waiting for the ring to answer."""
    from views.stores.cassandra.schema import apply_at

    done = apply_at(url, wait=120)
    if done:
        log.info("store %s: applied %s", url, [s.label for s in done])


def _ensure_spark(stack: Stack, started: list[str], hosts: dict[str, Host]) -> bool:
    """Start the master and workers, or only the workers that died; True if it moved."""
    workers = stack.members("spark-worker")
    if stack.running("spark-master"):
        dead = [w for w in workers if not stack.running(w)]
        if dead:
            _restart_workers(stack, dead, started, hosts)
        return False
    for name in workers:  # workers of a master that is gone: start the cluster whole
        stop_service(stack, name)
    cluster = SparkWorkers(Path(stack.run_dir) / "spark", hosts=hosts).start()
    for name in cluster.pids:
        stack.record(f"spark-{name}", cluster.daemon(name), started)
    moved = bool(stack.spark_master) and cluster.master_url != stack.spark_master
    stack.spark_master = cluster.master_url
    stack.save()
    return moved


def _restart_workers(stack: Stack, dead: list[str], started: list[str],
                     hosts: dict[str, Host]) -> None:
    cluster = SparkWorkers.of(Path(stack.run_dir), stack.spark_master, hosts)
    if not cluster._web_ui_url:
        msg = (f"no web UI of the Spark master is recorded in {cluster.work_dir}: `fanout "
               "down` and `fanout up` start the Spark cluster whole")
        raise ClusterError(msg)
    for name in dead:
        cluster.spawn_worker(name.removeprefix("spark-"))
        stack.record(name, cluster.daemon(name.removeprefix("spark-")), started)
    cluster.wait_registered(len(stack.members("spark-worker")), time.monotonic() + 120)
    log.info("Spark workers %s started again for %s", dead, stack.spark_master)


def make_multinode(stack: Stack, nodes: int, environ: Mapping[str, str]) -> None:
    """Shape a new stack as a multi-node one: every cluster local, RF ``nodes``.

    Refuses when the environment names a Kafka cluster, a store or a Spark master:
    ``--nodes`` starts its own, and pointing half the stack elsewhere is a mistake
    worth stopping for.
    """
    given = [n for n in (BOOTSTRAP_ENV, STORE_ENV, SPARK_MASTER_ENV) if environ.get(n)]
    if given:
        msg = (f"--nodes starts its own Kafka, Cassandra and Spark clusters, but "
               f"{', '.join(given)} name(s) other ones: unset them, or drop --nodes to use "
               "those")
        raise NodesError(msg)
    if environ.get(HOSTS_ENV, "").lower() in ("on", "1", "true", "yes"):
        require_netns()  # before anything is made: refuse with the reason
        stack.hosts = True
    stack.nodes = nodes
    stack.local_kafka = stack.local_cassandra = stack.local_spark = True
    stack.store_url = stack.spark_master = ""
    stack.settings[REPLICATION_ENV] = str(nodes)
