"""A Cassandra cluster on this machine: N nodes on 127.0.0.1, .2, .3, ... (as ccm does).

This module owns the multi-node store of ``fanout up --nodes N`` (DESIGN §10). Linux
routes all of 127.0.0.0/8 to loopback, so every node listens on an address of its
own with the *same* CQL and storage ports — a store URL names one port for the whole
cluster (``cassandra://127.0.0.1,127.0.0.2,127.0.0.3:PORT/ks``). Each node is a
:class:`~infra.services.cassandra.LocalCassandra` (same JVM flags, same small pools) with its
own data directory ``<data_dir>/node-<i>`` and a ``cassandra.yaml`` that names its
address, every node as a seed, one token each and ``auto_bootstrap: false``: a new,
empty cluster has nothing to stream, so the nodes take evenly spaced initial tokens
and join at once, as ccm's populated clusters do. A short ring delay
(``cassandra.ring_delay_ms``) keeps a start near the JVM's own start-up time; the
start then waits until each node it started lists every other node and all report
one schema version (:func:`_wait_for_ring`), so that the first DDL reaches a ring
that knows its size.

The ports are chosen at the first start and recorded in ``<data_dir>/ring.json``;
a restarted node takes them again (they belong to its address, which nothing else
uses). A port found free can be taken by another process before a JVM binds it: a new
ring's first start then begins again on other ports, its nodes' data (never served)
removed (:func:`~infra.services.ports.on_other_ports`); a ring that has run keeps its
ports, and a taken one fails, saying which file names it.

On hosts of their own (``fanout up --hosts``, :mod:`infra.services.hosts`) each node runs in
its host's network namespace, and its listen, broadcast and RPC addresses and the
seeds are the hosts' addresses, with Cassandra's usual ports (:data:`HOST_PORTS`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Final

from infra.services.cassandra import (
    PID_FILE,
    CassandraError,
    LocalCassandra,
    Ports,
    lost_a_port,
    node_yaml,
    running_pid,
)
from infra.services.hosts import Host
from infra.services.jars import CASSANDRA, classpath
from infra.services.ports import PORT_ATTEMPTS, PortTaken, on_other_ports
from infra.services.process import LOOPBACK, free_port, log_tail

log = logging.getLogger(__name__)

RING_FILE: Final = "ring.json"
#: Milliseconds a joining node waits for the ring's state (Cassandra's default: 30 s).
RING_DELAY_MS: Final = 2000
#: Seconds a start waits for its nodes to know the whole ring and agree on the schema.
SETTLE_S: Final = 90.0
_MIN_TOKEN: Final = -(2**63)
#: Every node's ports when each has a host of its own (JMX stays on the host's loopback).
HOST_PORTS: Final = Ports(native=9042, storage=7000, jmx=7199)


def address(node: int) -> str:
    """The loopback address of node ``node`` (1-based): 127.0.0.<node>."""
    return f"127.0.0.{node}"


def initial_token(node: int, nodes: int) -> int:
    """Evenly spaced Murmur3 tokens, as ``ccm`` and Cassandra's token generator give."""
    return _MIN_TOKEN + (node - 1) * (2**64 // nodes)


class RingNode(LocalCassandra):
    """One node of a ring: :class:`LocalCassandra` on its own loopback address."""

    def __init__(self, data_dir: Path, log_path: Path, *, node: int, nodes: int, ports: Ports,
                 heap_mb: int = 320, start_timeout: float = 240.0,
                 hosts: dict[int, Host] | None = None) -> None:
        super().__init__(data_dir, log_path, heap_mb=heap_mb, start_timeout=start_timeout,
                         stop_timeout=30.0)
        self.placed = hosts or {}  # node -> its host (``hosts`` is the contact point)
        self.node, self.nodes, self.address = node, nodes, self._address_of(node)
        self._fixed = ports

    def _address_of(self, node: int) -> str:
        host = self.placed.get(node)
        return host.address if host else address(node)

    @property
    def hosts(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def config_path(self) -> Path:
        """The node's ``cassandra.yaml``; its JVM's command line names it."""
        return self.data_dir.resolve() / "cassandra.yaml"

    @property
    def marker(self) -> str:
        return str(self.config_path)

    def start(self) -> RingNode:
        """Spawn the node; return once it answers CQL on its address."""
        if running_pid(self.data_dir) is not None:
            msg = (f"Cassandra node {self.node} (pid {running_pid(self.data_dir)}) already "
                   f"runs on {self.data_dir}: stop it first (`fanout down`)")
            raise CassandraError(msg)
        jars = classpath(CASSANDRA, self._jar_root)
        java = self._find_java()
        self._make_dirs()
        self._ports = self._fixed
        self._log_file = self.log_path.open("ab")
        began = time.monotonic()
        try:
            self._spawn(java, jars, began + self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        log.info("Cassandra node %d pid %d on %s answered CQL after %.1fs", self.node, self.pid,
                 self.hosts, self.started_in)
        return self

    def _spawn(self, java: str, jars: list[Path], deadline: float) -> bool:
        assert self._ports is not None and self._log_file is not None
        self.config_path.write_text(self.yaml())
        argv = [java, *self._jvm_options(jars),
                f"-Dcassandra.ring_delay_ms={RING_DELAY_MS}",
                "org.apache.cassandra.service.CassandraDaemon"]
        host = self.placed.get(self.node)
        offset = self._log_file.seek(0, os.SEEK_END)
        process = self._process = self._popen(host.argv(argv) if host else argv)
        (self.data_dir / PID_FILE).write_text(str(process.pid))
        try:
            _wait_for_cql(process, self.address, self._ports.native, deadline, self.log_path)
        except CassandraError:
            if process.poll() is not None and lost_a_port(self.log_path, offset):
                raise PortTaken(self.log_path) from None
            raise
        return True

    def yaml(self) -> str:
        """The single node's yaml with this node's address, the ring's seeds and token."""
        assert self._ports is not None
        text = node_yaml(self.data_dir, self._ports)
        seeds = ",".join(f"{self._address_of(n)}:{self._ports.storage}"
                         for n in range(1, self.nodes + 1))
        text = re.sub(r'seeds: ".*"', f'seeds: "{seeds}"', text)
        for key, value in (("listen_address", self.address), ("rpc_address", self.address),
                           ("memtable_heap_space", "48MiB"),
                           ("memtable_offheap_space", "48MiB")):
            text = re.sub(rf"(?m)^{key}: .*$", f"{key}: {value}", text)
        return (text + f"initial_token: {initial_token(self.node, self.nodes)}\n"
                "auto_bootstrap: false\n")


def start_groups(which: list[int], *, seeded: bool) -> list[list[int]]:
    """The nodes ``which`` in the groups that start one after another, each side by side.

    ``seeded``: another node of the ring runs and is a seed to every node started.
    Otherwise the first node starts alone, the seed of the rest.
    """
    return [which] if seeded else [g for g in (which[:1], which[1:]) if g]


class CassandraRing:
    """``nodes`` Cassandra nodes on 127.0.0.1..N sharing one CQL and one storage port."""

    def __init__(self, data_dir: Path | str, log_dir: Path | str, *, nodes: int = 3,
                 heap_mb: int = 320, start_timeout: float = 300.0,
                 hosts: dict[int, Host] | None = None) -> None:
        self.hosts = hosts or {}
        self.data_dir = Path(data_dir).resolve()
        self.log_dir = Path(log_dir).resolve()
        self.nodes, self.heap_mb, self.start_timeout = nodes, heap_mb, start_timeout
        self._ports: dict[int, Ports] = {}
        self.started: dict[int, RingNode] = {}

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.nodes + 1))

    @property
    def port(self) -> int:
        """The CQL port every node listens on."""
        return self._load()[1].native

    def url(self, keyspace: str, options: str = "") -> str:
        """A store URL naming every node, the keyspace at RF ``nodes`` and ``options``."""
        hosts = ",".join(self.hosts[n].address if self.hosts else address(n)
                         for n in self.node_ids)
        return (f"cassandra://{hosts}:{self.port}/{keyspace}?rf={self.nodes}"
                + (f"&{options}" if options else ""))

    def node(self, node: int) -> RingNode:
        """Node ``node`` as an object (started or not): its paths, its config."""
        return RingNode(self.data_dir / f"node-{node}", self.log_dir / f"cassandra-{node}.log",
                        node=node, nodes=self.nodes, ports=self._load()[node],
                        heap_mb=self.heap_mb, start_timeout=self.start_timeout,
                        hosts=self.hosts)

    def member(self, node: int) -> RingNode:
        """Started node ``node`` (a :class:`~infra.services.service.Service`)."""
        return self.started[node]

    def start(self, which: list[int] | None = None) -> CassandraRing:
        """Start nodes ``which`` (default all) side by side; the first alone when none runs.

        With no node of the ring running, the first starts alone so that the others
        find a live seed. Each lists every node as a seed, so a node the ring kept
        running serves: nodes started again beside one start together. A new ring
        whose port another process took first starts again on other ports (module
        docstring).
        """
        which = self.node_ids if which is None else sorted(which)
        new = not self.hosts and not self._ports and not (self.data_dir / RING_FILE).exists()

        def attempt(number: int) -> None:
            if number > 1:
                self._forget(which)
            seeded = any(running_pid(self.node(n).data_dir) is not None
                         for n in self.node_ids if n not in which)
            try:
                for group in start_groups(which, seeded=seeded):
                    errors: list[BaseException] = []
                    threads = [threading.Thread(target=self._start_one, args=(n, errors))
                               for n in group]
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
                    if errors:
                        raise next((e for e in errors if isinstance(e, PortTaken)), errors[0])
            except BaseException:
                for node in which:  # the nodes this start started; the others run on
                    if node in self.started:
                        self.started.pop(node).stop()
                raise

        def lost() -> CassandraError:
            if new:
                return CassandraError(
                    f"the Cassandra nodes lost a port to another process at each of "
                    f"{PORT_ATTEMPTS} starts; see the ends of their logs in {self.log_dir}")
            return CassandraError(
                f"a port of the ring recorded in {self.data_dir / RING_FILE} is taken by "
                f"another process (see the ends of the logs in {self.log_dir}): free it "
                "and run `fanout up` again")

        on_other_ports(attempt, PORT_ATTEMPTS if new else 1, "Cassandra ring", lost=lost)
        _wait_for_ring([self.started[n] for n in which], self.nodes, SETTLE_S)
        return self

    def _start_one(self, node: int, errors: list[BaseException]) -> None:
        try:
            self.started[node] = self.node(node).start()
        except BaseException as exc:  # reported by start(), on the caller's thread
            errors.append(exc)

    def stop(self) -> None:
        """Stop the nodes this object started, side by side (each drains its memtables)."""
        threads = [threading.Thread(target=n.stop) for n in self.started.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.started.clear()

    def _forget(self, which: list[int]) -> None:
        """Drop a new ring's ports and its nodes' data (they never served)."""
        self._ports = {}
        (self.data_dir / RING_FILE).unlink(missing_ok=True)
        for node in which:
            shutil.rmtree(self.data_dir / f"node-{node}", ignore_errors=True)

    def _load(self) -> dict[int, Ports]:
        """Every node's ports: the recorded ones, else chosen now and recorded.

        One CQL and one storage port for all nodes, a JMX port each.
        """
        if self._ports:
            return self._ports
        path = self.data_dir / RING_FILE
        try:
            recorded = json.loads(path.read_text())
            self._ports = {int(n): Ports(**p) for n, p in recorded.items()}
        except (OSError, ValueError, TypeError):
            self._ports = {}
        if self._ports and sorted(self._ports) != self.node_ids:
            msg = (f"{path} records {len(self._ports)} Cassandra node(s), not {self.nodes}: a "
                   "ring keeps its size; use a fresh run directory for another")
            raise CassandraError(msg)
        if not self._ports and self.hosts:
            self._ports = dict.fromkeys(self.node_ids, HOST_PORTS)
            self.data_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({n: p.__dict__ for n, p in self._ports.items()},
                                       indent=2) + "\n")
        if not self._ports:
            native, storage = _free_on_all(self.nodes), _free_on_all(self.nodes)
            while storage == native:
                storage = _free_on_all(self.nodes)
            jmx: set[int] = set()
            while len(jmx) < self.nodes:
                jmx.add(free_port())
            self._ports = {n: Ports(native, storage, j)
                           for n, j in zip(self.node_ids, sorted(jmx), strict=True)}
            self.data_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({n: p.__dict__ for n, p in self._ports.items()},
                                       indent=2) + "\n")
        return self._ports


