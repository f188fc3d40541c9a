"""The nemesis: network faults on a stack whose nodes run on hosts of their own.

On a stack started with ``fanout up --nodes N --hosts`` (:mod:`infra.services.hosts`), this
module applies and heals the faults Jepsen's and Kafka's Trogdor nemeses inject,
each on the hosts' own network, never on any other:

- ``isolate HOST``: the host is cut off from every other host and from the root
  namespace (the job, the API), both ways, as a machine that lost its network;
  ``--peers-only`` keeps the root namespace reaching it;
- ``partition --minority HOST...``: the minority cut off from the majority, both ways;
- ``one-way SRC DST``: what SRC sends DST is lost; DST still reaches SRC;
- ``flap HOST``: ``isolate`` for a few seconds, healed for a few, ``--count`` times;
- ``slow HOST``: delay with jitter (100 ms ± 50 ms) on the host's link, both ways:
  ``tc netem`` where the kernel has it, else a packet delayer (:mod:`infra.faults.delay`);
- ``lossy HOST``: 5 % of the packets to and from the host lost;
- ``throttle HOST``: the host's link capped (``tc tbf``), for kernels without netem;
- ``cut-root``: the root namespace (the job's driver, the API, the load generator)
  cut off from the brokers' port, both ways, while everything else still flows.

Drops are ``iptables`` rules in a chain of the nemesis's own (:data:`CHAIN`) inside the
hosts' namespaces, jumped to first from ``INPUT`` and ``OUTPUT``; delay, loss and caps
are qdiscs on both ends of a host's veth pair. ``heal`` flushes the chain, deletes
the qdiscs and stops the delayers on every host. This machine's kernel (6.18,
Firecracker) has no ``sch_netem``: ``lossy`` then drops with ``iptables``' ``statistic``
match, the same random loss, and ``slow`` starts a packet delayer (:mod:`infra.faults.delay`)
in the host's namespace and sends the host's traffic on its ``eth0`` (not its
loopback) to it with ``NFQUEUE`` rules in the chain: a normal delay per packet, in
order, each way (the fault's detail says ``"how": "nfqueue"`` or ``"netem"``). What the
host receives is held in the kernel until its time; what it sends is copied, dropped
and sent again by the delayer, as netem frees such a packet from its socket (else TCP's
small-queue limit throttles the sender to a few KB per delay). ``--queue-bypass`` lets
the packets through should the delayer die; its pid is kept in the run directory, so
a heal by a later nemesis stops one an earlier nemesis left, and it stops by itself
once its host is removed (``fanout down``). Every fault and heal is logged, with its
time, to stdout and to ``<run>/nemesis.jsonl``.

The command holds each fault for ``--for`` seconds and then heals it, and a flap
stops after ``--count`` rounds: nothing a nemesis does outlives it (SIGINT and
SIGTERM heal too). Tests and benchmarks use :class:`Nemesis` directly.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from infra.errors import InfraError
from infra.faults import delay
from infra.services.hosts import HOST_IF, Host, HostNetwork, run_cmd

log = logging.getLogger(__name__)

LOG_FILE: Final = "nemesis.jsonl"
#: The nemesis's own chain in each host's filter table; heal = flush it.
CHAIN: Final = "FANOUT-NEMESIS"
#: The brokers' client port on a host (``infra.services.kafkacluster.HOST_PORTS``).
KAFKA_PORT: Final = 9092
#: Bounds: the longest a command holds a fault, and the most rounds of a flap.
MAX_HOLD_S: Final = 3600.0
MAX_FLAPS: Final = 100
_IPTABLES: Final = ("iptables", "-w", "5")
#: The NFQUEUEs ``slow`` uses in a host's namespace (each namespace has queues of its
#: own): this one for what the host receives, the next for what it sends.
DELAY_QUEUE: Final = 5
#: What ``slow`` queues without netem: what the host gets on, and sends out of, its link
#: (the chain is jumped to from INPUT, where only ``-i`` matches, and from OUTPUT, where
#: only ``-o`` does); the host's own loopback traffic is never delayed. The first rule
#: returns the packets the delayer sends again: they went through the chain once.
_QUEUE_RULES: Final = (
    ["-m", "mark", "--mark", hex(delay.RESENT_MARK), "-j", "RETURN"],
    ["-i", HOST_IF, "-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE), "--queue-bypass"],
    ["-o", HOST_IF, "-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE + 1), "--queue-bypass"])


class NemesisError(InfraError):
    """A fault cannot be applied here; the message says why and what to do."""


@dataclass(frozen=True)
class Fault:
    """One fault as applied: its kind, the hosts it touches and its parameters."""

    kind: str
    hosts: tuple[str, ...]
    detail: dict[str, Any] = field(default_factory=dict)


class Nemesis:
    """Faults on the hosts of the stack in ``run_dir``; logs each apply and heal.

    The constructor reads the run's ``hosts.json``; nothing is changed until a fault
    is applied. ``echo`` prints each log line to stdout as well.
    """

    def __init__(self, run_dir: Path | str, *, echo: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.network = HostNetwork(self.run_dir)
        if not self.network.net or not self.network.namespaces():
            msg = (f"no hosts are up in {self.run_dir}: the nemesis needs a stack started "
                   "with `fanout up --nodes N --hosts`")
            raise NemesisError(msg)
        self.echo = echo
        self.active: list[Fault] = []

    # -- the faults ----------------------------------------------------------------------
    def isolate(self, name: str, *, peers_only: bool = False) -> Fault:
        """Cut ``name`` off from every other host (and the root namespace), both ways."""
        others = [h for h in self.hosts() if h.name != name]
        target = self.host(name)
        cut = [h.address for h in others] + ([] if peers_only else [self.network.gateway])
        self._drop_between(target, cut)
        for other in others:
            self._drop_between(other, [target.address])
        return self._applied(Fault("isolate", (name,), {"peers_only": peers_only}))

    def partition(self, minority: Iterable[str]) -> Fault:
        """Cut the hosts in ``minority`` off from all the others, both ways."""
        small = [self.host(n) for n in minority]
        rest = [h for h in self.hosts() if h.name not in {s.name for s in small}]
        if not small or not rest:
            msg = "a partition needs hosts on both sides"
            raise NemesisError(msg)
        for host in small:
            self._drop_between(host, [h.address for h in rest])
        for host in rest:
            self._drop_between(host, [h.address for h in small])
        return self._applied(Fault("partition", tuple(h.name for h in small),
                                   {"majority": [h.name for h in rest]}))

    def one_way(self, src: str, dst: str) -> Fault:
        """What ``src`` sends ``dst`` is lost (``dst`` drops it); ``dst`` still reaches ``src``."""
        source, target = self.host(src), self.host(dst)
        self._rules(target, [["-s", source.address, "-j", "DROP"]])
        return self._applied(Fault("one-way", (src, dst)))

    def cut_root(self, port: int = KAFKA_PORT) -> Fault:
        """Cut the root namespace (job driver, API) off from the brokers' ``port``."""
        gateway, touched = self.network.gateway, []
        for host in self.hosts():
            if host.name.startswith("node-"):
                self._rules(host, [
                    ["-s", gateway, "-p", "tcp", "--dport", str(port), "-j", "DROP"],
                    ["-d", gateway, "-p", "tcp", "--sport", str(port), "-j", "DROP"]])
                touched.append(host.name)
        return self._applied(Fault("cut-root", tuple(touched), {"port": port}))

    def slow(self, name: str, delay_ms: int = 100, jitter_ms: int = 50) -> Fault:
        """Delay with jitter on both directions of ``name``'s link.

        ``tc netem`` where the kernel has it; else the packets go through a delayer in
        the host (:mod:`infra.faults.delay`), which keeps them in order where netem reorders.
        """
        if delay_ms < 0 or jitter_ms < 0:
            msg = f"a delay and its jitter are >= 0 ms, not {delay_ms} ms ± {jitter_ms} ms"
            raise NemesisError(msg)
        host = self.host(name)
        detail: dict[str, Any] = {"delay_ms": delay_ms, "jitter_ms": jitter_ms}
        if netem_available():
            self._qdisc(host, ["netem", "delay", f"{delay_ms}ms", f"{jitter_ms}ms",
                               "distribution", "normal"], "slow")
            detail["how"] = "netem"
        else:
            detail.update(how="nfqueue", queue=DELAY_QUEUE,
                          pid=self._delay(host, delay_ms, jitter_ms))
        return self._applied(Fault("slow", (name,), detail))

    def lossy(self, name: str, percent: float = 5.0) -> Fault:
        """``percent`` % of the packets to and from ``name`` lost.

        ``tc netem loss`` where the kernel has netem; else the ``iptables`` statistic
        match, which drops the same random share (the log says which).
        """
        host = self.host(name)
        if netem_available():
            self._qdisc(host, ["netem", "loss", f"{percent}%"], "lossy")
            how = "netem"
        else:
            share = f"{percent / 100:.4f}"
            self._rules(host, [["-m", "statistic", "--mode", "random", "--probability", share,
                                "-j", "DROP"]])
            how = "iptables statistic"
        return self._applied(Fault("lossy", (name,), {"percent": percent, "how": how}))

    def throttle(self, name: str, rate: str = "1mbit") -> Fault:
        """Cap both directions of ``name``'s link at ``rate`` (``tc tbf``)."""
        tbf = ["tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
        self._qdisc(self.host(name), tbf, "throttle")
        return self._applied(Fault("throttle", (name,), {"rate": rate}))

    def flap(self, name: str, *, count: int = 5, on_s: float = 3.0, off_s: float = 3.0,
             stop: threading.Event | None = None) -> int:
        """``isolate`` ``name`` for ``on_s``, heal for ``off_s``, ``count`` times; rounds run."""
        if not 1 <= count <= MAX_FLAPS:
            msg = f"a flap runs 1 to {MAX_FLAPS} rounds, not {count}"
            raise NemesisError(msg)
        stop = stop or threading.Event()
        rounds = 0
        try:
            for _ in range(count):
                self.isolate(name)
                rounds += 1
                if stop.wait(on_s):
                    break
                self.heal()
                if stop.wait(off_s):
                    break
        finally:
            self.heal()
        return rounds

    def heal(self) -> list[Fault]:
        """Remove every fault on every host: flush the chains, delete the qdiscs.

        The delayers stop last, once no rule queues packets to them.
        """
        for host in self.hosts():
            run_cmd(host.argv([*_IPTABLES, "-F", CHAIN]), check=False)
            run_cmd(["tc", "qdisc", "del", "dev", host.veth, "root"], check=False)
            run_cmd(host.argv(["tc", "qdisc", "del", "dev", HOST_IF, "root"]), check=False)
        stopped = delay.stop_all(self.run_dir)
        healed, self.active = self.active, []
        self._log("heal", None, {"healed": [f.kind for f in healed],
                                 **({"delayers_stopped": stopped} if stopped else {})})
        return healed

    def status(self) -> dict[str, list[str]]:
        """The nemesis's rules and qdiscs on each host now."""
        shown: dict[str, list[str]] = {}
        for host in self.hosts():
            rules = run_cmd(host.argv([*_IPTABLES, "-S", CHAIN]), check=False).stdout.splitlines()
            qdiscs = run_cmd(["tc", "qdisc", "show", "dev", host.veth], check=False).stdout
            shown[host.name] = [r for r in rules if r.startswith("-A")] + [
                q for q in qdiscs.splitlines() if "netem" in q or "tbf" in q]
        for name, pid in delay.running(self.run_dir).items():
            shown.setdefault(name, []).append(f"packet delayer pid {pid}")
        return shown

    # -- the hosts -----------------------------------------------------------------------
    def hosts(self) -> list[Host]:
        return self.network.hosts()

    def host(self, name: str) -> Host:
        if name not in self.network.layout:
            msg = f"no host {name!r}; the hosts are {', '.join(self.network.layout)}"
            raise NemesisError(msg)
        return self.network.host(name)

    # -- how faults are made -------------------------------------------------------------
    def _drop_between(self, host: Host, addresses: list[str]) -> None:
        """``host`` drops what it gets from, and what it sends to, ``addresses``."""
        self._rules(host, [rule for a in addresses
                           for rule in (["-s", a, "-j", "DROP"], ["-d", a, "-j", "DROP"])])

    def _delay(self, host: Host, delay_ms: int, jitter_ms: int) -> int:
        """Start ``host``'s delayer, then queue its link's packets to it; the delayer's pid.

        A host already slow gets its delayer and rules replaced, as ``tc qdisc replace``
        replaces netem's.
        """
        _require("iptables", "apt-get install -y iptables")
        self._chain(host)
        self._unqueue(host)
        pid = delay.start(host, self.run_dir, DELAY_QUEUE, delay_ms, jitter_ms, HOST_IF,
                          max_seconds=MAX_HOLD_S)
        try:
            resent, *queued = _QUEUE_RULES
            run_cmd(host.argv([*_IPTABLES, "-I", CHAIN, "1", *resent]))
            self._rules(host, queued)
        except Exception:
            self._unqueue(host)
            raise
        return pid

    def _unqueue(self, host: Host) -> None:
        """Remove ``host``'s queue rules and stop its delayer, if it has them."""
        for rule in _QUEUE_RULES:
            run_cmd(host.argv([*_IPTABLES, "-D", CHAIN, *rule]), check=False)
        delay.stop_all(self.run_dir, host.name)

    def _rules(self, host: Host, rules: list[list[str]]) -> None:
        _require("iptables", "apt-get install -y iptables")
        self._chain(host)
        for rule in rules:
            run_cmd(host.argv([*_IPTABLES, "-A", CHAIN, *rule]))

    def _chain(self, host: Host) -> None:
        """The nemesis's chain in ``host``, jumped to first from INPUT and OUTPUT."""
        run_cmd(host.argv([*_IPTABLES, "-N", CHAIN]), check=False)  # exists: fine
        for hook in ("INPUT", "OUTPUT"):
            if run_cmd(host.argv([*_IPTABLES, "-C", hook, "-j", CHAIN]), check=False).returncode:
                run_cmd(host.argv([*_IPTABLES, "-I", hook, "1", "-j", CHAIN]))

    def _qdisc(self, host: Host, qdisc: list[str], kind: str) -> None:
        """``qdisc`` at the root of both ends of ``host``'s veth pair (both directions)."""
        if qdisc[0] == "netem" and not netem_available():
            msg = (f"`{kind}` needs tc netem, and this kernel has no sch_netem (`tc qdisc add "
                   "... netem` answers 'Specified qdisc kind is unknown'): run on a kernel "
                   "with CONFIG_NET_SCH_NETEM, or use `throttle` (a tbf cap) or `lossy` "
                   "(iptables) here")
            raise NemesisError(msg)
        run_cmd(["tc", "qdisc", "replace", "dev", host.veth, "root", *qdisc])
        run_cmd(host.argv(["tc", "qdisc", "replace", "dev", HOST_IF, "root", *qdisc]))

    def _applied(self, fault: Fault) -> Fault:
        self.active.append(fault)
        self._log("apply", fault, fault.detail)
        return fault

    def _log(self, event: str, fault: Fault | None, detail: dict[str, Any]) -> None:
        now = time.time()
        entry = {"at": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds"),
                 "t": round(now, 3), "event": event,
                 **({"fault": fault.kind, "hosts": list(fault.hosts)} if fault else {}),
                 **detail}
        line = json.dumps(entry)
        with (self.run_dir / LOG_FILE).open("a") as out:
            out.write(line + "\n")
        if self.echo:
            print(line, flush=True)


_NETEM: dict[str, bool] = {}


def netem_available() -> bool:
    """Whether this kernel has ``sch_netem`` (tried once, on a throwaway veth pair)."""
    if "netem" not in _NETEM:
        pair = f"fonetem{time.monotonic_ns() % 10**6}"
        made = run_cmd(["ip", "link", "add", pair, "type", "veth", "peer", "name", f"{pair}p"],
                    check=False).returncode == 0
        _NETEM["netem"] = made and run_cmd(["tc", "qdisc", "add", "dev", pair, "root", "netem",
                                         "delay", "1ms"], check=False).returncode == 0
        if made:
            run_cmd(["ip", "link", "delete", pair], check=False)
    return _NETEM["netem"]


def _require(tool: str, install: str) -> None:
    if shutil.which(tool) is None:
        msg = f"the nemesis needs `{tool}`, which is not on PATH: `{install}`"
        raise NemesisError(msg)


# -- the command ---------------------------------------------------------------------------

def register(sub: argparse._SubParsersAction) -> None:
    """``fanout nemesis FAULT ...``: apply a fault for ``--for`` seconds, then heal it."""
    p = sub.add_parser("nemesis", help="network faults on a stack started with --hosts: "
                                       "apply one for --for seconds, then heal it")
    faults = p.add_subparsers(dest="fault", metavar="FAULT", required=True)
    for name, what in (("isolate", "cut HOST off from every other host and the job/API"),
                       ("slow", "delay HOST's link --delay ms ± --jitter ms, both ways (tc "
                                "netem; without netem, an NFQUEUE delayer in HOST, in order)"),
                       ("lossy", "lose --loss %% of HOST's packets"),
                       ("throttle", "cap HOST's link at --rate (tc tbf)"),
                       ("flap", "isolate HOST --on s, heal --off s, --count times")):
        f = faults.add_parser(name, help=what)
        f.add_argument("host")
        _hold_flag(f)
    faults.choices["isolate"].add_argument("--peers-only", action="store_true",
                                           help="keep the root namespace (job, API) reaching it")
    faults.choices["slow"].add_argument("--delay", type=int, default=100, metavar="MS")
    faults.choices["slow"].add_argument("--jitter", type=int, default=50, metavar="MS")
    faults.choices["lossy"].add_argument("--loss", type=float, default=5.0, metavar="PERCENT")
    faults.choices["throttle"].add_argument("--rate", default="1mbit")
    flap = faults.choices["flap"]
    flap.add_argument("--count", type=int, default=5)
    flap.add_argument("--on", type=float, default=3.0, dest="on_s", metavar="SECONDS")
    flap.add_argument("--off", type=float, default=3.0, dest="off_s", metavar="SECONDS")
    f = faults.add_parser("partition", help="cut the --minority hosts off from the rest")
    f.add_argument("--minority", nargs="+", required=True, metavar="HOST")
    _hold_flag(f)
    f = faults.add_parser("one-way", help="lose what SRC sends DST (DST still reaches SRC)")
    f.add_argument("src")
    f.add_argument("dst")
    _hold_flag(f)
    f = faults.add_parser("cut-root", help="cut the job and the API off from the brokers")
    _hold_flag(f)
    faults.add_parser("heal", help="remove every fault on every host")
    faults.add_parser("status", help="the faults in place on each host")
    p.set_defaults(func=_cmd_nemesis)


def _hold_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--for", type=float, default=30.0, dest="hold", metavar="SECONDS",
                   help=f"how long the fault holds before it is healed (default 30, at most "
                        f"{MAX_HOLD_S:.0f})")


