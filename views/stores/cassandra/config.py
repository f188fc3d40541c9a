"""How the Cassandra store connects: its URL, consistency levels, policies, replication.

Everything a deployment tunes is in the store URL, so that the one setting every
process already has (``FANOUT_STORE``) carries it::

    cassandra://[user:password@]host1,host2[:port]/keyspace[?option=value&...]

One port serves the whole cluster (the driver also uses it for the peers it
discovers), so it may follow the last host or every host, but there is one. Options:

=============  =====================================================================
``rf``         replication factor with SimpleStrategy (dev/test; default 1)
``dc``         NetworkTopologyStrategy factors, ``dc1:3,dc2:3`` (production)
``local_dc``   datacenter the client prefers (default: the first contact point's)
``read_cl``    consistency of reads (default LOCAL_QUORUM)
``write_cl``   consistency of the job's writes and of its own reads (LOCAL_QUORUM)
``concurrency``  statements in flight per micro-batch phase (default 64)
``timeout``    request timeout in seconds (default 10), and the control connection's: on
               connecting it reads the cluster's schema, which a loaded node with
               many keyspaces takes past the driver's own 2 s to answer
``speculate_ms``  reads only: a read with no answer after this long is sent to the next
               replica too, up to two more (default 200; 0: never). Reads are
               idempotent, so the first answer wins; a node cut off (packets dropped,
               so nothing fails) then costs a read this delay, not ``timeout``
``heartbeat``  whole seconds between the driver's heartbeats on a connection that
               received nothing (default 2; 0: none)
``heartbeat_timeout``  seconds a heartbeat waits for its answer before the connection is
               closed and its node marked down (default 4): a silent node is down
               within two heartbeats and this, 8 s by default (the driver's 30 + 30:
               up to 90 s)
``scan_timeout``  timeout of full-table reads: counts, home_users (default 120)
``trim_slack``  rows a timeline may grow past the cap before it is trimmed
               (default max(16, cap/4): trims are amortized, as in SQLite)
``upkeep``     batches a timeline's upkeep is spread over (default 8; 1: every batch).
               A batch that only adds a few entries to a user's timeline (at most
               ``trim_slack`` over ``upkeep``) writes just its ``home_chunks`` row;
               the user's ``timeline_meta`` (horizon, counts, newest read), merge
               and dormancy are kept up in about one of ``upkeep`` such batches,
               and in every batch that reads, removes, wipes or raises the horizon
               (``statements.blind_users``)
``retry``      seconds the job's writes keep retrying while the cluster does not answer
               (a node restarting), with backoff, before the job stops (default 120)
``schema``     ``check`` (default: require ``fanout schema apply``) or ``auto``
``ssl``        ``1`` to connect with TLS, verified against the system CAs
``page_fresh_ms``  how long an API process's page caches take the store's last
               answer to "what is committed?" as current (default 20; 0: ask on
               every read). Reads within it share one question; a page may then
               lag a commit by at most this long (``?after=`` reads never do)
=============  =====================================================================

The write level must see the writer's own earlier writes (it reads before it
writes: horizons, profiles, delete times, trims), so with ``write_cl`` below a
quorum, reads-before-writes can miss them; keep QUORUM-class levels unless the
cluster has one replica.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from ssl import create_default_context
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

from cassandra import ConsistencyLevel
from cassandra.policies import (
    ConstantSpeculativeExecutionPolicy,
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)

from views.errors import StoreError

DEFAULT_PORT: Final = 9042
WRITE_PROFILE: Final = "fanout-write"
#: Speculative executions of a read after the first: with RF 3, every replica is tried.
SPECULATIVE_ATTEMPTS: Final = 2
#: The longest wait between two attempts to reach a node that is down (seconds).
RECONNECT_MAX_S: Final = 10.0
#: Keyspace names Cassandra accepts unquoted (it caps them at 48 characters).
KEYSPACE_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")
#: Datacenter names as nodetool shows them; quoted as CQL string literals.
DC_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_READ_LEVELS: Final = ("ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "LOCAL_ONE")
_WRITE_LEVELS: Final = (*_READ_LEVELS, "EACH_QUORUM")


class ConfigError(StoreError):
    """A Cassandra store URL or option that cannot work."""


@dataclass(frozen=True)
class Replication:
    """Keyspace replication: SimpleStrategy (one factor) or per-datacenter factors."""

    strategy: str = "SimpleStrategy"
    factors: tuple[tuple[str, int], ...] = (("replication_factor", 1),)

    @classmethod
    def simple(cls, rf: int) -> Replication:
        return cls("SimpleStrategy", (("replication_factor", _positive("rf", rf)),))

    @classmethod
    def per_dc(cls, spec: str) -> Replication:
        """From ``dc1:3,dc2:3``."""
        factors = []
        for part in spec.split(","):
            name, _, rf = part.partition(":")
            if not DC_RE.fullmatch(name) or not rf.isdigit():
                msg = f"bad dc option {spec!r}: expected dc1:3,dc2:3"
                raise ConfigError(msg)
            factors.append((name, _positive("dc factor", int(rf))))
        return cls("NetworkTopologyStrategy", tuple(factors))

    def cql_map(self) -> str:
        """The ``replication`` map literal of CREATE KEYSPACE (validated names only)."""
        items = [("class", f"'{self.strategy}'")] + [(k, str(v)) for k, v in self.factors]
        return "{" + ", ".join(f"'{k}': {v}" for k, v in items) + "}"


@dataclass(frozen=True)
class CassandraConfig:
    """Everything the Cassandra store needs to connect; see the module docstring."""

    hosts: tuple[str, ...]
    keyspace: str
    port: int = DEFAULT_PORT
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    local_dc: str | None = None
    replication: Replication = Replication()
    read_cl: int = ConsistencyLevel.LOCAL_QUORUM
    write_cl: int = ConsistencyLevel.LOCAL_QUORUM
    concurrency: int = 64
    timeout: float = 10.0
    speculate_s: float = 0.2
    heartbeat_s: float = 2.0
    heartbeat_timeout_s: float = 4.0
    scan_timeout: float = 120.0
    trim_slack: int | None = None
    upkeep: int = 8
    retry_s: float = 120.0
    auto_schema: bool = False
    ssl: bool = False
    page_fresh_s: float = 0.02


def parse_url(url: str) -> CassandraConfig:
    """Parse ``cassandra://[user:pw@]h1,h2[:port]/keyspace?opts`` (raises ConfigError)."""
    parts = urlsplit(url)
    if parts.scheme != "cassandra":
        msg = f"not a cassandra:// URL: {url!r}"
        raise ConfigError(msg)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    hosts, port = _hosts(hostlist)
    keyspace = parts.path.removeprefix("/")
    if not KEYSPACE_RE.fullmatch(keyspace):
        msg = (f"store URL needs a keyspace: cassandra://hosts/KEYSPACE, letters, digits "
               f"and _ (got {keyspace!r})")
        raise ConfigError(msg)
    user, _, password = userinfo.partition(":")
    return CassandraConfig(hosts, keyspace, port, unquote(user) or None,
                           unquote(password) or None, **_options(parts.query))