def _free_on_all(nodes: int) -> int:
    """A port free on 127.0.0.1 and on every node's address."""
    from infra.services.process import port_free

    while True:
        port = free_port()
        if all(port_free(port, address(n)) for n in range(1, nodes + 1)):
            return port


def _wait_for_cql(process: subprocess.Popen[bytes], host: str, port: int, deadline: float,
                  log_path: Path) -> None:
    """Wait until the node at ``host`` answers a query; raise if it exits or time runs out."""
    from cassandra import DriverException
    from cassandra.cluster import NoHostAvailable

    def fail(what: str) -> None:
        msg = f"Cassandra on {host}:{port} {what}; the end of {log_path}:\n{log_tail(log_path)}"
        raise CassandraError(msg)

    while True:
        if process.poll() is not None:
            fail(f"exited with code {process.returncode} during start")
        if time.monotonic() >= deadline:
            fail("did not answer CQL in time")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                pass
        except OSError:
            time.sleep(0.5)
            continue
        cluster = node_cluster(host, port)
        try:
            cluster.connect().execute("SELECT release_version FROM system.local", timeout=5)
            return
        except (DriverException, NoHostAvailable, OSError) as exc:
            log.debug("Cassandra on %s not answering yet: %s", host, exc)
            time.sleep(0.5)
        finally:
            cluster.shutdown()