def _cmd_nemesis(args: argparse.Namespace) -> int:
    from infra.services.process import stop_on_signals

    nemesis = Nemesis(args.run_dir)
    if args.fault == "heal":
        nemesis.heal()
        return 0
    if args.fault == "status":
        print(json.dumps(nemesis.status(), indent=2))
        return 0
    if args.fault == "flap":
        nemesis.flap(args.host, count=args.count, on_s=args.on_s, off_s=args.off_s,
                     stop=stop_on_signals())
        return 0
    hold = min(max(args.hold, 0.0), MAX_HOLD_S)
    stop = stop_on_signals()
    try:
        _apply(nemesis, args)
        stop.wait(hold)
    finally:
        nemesis.heal()
    return 0


def _apply(nemesis: Nemesis, args: argparse.Namespace) -> Fault:
    if args.fault == "isolate":
        return nemesis.isolate(args.host, peers_only=args.peers_only)
    if args.fault == "partition":
        return nemesis.partition(args.minority)
    if args.fault == "one-way":
        return nemesis.one_way(args.src, args.dst)
    if args.fault == "cut-root":
        return nemesis.cut_root()
    if args.fault == "slow":
        return nemesis.slow(args.host, args.delay, args.jitter)
    if args.fault == "lossy":
        return nemesis.lossy(args.host, args.loss)
    if args.fault == "throttle":
        return nemesis.throttle(args.host, args.rate)
    msg = f"unknown fault {args.fault!r}"
    print(msg, file=sys.stderr)
    raise NemesisError(msg)