def _hosts(hostlist: str) -> tuple[tuple[str, ...], int]:
    hosts, ports = [], set()
    for item in filter(None, hostlist.split(",")):
        host, port = _host_port(item)
        hosts.append(host)
        if port is not None:
            ports.add(port)
    if not hosts:
        msg = "store URL names no Cassandra host: cassandra://host1,host2/keyspace"
        raise ConfigError(msg)
    if len(ports) > 1:
        msg = f"one native port serves the whole cluster, got {sorted(ports)}"
        raise ConfigError(msg)
    return tuple(hosts), ports.pop() if ports else DEFAULT_PORT


def _host_port(item: str) -> tuple[str, int | None]:
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":") or None
    else:
        host, _, port_text = item.partition(":")
        port = port_text or None
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        msg = f"bad port in Cassandra host {item!r}"
        raise ConfigError(msg)
    return host, int(port) if port else None


def _options(query: str) -> dict[str, Any]:
    raw = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=False))
    unknown = sorted(set(raw) - set(_OPTIONS))
    if unknown:
        msg = f"unknown Cassandra store option(s) {unknown}; known: {sorted(_OPTIONS)}"
        raise ConfigError(msg)
    if "rf" in raw and "dc" in raw:
        msg = "give either rf (SimpleStrategy) or dc (NetworkTopologyStrategy), not both"
        raise ConfigError(msg)
    out: dict[str, Any] = {}
    for name, text in raw.items():
        key, value = _OPTIONS[name](text)
        out[key] = value
    return out


