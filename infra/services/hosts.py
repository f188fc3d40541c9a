"""Hosts of their own on this machine: a bridge, a network namespace per node, an address each.

``fanout up --nodes N --hosts`` (DESIGN §12, ``docs/design.md`` §9) runs every Kafka,
Cassandra and Spark node in a network namespace of its own, so that the traffic
between them crosses a network the nemesis (:mod:`infra.faults.nemesis`) can cut, slow or
make lossy. This module owns that network: a Linux bridge in the root namespace with
the first address of a private /24 (the job, the API and the load generator stay in
the root namespace and reach the nodes through it), and per host a namespace
``fanout-<run id>-<host>``, a veth pair whose root end is a port of the bridge and
whose other end is the host's ``eth0``, an address, and ``lo`` up. The hosts get no
default route and nothing is NATed: a host reaches the other hosts and the bridge's
address, nothing else.

Every name carries the run's id (four hex digits, kept in ``<run>/hosts.json`` with
the subnet, so a stack brought down and up again gets the same addresses, which its
Kafka voters and Cassandra peers record). Before a namespace or link is made, its name
is written to that file (write-ahead), so :func:`remove` — run by ``fanout down``, and
by the next ``up`` or ``down`` after a crash — deletes all of it even when the process
that made it was killed half-way. Deleting a namespace deletes its veth pair, its
``iptables`` rules and qdiscs with it. A run whose directory is gone altogether (a
test's temporary directory, deleted after the test was killed) is found through
:data:`REGISTRY`, and its hosts are removed by the next run's ``up`` or ``down``.

Making hosts needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and ``ip netns``;
:func:`require_netns` refuses with the reason and what to do, and nothing falls back
to loopback.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from infra.errors import InfraError

log = logging.getLogger(__name__)

HOSTS_FILE: Final = "hosts.json"
#: Subnets tried, in order, when none is given: 10.213.K.0/24 for K = 0..255, the first
#: that no address or route of this machine overlaps.
AUTO_BASE: Final = "10.213.{k}.0/24"
#: Namespace names: ``fanout-<id>-<host>``; link names (at most 15 bytes): ``fo<id>-<host>``.
NETNS_PREFIX: Final = "fanout-"
LINK_PREFIX: Final = "fo"
#: The host's end of its veth pair, inside its namespace.
HOST_IF: Final = "eth0"
#: One file per run with hosts up, naming its run directory (tmpfs: gone at reboot, as
#: the namespaces are).
REGISTRY: Final = Path("/run/fanout-hosts")
_CMD_TIMEOUT_S: Final = 20.0
_MAX_HOST_NAME: Final = 8


class HostsError(InfraError):
    """Hosts cannot be made here, or a command on them failed; the message says why."""


@dataclass(frozen=True)
class Host:
    """One host: its name, address, namespace and the root end of its veth pair."""

    name: str
    address: str
    netns: str
    veth: str

    def argv(self, command: list[str]) -> list[str]:
        """``command`` run inside this host (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.netns, *command]


def stack_hosts(nodes: int, spark_workers: int) -> dict[str, int]:
    """A multi-node stack's hosts and their last address byte.

    ``node-<i>`` runs Kafka node i and Cassandra node i (.11, .12, ...), ``spark-m`` the
    Spark master (.20), ``spark-<j>`` worker j (.21, ...): a node host isolated takes
    one broker and one Cassandra node away, as losing a machine would, and no Spark
    daemon with them.
    """
    hosts = {f"node-{i}": 10 + i for i in range(1, nodes + 1)}
    hosts["spark-m"] = 20
    hosts.update({f"spark-{j}": 20 + j for j in range(1, spark_workers + 1)})
    return hosts


# -- may hosts be made here? ---------------------------------------------------------------