def node_cluster(host: str, port: int) -> Any:
    """A driver ``Cluster`` that sends every request to the node at ``host`` only.

    What that node answers is its own view (its peers, its schema), not the ring's.
    """
    from cassandra.cluster import Cluster
    from cassandra.policies import WhiteListRoundRobinPolicy

    return Cluster([host], port=port, protocol_version=5, connect_timeout=5,
                   load_balancing_policy=WhiteListRoundRobinPolicy([host]))


def _wait_for_ring(started: list[RingNode], nodes: int, wait: float) -> None:
    """Wait until each started node lists every other node and all agree on the schema.

    A node answers CQL before gossip has told it of the others; a keyspace created
    through it then counts one node, and the driver's schema-agreement wait (asked of
    one node's peers) passes while other nodes lack the keyspace. After ``wait``
    seconds this only warns: a node restarted while others are down cannot settle,
    and the schema steps check agreement again.
    """
    from cassandra import DriverException
    from cassandra.cluster import NoHostAvailable

    deadline, began = time.monotonic() + wait, time.monotonic()
    left = {node.address: node for node in started}
    seen: dict[str, str] = {}
    while left and time.monotonic() < deadline:
        for host, node in list(left.items()):
            cluster = node_cluster(host, node.port)
            try:
                session = cluster.connect()
                local = session.execute("SELECT schema_version FROM system.local", timeout=5).one()
                peers = list(session.execute("SELECT peer, schema_version FROM system.peers_v2",
                                             timeout=5))
            except (DriverException, NoHostAvailable, OSError) as exc:
                seen[host] = f"not answering ({exc})"
                continue
            finally:
                cluster.shutdown()
            versions = {local.schema_version, *(p.schema_version for p in peers)}
            seen[host] = f"{len(peers)} of {nodes - 1} peers, {len(versions)} schema version(s)"
            if len(peers) == nodes - 1 and len(versions) == 1:
                del left[host]
        if left:
            time.sleep(1.0)
    if left:
        log.warning("Cassandra nodes %s did not settle in %.0fs: %s", sorted(left), wait,
                    "; ".join(f"{h}: {seen.get(h, '?')}" for h in sorted(left)))
    else:
        log.info("Cassandra ring of %d settled after %.1fs", nodes, time.monotonic() - began)


__all__ = ("LOOPBACK", "CassandraRing", "RingNode", "address", "initial_token",
           "node_cluster")