def consistency_level(name: str, *, write: bool = False) -> int:
    """The driver's value for a level name (case-insensitive); serial levels refused."""
    allowed = _WRITE_LEVELS if write else _READ_LEVELS
    level = name.strip().upper()
    if level not in allowed:
        msg = f"consistency level {name!r} is not one of {', '.join(allowed)}"
        raise ConfigError(msg)
    return int(ConsistencyLevel.name_to_value[level])


def _positive(what: str, value: int) -> int:
    if value < 1:
        msg = f"{what} must be at least 1, got {value}"
        raise ConfigError(msg)
    return value


def _number(name: str, text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low < value <= high:
        msg = f"store option {name}={text!r} must be a number in ({low}, {high}]"
        raise ConfigError(msg)
    return value


def _flag(name: str, text: str) -> bool:
    if text.lower() not in ("0", "1", "true", "false"):
        msg = f"store option {name}={text!r} must be 0/1/true/false"
        raise ConfigError(msg)
    return text.lower() in ("1", "true")


def _schema_mode(text: str) -> bool:
    if text not in ("check", "auto"):
        msg = f"store option schema={text!r} must be check or auto"
        raise ConfigError(msg)
    return text == "auto"


def _count(name: str, text: str) -> int:
    if not text.isdigit():
        msg = f"store option {name}={text!r} must be a whole number"
        raise ConfigError(msg)
    return int(text)


def _int(name: str, text: str, most: int | None = None) -> int:
    if not text.isdigit():
        msg = f"store option {name}={text!r} must be a positive integer"
        raise ConfigError(msg)
    value = _positive(f"store option {name}", int(text))
    if most is not None and value > most:
        msg = f"store option {name}={text!r} must be at most {most}"
        raise ConfigError(msg)
    return value


_OPTIONS: Final[dict[str, Callable[[str], tuple[str, Any]]]] = {
    "rf": lambda t: ("replication", Replication.simple(_int("rf", t))),
    "dc": lambda t: ("replication", Replication.per_dc(t)),
    "local_dc": lambda t: ("local_dc", t or None),
    "read_cl": lambda t: ("read_cl", consistency_level(t)),
    "write_cl": lambda t: ("write_cl", consistency_level(t, write=True)),
    "concurrency": lambda t: ("concurrency", _int("concurrency", t, 2048)),
    "timeout": lambda t: ("timeout", _number("timeout", t, 0, 3600)),
    "speculate_ms": lambda t: ("speculate_s", _count("speculate_ms", t) / 1000),
    "heartbeat": lambda t: ("heartbeat_s", float(_count("heartbeat", t))),
    "heartbeat_timeout": lambda t: ("heartbeat_timeout_s",
                                    _number("heartbeat_timeout", t, 0, 3600)),
    "scan_timeout": lambda t: ("scan_timeout", _number("scan_timeout", t, 0, 86400)),
    "trim_slack": lambda t: ("trim_slack", _count("trim_slack", t)),
    "upkeep": lambda t: ("upkeep", _int("upkeep", t, 1024)),
    "retry": lambda t: ("retry_s", _number("retry", t, -1, 86400)),
    "schema": lambda t: ("auto_schema", _schema_mode(t)),
    "ssl": lambda t: ("ssl", _flag("ssl", t)),
    "page_fresh_ms": lambda t: ("page_fresh_s", _count("page_fresh_ms", t) / 1000),
}


# -- driver objects ----------------------------------------------------------------------

def load_balancing(local_dc: str | None) -> TokenAwarePolicy:
    """Token-aware routing over the local datacenter, replicas shuffled to spread load."""
    return TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=local_dc or ""),
                            shuffle_replicas=True)


def speculation(config: CassandraConfig) -> ConstantSpeculativeExecutionPolicy | None:
    """The read profile's speculative executions (None: ``speculate_ms=0``).

    A node cut off by dropped packets fails nothing: a request sent to it waits out
    the request timeout, and until a heartbeat marks the node down every read the
    shuffled replicas route there does. The driver sends a statement to the next host
    of its plan after ``speculate_ms`` only if the statement is idempotent (the store
    marks every one so: its writes are keyed, at explicit timestamps).
    """
    if not config.speculate_s:
        return None
    return ConstantSpeculativeExecutionPolicy(config.speculate_s, SPECULATIVE_ATTEMPTS)