def refusal(euid: int, ip_path: str | None, probe_error: str | None) -> str | None:
    """Why hosts cannot be made, from what :func:`require_netns` found; None if they can."""
    if euid != 0:
        return ("--hosts makes network namespaces, veth pairs and a bridge, which needs root "
                f"(CAP_NET_ADMIN and CAP_SYS_ADMIN), and this process runs as uid {euid}: run "
                "`fanout up --hosts` as root, or drop --hosts to run every node on loopback")
    if ip_path is None:
        return ("--hosts needs the `ip` command of iproute2, which is not on PATH: install it "
                "(`apt-get install -y iproute2`), or drop --hosts to run every node on "
                "loopback")
    if probe_error is not None:
        return (f"--hosts needs network namespaces, and `ip netns add` failed here: "
                f"{probe_error.strip()}. Run on a kernel with network namespaces (and not in a "
                "container that forbids them), or drop --hosts to run every node on loopback")
    return None


def require_netns() -> None:
    """Raise :class:`HostsError` saying why, unless this process can make hosts."""
    euid, ip_path = os.geteuid(), shutil.which("ip")
    error = None
    if euid == 0 and ip_path is not None:
        probe = f"{NETNS_PREFIX}probe-{os.getpid()}"
        made = run_cmd(["ip", "netns", "add", probe], check=False)
        if made.returncode != 0:
            error = made.stderr or f"exit code {made.returncode}"
        else:
            run_cmd(["ip", "netns", "delete", probe], check=False)
    reason = refusal(euid, ip_path, error)
    if reason is not None:
        raise HostsError(reason)


# -- the network -----------------------------------------------------------------------------

