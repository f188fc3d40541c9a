"""``fanout up`` / ``fanout down``: the one-machine stack in a run directory.

The stack is detached services, each with its own log in ``<run>/logs``: the Kafka
node (unless ``KAFKA_BOOTSTRAP`` names a cluster), the view job, the API and the live
verifier (each a ``fanout <service>`` process; the verifier unless ``FANOUT_VERIFIER``
is off, :mod:`infra.checks.verifier`). ``<run>/stack.json`` records the stack: the settings
its services run with, where Kafka, the store, the API and the job's and the
verifier's metrics endpoints are, and the pid of each service with a *marker* — a
string its command line must contain — so that a recycled pid is never taken for ours
nor killed. ``down`` stops the services, verifier and API first and broker last, and
keeps ``stack.json`` with its settings, so that ``up`` brings the same stack back (see
:mod:`infra.stack.launch`). A stack on hosts of its own (``up --nodes N --hosts``) has its
network removed by ``down`` once its services have stopped (:mod:`infra.services.hosts`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infra.errors import InfraError
from infra.faults import delay
from infra.services import hosts as hosts_mod
from infra.services.fanout import MARKER, alive, stop_pid
from infra.services.service import Service
from infra.settings import (
    API_URL_ENV,
    SPARK_DRIVER_HOST_ENV,
    SPARK_MASTER_ENV,
    VERIFIER_PORT_ENV,
    verifier_enabled,
)
from ingest.settings import BOOTSTRAP_ENV, PARTITIONS_ENV, TOPIC_PREFIX_ENV
from serving.settings import API_HOST_ENV, API_PORT_ENV, API_WORKERS_ENV, AUTH_SECRET_ENV
from views.metrics import JOB_METRICS_PORT_ENV
from views.pointer import POINTER_FILE, VIEW_FILE_ENV
from views.settings import CHECKPOINT_DIR_ENV, CHECKPOINTS, STORE_ENV

log = logging.getLogger(__name__)

STACK_FILE = "stack.json"
#: The API's token secret when ``up`` generated it (mode 600; never in stack.json).
AUTH_SECRET_FILE = "auth.secret"  # noqa: S105 - a file name, not a secret


class StackError(InfraError):
    """The stack could not be started or stopped as asked."""


#: The order services start in (``down`` stops them in :data:`DOWN_STEPS`).
SERVICES = ("broker", "cassandra", "spark-master", "spark-worker", "job", "job-beside", "api",
            "verifier")
#: The order ``down`` stops them in: each step's clients before what they use, and the
#: services of one step (every node of each) side by side. The last step's are used by
#: nothing left running, so a Cassandra node's drain (5-12 s on a three-node ring) and
#: the brokers' controlled shutdown overlap.
DOWN_STEPS = (("verifier",), ("api",), ("job-beside",), ("job",), ("spark-worker",),
              ("spark-master", "cassandra", "broker"))
#: A second view job building a new view beside the live one (``fanout rebuild --beside``);
#: a service of the stack only while one is recorded, and ``up`` never starts it.
BESIDE = "job-beside"
#: Services that are a node each in a multi-node stack, and the prefix of the nodes' names.
NODE_SERVICES = {"broker": "kafka", "cassandra": "cassandra", "spark-worker": "spark-worker"}
#: Spark standalone workers of a multi-node stack.
SPARK_WORKERS = 2


@dataclass
class Stack:
    """The stack of a run directory; serialized to ``stack.json``."""

    run_dir: str
    bootstrap: str
    store_url: str
    api_url: str
    topic_prefix: str = ""
    partitions: int = 4
    pids: dict[str, int] = field(default_factory=dict)
    #: What each service's command line contains (default: :data:`MARKER`).
    markers: dict[str, str] = field(default_factory=dict)
    #: The FANOUT_* settings every service of this stack runs with.
    settings: dict[str, str] = field(default_factory=dict)
    #: Whether ``up`` runs the Kafka node (False: KAFKA_BOOTSTRAP named a cluster).
    local_kafka: bool = True
    #: Whether ``up`` runs a Cassandra node for the store (``--store cassandra``).
    local_cassandra: bool = False
    #: Whether ``up`` runs a Spark standalone master and worker (``--cluster``).
    local_spark: bool = False
    #: Where the job runs: ``spark://host:port``, or "" for local mode.
    spark_master: str = ""
    #: Loopback port of the view job's metrics endpoint (0: none chosen yet).
    job_metrics_port: int = 0
    #: The live view's checkpoint directory ("": ``<run>/checkpoints``); moved by a
    #: switch to a view built beside (:mod:`infra.ops.beside`).
    checkpoint_dir: str = ""
    #: Nodes of each of Kafka and Cassandra (``up --nodes N``); with more than one, the
    #: broker, cassandra and spark-worker services are a node each (:meth:`members`).
    nodes: int = 1
    #: Loopback port of the live verifier's metrics endpoint (0: none chosen yet).
    verifier_port: int = 0
    #: Whether each node runs on a host of its own (``up --nodes N --hosts``): a network
    #: namespace on a bridge, recorded in ``<run>/hosts.json`` (:mod:`infra.services.hosts`).
    hosts: bool = False
    started_at: float = field(default_factory=time.time)

    def running(self, name: str) -> bool:
        """Whether service ``name`` of this stack is running now."""
        pid = self.pids.get(name)
        return pid is not None and alive(pid, self.markers.get(name, MARKER))

    def state(self) -> dict[str, str]:
        """``running``/``stopped`` per service this stack has."""
        local = {"broker": self.local_kafka, "cassandra": self.local_cassandra,
                 "spark-master": self.local_spark, "spark-worker": self.local_spark,
                 "verifier": verifier_enabled(self.settings)}
        names = [n for n in SERVICES if local.get(n, True) and (n != BESIDE or n in self.pids)]
        return {m: "running" if self.running(m) else "stopped"
                for n in names for m in self.members(n)}

    def members(self, service: str) -> list[str]:
        """The services ``service`` stands for: itself, or one per node.

        One per node in a multi-node stack: ``kafka-1``..., ``cassandra-1``...,
        ``spark-worker-1``, ``spark-worker-2``.
        """
        if self.nodes <= 1 or service not in NODE_SERVICES:
            return [service]
        prefix = NODE_SERVICES[service]
        count = SPARK_WORKERS if service == "spark-worker" else self.nodes
        return [f"{prefix}-{i}" for i in range(1, count + 1)]

    def verifier_url(self) -> str | None:
        """Where the live verifier answers Prometheus scrapes (loopback)."""
        port = self.verifier_port
        return f"http://127.0.0.1:{port}/metrics" if port else None

    def job_metrics_url(self) -> str | None:
        """Where the view job answers Prometheus scrapes (where its driver binds)."""
        port = self.job_metrics_port
        return f"http://{self.driver_host() or '127.0.0.1'}:{port}/metrics" if port else None

    def driver_host(self) -> str | None:
        """The Spark driver's address on hosts (the bridge's, which executors reach)."""
        return hosts_mod.gateway_of(self.run_dir) if self.hosts else None

    def record(self, name: str, service: Service, started: list[str] | None = None) -> None:
        """Keep started ``service`` as ``name``: its pid and marker; ``started`` gets it."""
        self.pids[name], self.markers[name] = service.pid, service.marker
        if started is not None:
            started.append(name)

    def log_of(self, name: str) -> Path:
        """Where service ``name`` of this stack logs."""
        logs = Path(self.run_dir) / "logs"
        return {"broker": logs / "kafka.log", "api": logs / "serve.log",
                "spark-master": Path(self.run_dir) / "spark" / "master.log",
                "spark-worker": Path(self.run_dir) / "spark" / "worker.log"}.get(
                    name, logs / f"{name}.log")

    def save(self) -> None:
        Path(self.run_dir, STACK_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> Stack | None:
        path = run_dir / STACK_FILE
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))

    def env(self) -> dict[str, str]:
        """The environment that points a fanout command at this stack."""
        host, port = self.api_url.removeprefix("http://").rsplit(":", 1)
        env = {**self.settings, BOOTSTRAP_ENV: self.bootstrap,
               STORE_ENV: self.store_url, TOPIC_PREFIX_ENV: self.topic_prefix,
               PARTITIONS_ENV: str(self.partitions), API_URL_ENV: self.api_url,
               API_HOST_ENV: host, API_PORT_ENV: port,
               CHECKPOINT_DIR_ENV: self.checkpoint_dir or str(Path(self.run_dir) / CHECKPOINTS),
               VIEW_FILE_ENV: str(Path(self.run_dir) / POINTER_FILE)}
        if self.spark_master:
            env[SPARK_MASTER_ENV] = self.spark_master
        driver = self.driver_host()
        if driver:
            env[SPARK_DRIVER_HOST_ENV] = driver
        if self.verifier_port:
            env[VERIFIER_PORT_ENV] = str(self.verifier_port)
        if self.job_metrics_port:
            env[JOB_METRICS_PORT_ENV] = str(self.job_metrics_port)
        secret = Path(self.run_dir, AUTH_SECRET_FILE)
        if secret.exists():
            env[AUTH_SECRET_ENV] = secret.read_text().strip()
        return env


def api_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for an API process of a stack: one process per core unless ``env`` says.

    `fanout up`'s API and the read-mode baseline that `fanout load --compare` puts
    beside it take their shape from here, so the two modes are served alike.
    """
    return {API_WORKERS_ENV: str(os.cpu_count() or 1), **env}