def execution_profiles(config: CassandraConfig) -> dict[object, Any]:
    """The default (read) profile, which speculates, and the job's write profile.

    Writes do not speculate: a timed-out write is run again by the executor's retries
    (``executor.execute``), and a second copy of every slow batch would add load
    where the cluster is already slow.
    """
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, ExecutionProfile
    from cassandra.query import tuple_factory

    def profile(level: int, speculative: Any = None) -> ExecutionProfile:
        return ExecutionProfile(load_balancing_policy=load_balancing(config.local_dc),
                                consistency_level=level,
                                serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
                                request_timeout=config.timeout, row_factory=tuple_factory,
                                speculative_execution_policy=speculative)

    return {EXEC_PROFILE_DEFAULT: profile(config.read_cl, speculation(config)),
            WRITE_PROFILE: profile(config.write_cl)}


def cluster_options(config: CassandraConfig) -> dict[str, Any]:
    """Keyword arguments of ``cassandra.cluster.Cluster`` (building it does no I/O)."""
    options: dict[str, Any] = {
        "contact_points": list(config.hosts), "port": config.port,
        "execution_profiles": execution_profiles(config), "application_name": "fanout",
        "connect_timeout": min(config.timeout, 10.0),
        "control_connection_timeout": config.timeout,
        "idle_heartbeat_interval": config.heartbeat_s,
        "idle_heartbeat_timeout": config.heartbeat_timeout_s,
        # A node back from an outage is found within RECONNECT_MAX_S: the driver's
        # default doubles its wait up to 600 s (and gives up after 64 tries), so an API
        # or job that saw a long outage could stay degraded minutes after the node is up.
        "reconnection_policy": ExponentialReconnectionPolicy(1.0, RECONNECT_MAX_S,
                                                             max_attempts=None),
    }
    if config.username:
        from cassandra.auth import PlainTextAuthProvider

        options["auth_provider"] = PlainTextAuthProvider(config.username,
                                                         config.password or "")
    if config.ssl:
        options["ssl_context"] = create_default_context()
    return options


class _Negotiation(logging.Filter):
    """The driver's protocol negotiation, logged at DEBUG instead of WARNING.

    Offered a newer protocol than a node speaks, the driver steps down one version at a
    time and warns at each step ("Downgrading core protocol version ..."): two warnings
    per connection to a Cassandra 5.0 node. Pinning a version would refuse older
    clusters, so the steps are kept and only demoted.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and str(record.msg).startswith(
                "Downgrading core protocol version"):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_NEGOTIATION: Final = _Negotiation()


def new_cluster(config: CassandraConfig) -> Any:
    """A driver ``Cluster`` for ``config``; it connects only on ``connect()``."""
    from cassandra.cluster import Cluster

    logging.getLogger("cassandra.cluster").addFilter(_NEGOTIATION)  # kept once per logger
    release_finished_requests()
    return Cluster(**cluster_options(config))


def release_finished_requests() -> None:
    """Let a finished request go when its last reference does (installed once).

    The driver's ``ResponseFuture`` keeps its timeout timer after cancelling it, and the
    timer keeps the future's bound method as its callback: a reference cycle, so every
    finished request, with its message and its rows, waited for Python's cyclic
    collector. Reading full timelines that was ~2,000 objects a timeline and a tenth of
    a reader's CPU spent in collections. Cancelling now also swaps the callback for one
    that does nothing (the timer itself stays, so a later page of the same request gets
    no new timer, as before).
    """
    from cassandra.cluster import ResponseFuture

    cancel = ResponseFuture._cancel_timer
    if getattr(cancel, "releases_future", False):
        return

    def _cancel_timer(future: Any) -> None:
        timer = future._timer
        cancel(future)
        if timer is not None:
            timer.callback = _finished

    _cancel_timer.releases_future = True  # type: ignore[attr-defined]
    ResponseFuture._cancel_timer = _cancel_timer


def _finished() -> None:
    """A cancelled timer's callback: its request has its answer already."""
