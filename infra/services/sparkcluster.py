"""A Spark standalone cluster on this machine: one master and one worker on loopback.

This module owns the standalone daemons that pyspark's own launcher
(``pyspark/bin/spark-class``) runs (DESIGN §9): starting them on free loopback ports,
waiting until the worker has registered, finding the executors the worker forks, and
stopping the lot with no orphans. It is how the cluster path is tested for real —
executors in their own JVMs, the same job as in local mode (``infra.services.spark``) given
``master=cluster.master_url``. The daemons are detached (a session each, a log file
each), so a cluster started by one command outlives it: ``cluster.json`` in the work
directory records what :meth:`LocalSparkCluster.attach` needs to find and stop it later.

Given hosts (``fanout up --hosts``, :mod:`infra.services.hosts`), each daemon runs in its host's
network namespace and binds its host's address (``--host``, ``SPARK_LOCAL_IP``, which
the executors a worker forks inherit), the master on Spark's usual ports.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Final

from infra.errors import InfraError
from infra.services import procs
from infra.services.hosts import Host
from infra.services.ports import PortTaken, on_other_ports
from infra.services.process import JIT_OPTIONS, free_port
from infra.services.spark_home import lean_home

log = logging.getLogger(__name__)

LOOPBACK: Final = "127.0.0.1"
MASTER_CLASS: Final = "org.apache.spark.deploy.master.Master"
WORKER_CLASS: Final = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS: Final = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
CLUSTER_FILE: Final = "cluster.json"
_MAINS: Final = {"master": MASTER_CLASS, "worker": WORKER_CLASS}

#: Daemon settings. No port retries: a taken port must fail the start, not move the
#: master to a port we do not know (we retry with fresh ports instead); no REST
#: submission server (it would take the fixed port 6066).
_DAEMON_PROPERTIES: Final = {
    "spark.port.maxRetries": "0",
    "spark.master.rest.enabled": "false",
}
_BIND_FAILURE: Final = ("BindException", "Address already in use", "Failed to bind")
#: What a worker logs once the master has taken it.
_REGISTERED: Final = b"Successfully registered with master"
#: The master's RPC and web UI ports on a host of its own (nothing else binds its address).
HOST_MASTER_PORTS: Final = (7077, 8080)


class ClusterError(InfraError):
    """The standalone cluster could not start or stop; the message says why and what to do."""


class LocalSparkCluster:
    """One master and one worker, started from pyspark's launcher on loopback.

    ``work_dir`` holds the daemons' logs (``master.log``, ``worker.log``), the worker's
    directory (``work/<app-id>/<executor-id>/stderr`` per executor) and ``cluster.json``.
    ``cores`` and ``memory`` are what the worker offers to applications (an executor
    takes 1 GB unless ``spark.executor.memory`` says otherwise); ``daemon_memory`` is
    the heap of the master and worker JVMs themselves.
    """

    def __init__(self, work_dir: Path | str, *, cores: int = 2, memory: str = "2g",
                 daemon_memory: str = "512m", start_timeout: float = 120.0,
                 port_attempts: int = 3, hosts: dict[str, Host] | None = None) -> None:
        self.work_dir = Path(work_dir).resolve()
        #: The host each daemon (``master``, ``worker``...) runs on; none: loopback.
        self.hosts = hosts or {}
        self.cores, self.memory, self.daemon_memory = cores, memory, daemon_memory
        self.start_timeout, self.port_attempts = start_timeout, port_attempts
        self._pids: dict[str, int] = {}
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        #: Where each daemon's log stood when this object spawned it.
        self._log_offsets: dict[str, int] = {}
        self._master_url: str | None = None
        self._web_ui_url: str | None = None

    # -- what callers read -----------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``, for ``build_session(master=...)`` or spark-submit."""
        if self._master_url is None:
            msg = "the cluster is not started: call start() first"
            raise ClusterError(msg)
        return self._master_url

    @property
    def web_ui_url(self) -> str:
        """The master's web UI; ``/json/`` under it is the cluster's state as JSON."""
        if self._web_ui_url is None:
            msg = "the cluster is not started: call start() first"
            raise ClusterError(msg)
        return self._web_ui_url

    @property
    def pids(self) -> dict[str, int]:
        """Pids of the ``master`` and ``worker`` JVMs (each the leader of its session)."""
        return dict(self._pids)

    @property
    def master_log(self) -> Path:
        return self.work_dir / "master.log"

    @property
    def properties_path(self) -> Path:
        """The daemons' properties file; every daemon's command line names it."""
        return self.work_dir / "spark-daemons.conf"

    def daemon(self, name: str) -> SparkDaemon:
        """Daemon ``name`` (``master``, ``worker``, ``worker-N``) as a service."""
        return SparkDaemon(self, name)

    def daemon_ready(self, name: str) -> bool:
        """Whether daemon ``name`` runs and serves.

        The master answers on its web UI with its URL; a worker has logged its
        registration with the master since this object started it.
        """
        pid = self._pids.get(name)
        if pid is None or not self._running(pid):
            return False
        if name == "master":
            state = _get_json(f"{self.web_ui_url}/json/", 2.0)
            return state is not None and state.get("url") == self.master_url
        path = self.work_dir / f"{name}.log"
        with contextlib.suppress(OSError), path.open("rb") as log_file:
            log_file.seek(self._log_offsets.get(name, 0))
            return _REGISTERED in log_file.read()
        return False

    @property
    def worker_log(self) -> Path:
        return self.work_dir / "worker.log"

    def alive(self) -> bool:
        """Whether both daemons are running (and are the daemons, not a reused pid)."""
        return len(self._pids) == 2 and all(
            _is_running(pid, main) for pid, main in self._mains())

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        """The master's state (``aliveworkers``, ``activeapps``, ...) from its web UI."""
        state = _get_json(f"{self.web_ui_url}/json/", timeout)
        if state is None:
            msg = f"the Spark master's web UI at {self.web_ui_url} does not answer"
            raise ClusterError(msg)
        return state

    def executor_pids(self, app_id: str | None = None) -> list[int]:
        """Live executor JVMs the worker forked, of application ``app_id`` if given."""
        worker = self._pids.get("worker")
        if worker is None:
            return []
        return [pid for pid, cmdline in _own_session(worker, WORKER_CLASS)
                if EXECUTOR_CLASS in cmdline and (app_id is None or app_id in cmdline)]

    def executor_log(self, pid: int) -> Path:
        """The stderr file of executor ``pid``, in the worker's directory."""
        args = procs.cmdline(pid).split()
        try:
            app = args[args.index("--app-id") + 1]
            executor = args[args.index("--executor-id") + 1]
        except (ValueError, IndexError):
            msg = f"process {pid} is not a Spark executor (or is gone)"
            raise ClusterError(msg) from None
        return self.work_dir / "work" / app / executor / "stderr"

    def descendants(self) -> list[int]:
        """Live processes the worker started: executor JVMs and their Python workers."""
        worker = self._pids.get("worker")
        if worker is None:
            return []
        return [pid for pid, _ in _own_session(worker, WORKER_CLASS) if pid != worker]

    def rss(self) -> dict[str, int]:
        """Resident memory in bytes of each part of the cluster.

        ``master`` and ``worker``, and summed over the worker's descendants,
        ``executors`` (JVMs) and ``python`` (the PySpark daemon and workers).
        """
        figures = {name: procs.rss(pid) for name, pid in self._pids.items()}
        figures["executors"] = figures["python"] = 0
        worker = self._pids.get("worker")
        for pid, cmdline in _own_session(worker, WORKER_CLASS) if worker else []:
            if pid == worker:
                continue
            kind = "executors" if EXECUTOR_CLASS in cmdline else "python"
            figures[kind] += procs.rss(pid)
        return figures

    # -- start and stop --------------------------------------------------------------

    def start(self) -> LocalSparkCluster:
        """Start the master, then the worker; return once the worker has registered."""
        if self._pids:
            msg = f"the cluster in {self.work_dir} is already started (pids {self._pids})"
            raise ClusterError(msg)
        from infra.services.spark import require_java  # imports pyspark: only when starting

        require_java()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.start_timeout
        try:
            self._start_master(deadline)
            self._start_worker(deadline)
        except BaseException:
            self.stop()
            raise
        self.save()
        log.info("Spark standalone cluster up: %s (UI %s, pids %s)", self._master_url,
                 self._web_ui_url, self._pids)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the daemons and everything they started; no orphans.

        SIGTERM the worker (which stops its executors), then the master; SIGKILL
        whatever of their sessions is left after ``timeout`` s, and wait until none is.
        """
        sessions = list(self._mains())
        for name in ("worker", "master"):
            pid = self._pids.get(name)
            if pid is not None and _is_running(pid, _MAINS[name]):
                _signal(pid, signal.SIGTERM)
                self._wait_gone([pid], timeout, f"the Spark {name} (pid {pid}) to stop")
        survivors = [pid for sid, main in sessions for pid, _ in _own_session(sid, main)]
        for pid in survivors:
            log.warning("SIGKILL %d, left over by the Spark cluster", pid)
            _signal(pid, signal.SIGKILL)
        if survivors:
            self._wait_gone(survivors, timeout, f"processes {survivors} to die of SIGKILL",
                            strict=True)
        for process in self._processes.values():
            process.wait(timeout)
        self._processes.clear()
        self._pids.clear()
        (self.work_dir / CLUSTER_FILE).unlink(missing_ok=True)

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- found again by a later process ----------------------------------------------

    def save(self) -> None:
        """Record master URL, web UI and pids in ``<work_dir>/cluster.json``."""
        state = {"master_url": self.master_url, "web_ui_url": self.web_ui_url,
                 "pids": self._pids}
        (self.work_dir / CLUSTER_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def attach(cls, work_dir: Path | str) -> LocalSparkCluster | None:
        """The cluster a :meth:`start` (in any process) left running in ``work_dir``.

        None when there is none, or it is no longer alive: then whatever is left of it
        is stopped and its file removed.
        """
        cluster = cls(work_dir)
        path = cluster.work_dir / CLUSTER_FILE
        try:
            state = json.loads(path.read_text())
            cluster._master_url, cluster._web_ui_url = state["master_url"], state["web_ui_url"]
            cluster._pids = {name: int(pid) for name, pid in state["pids"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if not cluster.alive():
            cluster.stop()
            return None
        return cluster

    # -- internals -------------------------------------------------------------------

    def _start_master(self, deadline: float) -> None:
        def lost() -> ClusterError:
            return ClusterError(f"the Spark master found its ports taken {self.port_attempts} "
                                "times: free some loopback ports or raise port_attempts (log: "
                                f"{self.master_log})")

        on_other_ports(lambda _: self._spawn_master(deadline), self.port_attempts,
                       "the Spark master", lost=lost)

    def _spawn_master(self, deadline: float) -> None:
        """One start of the master; :class:`PortTaken` if it could not bind its ports."""
        port, ui_port = HOST_MASTER_PORTS if self.hosts else (free_port(), free_port())
        host = self.address("master")
        url, ui = f"spark://{host}:{port}", f"http://{host}:{ui_port}"
        process = self._spawn("master", [MASTER_CLASS, "--host", host, "--port",
                                         str(port), "--webui-port", str(ui_port)])

        def serving() -> bool:
            state = _get_json(f"{ui}/json/", 2.0)
            return state is not None and state.get("url") == url

        try:
            self._await(serving, deadline, "the Spark master's web UI to answer")
        except ClusterError:
            if process.poll() is None or not _log_says(self.master_log, _BIND_FAILURE):
                raise
            process.wait(10)
            del self._processes["master"], self._pids["master"]
            msg = f"the master's ports {port}/{ui_port} were taken"
            raise PortTaken(msg) from None
        self._master_url, self._web_ui_url = url, ui

    def _start_worker(self, deadline: float) -> None:
        self._spawn("worker", self.worker_args("worker"))

        def registered() -> bool:
            state = _get_json(f"{self.web_ui_url}/json/", 2.0)
            return bool(state and state.get("aliveworkers", 0) >= 1)

        self._await(registered, deadline, "the Spark worker to register with the master")

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        properties = self.properties_path
        properties.write_text("".join(f"{k} {v}\n" for k, v in _DAEMON_PROPERTIES.items()))
        out: IO[bytes]
        argv = ["bash", str(lean_home() / "bin" / "spark-class"), *args,
                "--properties-file", str(properties)]
        host = self.hosts.get(name)
        with (self.work_dir / f"{name}.log").open("ab") as out:
            self._log_offsets[name] = out.tell()
            process = subprocess.Popen(
                host.argv(argv) if host else argv,
                cwd=self.work_dir, env=self._env(name), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        # spark-class execs the JVM: the pid is the JVM's, the leader of a new session.
        self._processes[name], self._pids[name] = process, process.pid
        return process

    def worker_args(self, name: str) -> list[str]:
        """Worker ``name``'s arguments to ``spark-class``, for the running master."""
        # Port 0: the worker's RPC and UI ports are the OS's pick, so they cannot clash;
        # the master's JSON tells them.
        return [WORKER_CLASS, self.master_url, "--host", self.address(name), "--port", "0",
                "--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(self.work_dir / "work")]

    def address(self, name: str) -> str:
        """The address daemon ``name`` binds: its host's, or loopback."""
        host = self.hosts.get(name)
        return host.address if host else LOOPBACK

    def _env(self, name: str) -> dict[str, str]:
        env = dict(os.environ)
        # The daemons' JIT stops at C1 as the job's JVMs' does (infra.services.process.JIT_OPTIONS).
        daemon_options = f"{JIT_OPTIONS} {env.get('SPARK_DAEMON_JAVA_OPTS', '')}".strip()
        # pip's PySpark, without the source zips its Python workers would compile at every
        # start (infra.services.spark_home), whatever $SPARK_HOME says: the daemons must run the
        # Spark of the pyspark that drives them.
        env.update(SPARK_HOME=str(lean_home()), SPARK_LOCAL_IP=self.address(name),
                   SPARK_DAEMON_MEMORY=self.daemon_memory, SPARK_DAEMON_JAVA_OPTS=daemon_options,
                   SPARK_WORKER_DIR=str(self.work_dir / "work"))
        # The daemons must not pick up a Spark configuration meant for something else.
        env.pop("SPARK_CONF_DIR", None)
        return env

    def _await(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        """Poll ``ready`` until it holds; raise if a daemon exits or time runs out."""
        while not ready():
            for name, process in self._processes.items():
                if process.poll() is not None:
                    log_path = self.work_dir / f"{name}.log"
                    msg = (f"the Spark {name} exited with code {process.returncode} while "
                           f"waiting for {what}; the end of {log_path}:\n{_tail(log_path)}")
                    raise ClusterError(msg)
            if time.monotonic() >= deadline:
                msg = (f"timed out after {self.start_timeout:.0f}s waiting for {what}; see "
                       f"{self.master_log} and {self.worker_log} (a busy machine may need a "
                       "larger start_timeout)")
                raise ClusterError(msg)
            time.sleep(0.25)

    def _wait_gone(self, pids: list[int], timeout: float, what: str,
                   strict: bool = False) -> None:
        deadline = time.monotonic() + timeout
        while any(self._running(pid) for pid in pids):
            if time.monotonic() >= deadline:
                if strict:
                    msg = f"timed out after {timeout:.0f}s waiting for {what}"
                    raise ClusterError(msg)
                log.warning("timed out after %.0fs waiting for %s", timeout, what)
                return
            time.sleep(0.1)

    def _running(self, pid: int) -> bool:
        for process in self._processes.values():
            if process.pid == pid:
                return process.poll() is None  # reaps our own children
        return _is_running(pid)

    def _mains(self) -> Iterator[tuple[int, str]]:
        return ((pid, _MAINS[name]) for name, pid in self._pids.items())


class SparkDaemon:
    """One daemon of a :class:`LocalSparkCluster`, behind the local service interface.

    :meth:`start` starts the master (on free ports), or a worker for the running
    master; :meth:`stop` stops this daemon alone (a worker stops its executors).
    """

    def __init__(self, cluster: LocalSparkCluster, name: str) -> None:
        self.cluster, self.name = cluster, name

    @property
    def pid(self) -> int:
        pid = self.cluster.pids.get(self.name)
        if pid is None:
            msg = f"the Spark {self.name} is not started"
            raise ClusterError(msg)
        return pid

    @property
    def log_path(self) -> Path:
        return self.cluster.work_dir / f"{self.name}.log"

    @property
    def marker(self) -> str:
        """The daemons' properties file, which its command line names."""
        return str(self.cluster.properties_path)

    def start(self) -> SparkDaemon:
        deadline = time.monotonic() + self.cluster.start_timeout
        if self.name == "master":
            self.cluster._start_master(deadline)
            return self
        self.cluster._spawn(self.name, self.cluster.worker_args(self.name))
        self.cluster._await(self.ready, deadline, f"the Spark {self.name} to register")
        return self

    def ready(self) -> bool:
        return self.cluster.daemon_ready(self.name)

    def stop(self) -> None:
        pid = self.cluster.pids.get(self.name)
        if pid is not None and _is_running(pid, _MAINS.get(self.name, WORKER_CLASS)):
            _signal(pid, signal.SIGTERM)
            self.cluster._wait_gone([pid], 30.0, f"the Spark {self.name} (pid {pid}) to stop")


def _get_json(url: str, timeout: float) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback
            value = json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return value if isinstance(value, dict) else None


def _is_running(pid: int, main_class: str | None = None) -> bool:
    """Alive and not a zombie; running ``main_class`` if given (guards a reused pid)."""
    return procs.running(pid, main_class)


def _own_session(sid: int, main_class: str) -> list[tuple[int, str]]:
    """Members of the session a daemon running ``main_class`` leads or led.

    While any member lives, the kernel does not hand the session's number out again,
    so members of a session whose leader is gone are the daemon's orphans; a live
    leader running something else means the number was reused: none of ours is left.
    """
    members = procs.session_members(sid)
    if any(pid == sid and main_class not in cmdline for pid, cmdline in members):
        return []
    return members


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _log_says(path: Path, needles: tuple[str, ...]) -> bool:
    text = _tail(path, 20_000)
    return any(needle in text for needle in needles)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - chars))
            return f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