def job_scratch(checkpoint_dir: Path) -> Path:
    """The view job's temporary directory, ``tmp`` in its checkpoint, emptied.

    Called under :func:`job_lock`: what is there was left by an incarnation that
    died (a SIGKILL skips Spark's clean-up), and nothing else uses it.
    """
    scratch = checkpoint_dir.resolve() / "tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    return scratch


@contextlib.contextmanager
def job_lock(checkpoint_dir: Path) -> Iterator[None]:
    """Hold the checkpoint's lock while a view job runs on it; refuse a second job.

    Two queries on one checkpoint would each apply every batch and corrupt its
    offsets log; the lock (``flock``, released by the kernel when the holder dies,
    however it dies) names the holder's pid in the refusal.
    """
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / "job.lock"
    with path.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            msg = (f"another view job (pid {holder}) runs on the checkpoint {checkpoint_dir}: "
                   f"stop it first, or give this one its own {CHECKPOINT_DIR_ENV}")
            raise StackError(msg) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def stop_service(stack: Stack, name: str, timeout: float = 30.0) -> bool:
    """Stop one service of ``stack`` if it runs; forget its pid. True if it was running."""
    pid = stack.pids.pop(name, None)
    marker = stack.markers.pop(name, MARKER)
    if not pid or not alive(pid, marker):
        return False
    stop_pid(pid, name, timeout, marker)
    log.info("stopped %s (pid %d)", name, pid)
    return True


