"""``fanout up``: bring the local stack up, idempotently (see :mod:`infra.stack.stack`).

Like ``docker compose up``: it starts whichever of the Kafka node, the view job and the
API is not running, and leaves the running ones alone. The first ``up`` in a run
directory decides the stack's settings — the ``FANOUT_*`` environment and flags, plus
what ``up`` picks itself (the Kafka log in ``<run>/kafka``, the SQLite store, the
checkpoint directory, the API port and the job's metrics port) — and records them
in ``stack.json``; every later ``up`` starts its services with those same settings,
so a restarted job resumes from its checkpoint on the same topics and store, and
nothing is rebuilt or replayed.

A service that must move (Kafka's or the API's port taken by something else) moves,
and the services that point at it are restarted with the new address. When ``up``
fails, it stops what it started itself and reports which service failed and where
its log is; services that were already running are left as they were.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from infra.services.broker import KafkaBroker
from infra.services.fanout import FanoutProcess
from infra.services.process import free_port, port_free
from infra.settings import (
    API_URL_ENV,
    RUN_DIR_ENV,
    SPARK_MASTER_ENV,
    VERIFIER_ENV,
    VERIFIER_PORT_ENV,
    run_dir_views,
    stale_views,
    verifier_enabled,
)
from infra.stack.stack import (
    AUTH_SECRET_FILE,
    Stack,
    StackError,
    api_env,
    stop_service,
    stop_services,
)
from ingest.settings import PARTITIONS_ENV, TOPIC_PREFIX_ENV, KafkaSettings
from ingest.topics import create_topics
from serving.settings import (
    API_HOST_ENV,
    API_PORT_ENV,
    AUTH_SECRET_ENV,
    ServingSettings,
)
from views.metrics import JOB_METRICS_PORT_ENV, JobMetricsSettings
from views.settings import CHECKPOINT_DIR_ENV, CHECKPOINTS, STORE_ENV, ViewSettings

log = logging.getLogger(__name__)

#: ``FANOUT_STORE`` that asks ``up`` for a local Cassandra node, and its keyspace.
LOCAL_CASSANDRA: Final = "cassandra://local"
CASSANDRA_KEYSPACE: Final = "fanout"

#: Environment variables that are part of a stack's settings (recorded at its first
#: ``up``); these are where its pieces are, or secrets, and are decided by the stack.
_NOT_SETTINGS: Final = frozenset({
    RUN_DIR_ENV, AUTH_SECRET_ENV, API_URL_ENV, API_HOST_ENV, API_PORT_ENV, STORE_ENV,
    CHECKPOINT_DIR_ENV, TOPIC_PREFIX_ENV, PARTITIONS_ENV, JOB_METRICS_PORT_ENV,
    VERIFIER_PORT_ENV})


def up(run_dir: Path, *, port: int | None = None, extra_env: dict[str, str] | None = None,
       store: str | None = None, cluster: bool = False, timeout: float = 240.0,
       nodes: int | None = None, verifier: bool | None = None) -> Stack:
    """Start what is not running of the stack in ``run_dir``; return the Stack.

    ``store="cassandra"`` (or ``FANOUT_STORE=cassandra://local``) gives a new stack a
    local Cassandra node for its store, keyspace ``fanout``; ``cluster`` a Spark
    standalone master and worker that the job runs on (``FANOUT_SPARK_MASTER`` names
    an existing one instead). ``nodes`` > 1 gives a new stack clusters of that many
    Kafka and Cassandra nodes and a Spark master with two workers (:mod:`infra.stack.multinode`).
    The stack's settings come from the environment with ``extra_env`` (flags) over it.
    ``verifier`` True or False turns the live verifier on or off for this stack from now
    on (None: as its settings say; on unless ``FANOUT_VERIFIER=off``).
    """
    run_dir = run_dir.resolve()
    environ = {**os.environ, **(extra_env or {})}
    stack = Stack.load(run_dir)
    if stack is None:
        stack = _new_stack(run_dir, port, environ, store, cluster)
        if nodes is not None and nodes > 1:
            from infra.stack.multinode import make_multinode

            make_multinode(stack, nodes, environ)
    else:
        _warn_on_other_settings(stack, environ)
        if nodes is not None and nodes != stack.nodes:
            msg = (f"the stack in {run_dir} has {stack.nodes} node(s) per cluster, not "
                   f"{nodes}: drop --nodes to start it as it is, or use a fresh --run-dir")
            raise StackError(msg)
    started: list[str] = []
    try:
        if stack.nodes > 1:
            from infra.stack.multinode import ensure_nodes

            moved = ensure_nodes(stack, started)
        else:
            moved = _ensure_broker(stack, started)
            moved |= _ensure_cassandra(stack, started)
            moved |= _ensure_spark(stack, started)
        create_topics(_kafka(stack))
        refused = None if stack.running("job") else job_refusal(stack)
        # The job takes longest to come up (a JVM, Spark, its first batch): the API and
        # the verifier start while it does, and only then is it waited for.
        job = _spawn_job(stack, started, restart=moved, timeout=timeout) \
            if refused is None else None
        api_url = stack.api_url
        _ensure_api(stack, started, restart=moved, port=port)
        _ensure_verifier(stack, started, restart=moved or stack.api_url != api_url,
                         turn=verifier)
        if job is not None:
            job.await_ready()
    except BaseException:
        stop_services(stack, started)
        stack.save()
        raise
    stack.save()
    if refused is not None:
        msg = (f"the view job was not started: {refused}. The API serves the view as it is "
               f"meanwhile ({stack.api_url})")
        raise StackError(msg)
    return stack


def job_refusal(stack: Stack) -> str | None:
    """Why the stack's view job cannot resume its checkpoint (this version, these settings).

    A new version whose state layout differs, or settings the checkpoint cannot take
    (:mod:`views.fingerprint`): ``up`` starts the rest and says so instead of
    starting a job that would refuse, and the message offers the rebuild beside.
    """
    from views.fingerprint import adopted, refusal
    from views.job import checkpoint_path, other_layout

    view = adopted(ViewSettings.from_env(stack.env()))
    return other_layout(view) or refusal(view, checkpoint_path(view))


def _new_stack(run_dir: Path, port: int | None, environ: Mapping[str, str],
               store: str | None, cluster: bool) -> Stack:
    """The stack a first ``up`` describes, from the environment, flags and the run dir."""
    kafka, api = KafkaSettings.from_env(environ), ServingSettings.from_env(environ)
    store_url = run_dir_views(run_dir, environ).store_url
    if not api.host.startswith("127.") and api.host != "localhost":
        msg = f"the local stack serves on loopback only, not {api.host}"
        raise StackError(msg)
    settings = {k: v for k, v in environ.items()
                if k.startswith("FANOUT_") and k not in _NOT_SETTINGS}
    local_kafka = not kafka.bootstrap
    if local_kafka:
        _refuse_stale_views(run_dir, store_url)
    run_dir.mkdir(parents=True, exist_ok=True)
    _auth_secret(run_dir, environ)
    local_cassandra = store == "cassandra" or store_url == LOCAL_CASSANDRA
    if store not in (None, "sqlite", "cassandra"):
        msg = f"--store is sqlite or cassandra, not {store!r} ({STORE_ENV} takes any URL)"
        raise StackError(msg)
    return Stack(run_dir=str(run_dir), bootstrap=kafka.bootstrap,
                 store_url="" if local_cassandra else store_url,
                 api_url=f"http://{api.host}:{port or _api_port(api, environ)}",
                 topic_prefix=kafka.topic_prefix, partitions=kafka.partitions,
                 settings=settings, local_kafka=local_kafka, local_cassandra=local_cassandra,
                 local_spark=cluster,
                 spark_master="" if cluster else environ.get(SPARK_MASTER_ENV, ""),
                 job_metrics_port=JobMetricsSettings.from_env(environ).port
                 if environ.get(JOB_METRICS_PORT_ENV) else 0)


def _api_port(api: ServingSettings, environ: Mapping[str, str]) -> int:
    """The API port of a new stack: FANOUT_API_PORT when set (and not 0), else a free one."""
    return api.port if environ.get(API_PORT_ENV) and api.port else free_port()


def _warn_on_other_settings(stack: Stack, environ: Mapping[str, str]) -> None:
    """A later ``up`` keeps the stack's settings; say so when asked for others."""
    asked = {k: v for k, v in environ.items()
             if k.startswith("FANOUT_") and k not in _NOT_SETTINGS}
    differ = sorted(k for k, v in asked.items() if stack.settings.get(k) != v)
    if differ:
        log.warning("the stack in %s keeps the settings it was started with (%s); to change "
                    "them, build a view with the new ones beside the live one (`fanout "
                    "rebuild --beside`, e.g. --timeline-cap N), or `fanout down` and start "
                    "a fresh run directory", stack.run_dir,
                    ", ".join(f"{k}={stack.settings.get(k, '(unset)')}" for k in differ))


def _kafka(stack: Stack) -> KafkaSettings:
    return KafkaSettings(bootstrap=stack.bootstrap, partitions=stack.partitions,
                         topic_prefix=stack.topic_prefix,
                         replication=KafkaSettings.from_env(stack.settings).replication)


def _ensure_broker(stack: Stack, started: list[str]) -> bool:
    """Start the Kafka node unless it runs (or is external); True if its address moved."""
    if not stack.local_kafka or stack.running("broker"):
        return False
    run_dir = Path(stack.run_dir)
    port = int(stack.bootstrap.rsplit(":", 1)[1]) if stack.bootstrap else None
    broker = KafkaBroker(run_dir / "kafka", stack.log_of("broker"), port=port)
    stack.record("broker", broker.start(), started)
    moved = bool(stack.bootstrap) and broker.bootstrap != stack.bootstrap
    if moved:
        log.warning("Kafka moved from %s to %s (the port was taken): restarting the job and "
                    "the API with the new address", stack.bootstrap, broker.bootstrap)
    stack.bootstrap = broker.bootstrap
    stack.save()
    return moved


def _ensure_cassandra(stack: Stack, started: list[str]) -> bool:
    """Start the local Cassandra node unless it runs; apply the schema; True if it moved."""
    if not stack.local_cassandra or stack.running("cassandra"):
        return False
    from infra.services.cassandra import LocalCassandra

    run_dir = Path(stack.run_dir)
    node = LocalCassandra(run_dir / "cassandra", stack.log_of("cassandra"))
    stack.record("cassandra", node.start(), started)
    url = node.url(CASSANDRA_KEYSPACE)
    _apply_schema(url)
    moved = bool(stack.store_url) and url != stack.store_url
    if moved:
        log.warning("Cassandra moved to %s (its port was taken): restarting the job and the "
                    "API with the new address", node.hosts)
    stack.store_url = url
    stack.save()
    return moved


def _ensure_spark(stack: Stack, started: list[str]) -> bool:
    """Start the standalone master and worker unless both run; True if the master moved."""
    if not stack.local_spark or (stack.running("spark-master")
                                 and stack.running("spark-worker")):
        return False
    from infra.services.sparkcluster import LocalSparkCluster

    for name in ("spark-worker", "spark-master"):  # half a cluster: start it whole again
        stop_service(stack, name)
    cluster = LocalSparkCluster(Path(stack.run_dir) / "spark").start()
    for name in ("master", "worker"):
        stack.record(f"spark-{name}", cluster.daemon(name), started)
    moved = bool(stack.spark_master) and cluster.master_url != stack.spark_master
    stack.spark_master = cluster.master_url
    stack.save()
    return moved


def _apply_schema(url: str) -> None:
    """``fanout schema apply`` on the stack's keyspace (idempotent: the missing steps)."""
    from views.stores.cassandra.schema import apply_at

    done = apply_at(url)
    if done:
        log.info("store %s: applied %s", url, [s.label for s in done])


def _spawn_job(stack: Stack, started: list[str], *, restart: bool,
               timeout: float) -> FanoutProcess | None:
    """Start the view job, not waiting for it: the caller awaits the returned process.

    None when it runs already and stays. Its metrics port is the recorded one while
    free, else a free one: recorded in ``stack.json`` for ``fanout status``, and told
    to the job through :meth:`Stack.env` like every other setting.
    """
    if _stays(stack, "job", restart):
        return None
    stack.job_metrics_port = _placed(stack.job_metrics_port, "the view job's metrics")
    job = _service(stack, "job", "the view job", timeout=timeout,
                   watch=lambda: _died(stack, "broker") or _died(stack, "cassandra")
                   or _died(stack, "spark-master") or _died(stack, "spark-worker"))
    job.spawn()
    stack.record("job", job, started)
    return job


def _stays(stack: Stack, name: str, restart: bool) -> bool:
    """Whether service ``name`` runs and goes on running; one to ``restart`` is stopped."""
    if stack.running(name):
        if not restart:
            return True
        stop_service(stack, name)
    return False


def _placed(port: int, whose: str) -> int:
    """``port`` while it is free, else a free one (said when ``port`` was set)."""
    if port and port_free(port):
        return port
    moved = free_port()
    if port:
        log.warning("%s port %d is taken: it moves to %d", whose, port, moved)
    return moved


def _service(stack: Stack, name: str, what: str, *, timeout: float,
             watch: Callable[[], str | None]) -> FanoutProcess:
    """The ``fanout name`` service, ready once it writes its ready file."""
    run_dir = Path(stack.run_dir)
    return FanoutProcess(run_dir, name, stack.env(), ready_file=run_dir / f"{name}.ready",
                         what=what, timeout=timeout, watch=watch)


def _ensure_api(stack: Stack, started: list[str], *, restart: bool,
                port: int | None) -> None:
    if _stays(stack, "api", restart):
        return
    host, old = stack.api_url.removeprefix("http://").rsplit(":", 1)
    if not port_free(int(old), host):
        new = port or free_port(host)
        log.warning("the API's port %s is taken: it moves to %d", old, new)
        stack.api_url = f"http://{host}:{new}"
    api = FanoutProcess(Path(stack.run_dir), "serve", api_env(stack.env()),
                        health=f"{stack.api_url}/healthz", what=f"the API at {stack.api_url}",
                        watch=lambda: _died(stack, "broker") or _died(stack, "job"))
    stack.record("api", api.start(), started)


def _ensure_verifier(stack: Stack, started: list[str], *, restart: bool,
                     turn: bool | None) -> None:
    """Run the live verifier (:mod:`infra.checks.verifier`) unless the stack turns it off.

    ``turn`` (``up --verifier``/``--no-verifier``) records the choice in the stack's
    settings, so later ``up``s keep it; turned off, a running verifier is stopped.
    """
    if turn is not None:
        stack.settings[VERIFIER_ENV] = "on" if turn else "off"
    if not verifier_enabled(stack.settings):
        stop_service(stack, "verifier")
        return
    if _stays(stack, "verifier", restart):
        return
    stack.verifier_port = _placed(stack.verifier_port, "the live verifier's")
    verifier = _service(stack, "verifier", "the live verifier", timeout=60,
                        watch=lambda: _died(stack, "api"))
    stack.record("verifier", verifier.start(), started)


def _died(stack: Stack, name: str) -> str | None:
    """A message if service ``name`` of the stack has a pid but no longer runs."""
    if name not in stack.pids or stack.running(name):
        return None
    return f"the {name} (pid {stack.pids[name]}) died; see {stack.log_of(name)}"


def _refuse_stale_views(run_dir: Path, store_url: str) -> None:
    """Views built from a Kafka log that is gone cannot match the new, empty one."""
    if (run_dir / "kafka" / "log" / "meta.properties").exists():
        return
    stale = stale_views(run_dir / CHECKPOINTS, store_url)
    if stale:
        shown = ", ".join(map(str, stale))
        msg = (f"{shown} hold views of a Kafka log that is no longer in {run_dir / 'kafka'}: "
               f"run `fanout --run-dir {run_dir} rebuild` to set them aside, then `fanout up` "
               "and replay the history")
        raise StackError(msg)


def _auth_secret(run_dir: Path, environ: Mapping[str, str]) -> None:
    """A random token secret in ``<run>/auth.secret`` unless FANOUT_AUTH_SECRET is set.

    :meth:`Stack.env` hands the file's secret to the API and to later ``fanout``
    commands (``fanout token``). It is made once per run directory, so tokens stay
    valid across ``down``/``up``; a secret set in the environment wins, and a file
    from an earlier run is removed then.
    """
    path = run_dir / AUTH_SECRET_FILE
    if environ.get(AUTH_SECRET_ENV):
        path.unlink(missing_ok=True)
        return
    if path.exists():
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