class HostNetwork:
    """The hosts of one run directory: what they are, and making and removing them.

    The constructor reads ``<run>/hosts.json`` if there is one (the run's id and subnet)
    and does nothing else; :meth:`ensure` makes what is missing, :meth:`remove` all.
    """

    def __init__(self, run_dir: Path | str, hosts: Mapping[str, int] | None = None,
                 net: str | None = None) -> None:
        self.path = Path(run_dir) / HOSTS_FILE
        record = _read(self.path)
        self.run_id = str(record.get("run_id") or secrets.token_hex(2))
        self.net = str(record.get("net") or net or "")
        self.layout = dict(hosts if hosts is not None else record.get("hosts") or {})
        for name in self.layout:
            if len(name) > _MAX_HOST_NAME or not re.fullmatch(r"[a-z0-9-]+", name):
                msg = f"host name {name!r}: at most {_MAX_HOST_NAME} of a-z, 0-9 and '-'"
                raise HostsError(msg)
        self.made: list[str] = [str(m) for m in record.get("made") or []]

    # -- where things are ----------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"{LINK_PREFIX}{self.run_id}-br"

    @property
    def gateway(self) -> str:
        """The bridge's address: the root namespace as the hosts see it."""
        return self._address(1)

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.net).prefixlen

    def host(self, name: str) -> Host:
        return Host(name, self._address(self.layout[name]),
                    f"{NETNS_PREFIX}{self.run_id}-{name}", f"{LINK_PREFIX}{self.run_id}-{name}")

    def hosts(self) -> list[Host]:
        return [self.host(name) for name in self.layout]

    def _address(self, index: int) -> str:
        return str(ipaddress.ip_network(self.net)[index])

    # -- making it -----------------------------------------------------------------------
    def ensure(self) -> HostNetwork:
        """Make whatever of the network is missing or broken; keep what is whole.

        A host whose namespace, veth or address is missing is made again (a node
        running in it had lost its network anyway); a missing bridge means every host
        is made again.
        """
        require_netns()
        sweep_orphans()
        if not self.net:
            self.net = pick_subnet()
        else:
            _check_subnet_free(self.net, self.bridge)
        self._save()
        REGISTRY.mkdir(parents=True, exist_ok=True)
        (REGISTRY / self.run_id).write_text(str(self.path.parent.resolve()))
        if not self._bridge_whole():
            self._remove_links_and_namespaces()
            self._add_bridge()
        for host in self.hosts():
            if not self._host_whole(host):
                self._delete_host(host)
                self._add_host(host)
        log.info("hosts on %s (bridge %s at %s): %s", self.net, self.bridge, self.gateway,
                 ", ".join(f"{h.name} {h.address}" for h in self.hosts()))
        return self

    def _add_bridge(self) -> None:
        self._will_make(f"link:{self.bridge}")
        run_cmd(["ip", "link", "add", self.bridge, "type", "bridge"])
        run_cmd(["ip", "addr", "add", f"{self.gateway}/{self.prefixlen}", "dev", self.bridge])
        run_cmd(["ip", "link", "set", self.bridge, "up"])

    def _add_host(self, host: Host) -> None:
        self._will_make(f"netns:{host.netns}")
        run_cmd(["ip", "netns", "add", host.netns])
        self._will_make(f"link:{host.veth}")
        run_cmd(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", HOST_IF,
              "netns", host.netns])
        run_cmd(["ip", "link", "set", host.veth, "master", self.bridge, "up"])
        inside = ["ip", "-n", host.netns]
        run_cmd([*inside, "link", "set", "lo", "up"])
        run_cmd([*inside, "addr", "add", f"{host.address}/{self.prefixlen}", "dev", HOST_IF])
        run_cmd([*inside, "link", "set", HOST_IF, "up"])

    def _bridge_whole(self) -> bool:
        shown = run_cmd(["ip", "-o", "-4", "addr", "show", "dev", self.bridge], check=False)
        return shown.returncode == 0 and f" {self.gateway}/" in shown.stdout

    def _host_whole(self, host: Host) -> bool:
        inside = run_cmd(["ip", "-n", host.netns, "-o", "-4", "addr", "show", "dev", HOST_IF],
                      check=False)
        if inside.returncode != 0 or f" {host.address}/" not in inside.stdout:
            return False
        port = run_cmd(["ip", "-o", "link", "show", "dev", host.veth], check=False)
        return port.returncode == 0 and f"master {self.bridge} " in port.stdout

    def _will_make(self, item: str) -> None:
        """Record ``item`` before making it, so that a crash half-way leaves it findable."""
        if item not in self.made:
            self.made.append(item)
            self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"run_id": self.run_id, "net": self.net, "hosts": self.layout,
                  "made": self.made}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(self.path)

    # -- removing it ---------------------------------------------------------------------
    def remove(self) -> list[str]:
        """Delete every namespace and link of this run; what was deleted.

        What the record names, and whatever else carries the run's prefix (a name the
        record missed). The id and subnet stay recorded for the next :meth:`ensure`.
        """
        removed = self._remove_links_and_namespaces()
        self.made = []
        if self.path.exists():
            self._save()
        (REGISTRY / self.run_id).unlink(missing_ok=True)
        if removed:
            log.info("removed the hosts of run %s: %s", self.run_id, ", ".join(removed))
        return removed

    def _remove_links_and_namespaces(self) -> list[str]:
        return _delete(self._recorded("netns"), self._recorded("link"), self.run_id)

    def _delete_host(self, host: Host) -> None:
        run_cmd(["ip", "netns", "delete", host.netns], check=False)
        run_cmd(["ip", "link", "delete", host.veth], check=False)

    def _recorded(self, kind: str) -> list[str]:
        return [m.split(":", 1)[1] for m in self.made if m.startswith(f"{kind}:")]

    def namespaces(self) -> list[str]:
        """The namespaces of this run that exist now."""
        return _namespaces_of(self.run_id)


def remove(run_dir: Path | str) -> list[str]:
    """Remove the hosts a run directory records, and orphans; what was removed."""
    removed = sweep_orphans()
    if (Path(run_dir) / HOSTS_FILE).exists():
        removed += HostNetwork(run_dir).remove()
    return removed


def sweep_orphans() -> list[str]:
    """Remove the hosts of runs whose directory (and so its record) is gone."""
    removed: list[str] = []
    entries = list(REGISTRY.iterdir()) if REGISTRY.is_dir() else []
    for entry in entries:
        try:
            run_dir = Path(entry.read_text().strip())
        except OSError:
            continue
        if (run_dir / HOSTS_FILE).exists():
            continue
        gone = _delete([], [], entry.name)
        entry.unlink(missing_ok=True)
        log.warning("removed the hosts of run %s, whose directory %s is gone: %s", entry.name,
                    run_dir, ", ".join(gone) or "none were left")
        removed += gone
    return removed