def down(run_dir: Path, timeout: float = 30.0) -> Stack | None:
    """Stop the stack of ``run_dir``, keeping its record; return it (None if there is none).

    Topics, checkpoint and store stay: ``up`` resumes from them.
    """
    stack = Stack.load(run_dir)
    delay.stop_all(run_dir)  # a nemesis's packet delayers hold their hosts' namespaces
    if stack is None:
        hosts_mod.remove(run_dir)  # what a crashed first `up --hosts` may have left
        return None
    stopped = stop_services(stack, [m for name in SERVICES for m in stack.members(name)],
                            timeout)
    stack.pids.clear()
    stack.markers.clear()
    stack.save()
    log.info("stopped %s", ", ".join(stopped) or "nothing (nothing was running)")
    hosts_mod.remove(run_dir)
    return stack


def stop_services(stack: Stack, names: Iterable[str], timeout: float = 30.0) -> list[str]:
    """Stop the services (or nodes) ``names`` in :data:`DOWN_STEPS`' order; those running.

    What ``down`` does to a whole stack, and a failed ``up`` to what it started.
    """
    wanted = list(dict.fromkeys(names))
    steps = [[m for name in step for m in stack.members(name) if m in wanted]
             for step in DOWN_STEPS]
    placed = {m for step in steps for m in step}
    steps.append([m for m in wanted if m not in placed])  # none today: last, if any
    return [member for step in steps for member in _stop_together(stack, step, timeout)]


def _stop_together(stack: Stack, names: list[str], timeout: float) -> list[str]:
    """Stop the services ``names`` side by side; those that were running.

    Together, not one after the other: the last node of a KRaft quorum stopped alone
    waits out its whole timeout for a controller that is gone.
    """
    if len(names) <= 1:
        return [n for n in names if stop_service(stack, n, timeout)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(names)) as pool:
        stopped = list(pool.map(lambda n: stop_service(stack, n, timeout), names))
    return [n for n, was in zip(names, stopped, strict=True) if was]