def _delete(namespaces: list[str], links: list[str], run_id: str) -> list[str]:
    """Delete ``namespaces``, ``links`` and whatever else carries ``run_id``; what went."""
    removed = []
    for netns in sorted(set(namespaces) | set(_namespaces_of(run_id))):
        if run_cmd(["ip", "netns", "delete", netns], check=False).returncode == 0:
            removed.append(f"netns {netns}")
    ours = [n for n in list_links() if n.startswith(f"{LINK_PREFIX}{run_id}-")]
    for link in sorted(set(links) | set(ours)):
        if run_cmd(["ip", "link", "delete", link], check=False).returncode == 0:
            removed.append(f"link {link}")
    return removed


def _namespaces_of(run_id: str) -> list[str]:
    return [n for n in list_namespaces() if n.startswith(f"{NETNS_PREFIX}{run_id}-")]


def gateway_of(run_dir: Path | str) -> str | None:
    """The bridge address of the hosts a run directory records, or None."""
    record = _read(Path(run_dir) / HOSTS_FILE)
    net = record.get("net")
    return str(ipaddress.ip_network(str(net))[1]) if net else None


def list_namespaces() -> list[str]:
    """Every network namespace ``ip netns`` knows."""
    shown = run_cmd(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in shown.stdout.splitlines() if line.strip()]


def list_links() -> list[str]:
    """Every link in the root namespace, by name."""
    shown = run_cmd(["ip", "-o", "link", "show"], check=False)
    return [m.group(1) for m in re.finditer(r"^\d+: ([^:@\s]+)[@:]", shown.stdout, re.M)]


def pick_subnet() -> str:
    """The first of 10.213.K.0/24 that no address or route of this machine overlaps."""
    used = _used_networks()
    for k in range(256):
        net = ipaddress.ip_network(AUTO_BASE.format(k=k))
        if not any(net.overlaps(u) for u in used):
            return str(net)
    msg = (f"every subnet {AUTO_BASE.format(k='K')} is in use here: name a free private /24 "
           "with --hosts-net")
    raise HostsError(msg)


def _check_subnet_free(net: str, own_bridge: str) -> None:
    """Refuse a subnet that an address or route of another interface overlaps."""
    try:
        wanted = ipaddress.ip_network(net)
    except ValueError as exc:
        msg = f"--hosts-net {net!r} is not a subnet ({exc}): give e.g. 10.213.7.0/24"
        raise HostsError(msg) from None
    if wanted.version != 4 or not wanted.is_private or wanted.prefixlen > 28:
        msg = f"--hosts-net {net} must be a private IPv4 subnet of at least 16 addresses"
        raise HostsError(msg)
    clash = [u for u in _used_networks(skip=own_bridge) if wanted.overlaps(u)]
    if clash:
        msg = (f"the hosts' subnet {net} overlaps {', '.join(map(str, clash))} of this "
               "machine: name another private /24 with --hosts-net")
        raise HostsError(msg)


def _used_networks(skip: str = "") -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    addrs = run_cmd(["ip", "-o", "-4", "addr", "show"], check=False).stdout.splitlines()
    routes = run_cmd(["ip", "-4", "route", "show"], check=False).stdout.splitlines()
    for line in addrs:
        fields = line.split()
        if len(fields) > 3 and fields[1] != skip:
            nets.append(ipaddress.ip_interface(fields[3]).network)
    for line in routes:
        first = line.split()[0] if line.split() else ""
        if first and first != "default" and f" dev {skip} " not in f" {line} ":
            try:
                nets.append(ipaddress.ip_network(first, strict=False))
            except ValueError:
                continue
    return nets


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def run_cmd(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one ``ip``/``tc``/``iptables`` command; raise with its error when ``check``."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S,
                              check=False)
    except FileNotFoundError as exc:
        done = subprocess.CompletedProcess(argv, 127, "", str(exc))
    if check and done.returncode != 0:
        msg = f"`{' '.join(argv)}` failed (exit {done.returncode}): {done.stderr.strip()}"
        raise HostsError(msg)
    return done
