"""A slow link without ``sch_netem``: packets held in user space on NFQUEUEs, then let go.

The nemesis's ``slow`` fault (:mod:`infra.faults.nemesis`) delays a host's link with ``tc
netem`` where the kernel has it. This machine's kernel (6.18, Firecracker) has no
``sch_netem`` but does have ``nfnetlink_queue``: an ``iptables ... -j NFQUEUE`` rule
hands each packet to a process, which must answer with a verdict before the packet
goes on. This module is that process, run inside the slow host's namespace. It
holds each packet for a delay drawn from a normal distribution (mean ``--delay-ms``,
standard deviation ``--jitter-ms``, clipped at 0), then lets it go: the packet
leaves late, as it would through netem.

Packets leave in the order they came (FIFO, per direction): a packet is let go no
earlier than the one before it. netem with jitter reorders (each packet waits its own
draw, and a short draw overtakes a long one), and TCP reads reordering as loss —
three duplicate ACKs and it retransmits and halves its window — so a "slow" link
would act as a lossy one. Kept in order, a dense stream's packets wait the running
maximum of their draws, so under load the delay sits toward the upper tail (netem
over a ``pfifo`` child, which also keeps order, does the same).

The two directions are held differently. What the host receives (``--queue``, on
INPUT) is held in the kernel: the delayer asks for its metadata only
(``NFQNL_COPY_META``; GSO packets stay whole) and answers ``NF_ACCEPT`` with the
packet's id when its time comes. What the host sends (``--out-queue``, on OUTPUT)
cannot be held that way: a queued packet still counts against its TCP socket, whose
small-queue limit (TSQ, ~1 ms of data) then stops the socket sending until the
packet goes — measured here, 1 MB took 40 s to leave a host delayed 100 ms, against
2.3 s to reach it. netem orphans such a packet from its socket for that reason. So the
delayer takes a copy of each outgoing packet (``NFQNL_COPY_PACKET``; the kernel splits
GSO packets and fills in their checksums), drops the original at once (TCP sees it
sent, and goes on) and, when its time comes, sends the copy itself from a raw socket
whose packets carry :data:`RESENT_MARK`, which the nemesis's chain lets pass.

It speaks ``nfnetlink_queue`` itself, over an ``AF_NETLINK`` socket
(``linux/netfilter/nfnetlink_queue.h``), so that no C library (libnetfilter_queue,
which the ``netfilterqueue`` package needs) is wanted. One thread: per direction a
FIFO of (release time, packet), and a ``select`` whose timeout is the earliest
release. The receive buffer and the kernel's queue length are raised so that a burst
is held, not dropped (the kernel drops what it cannot queue, as netem drops past its
``limit``).

The process stops on SIGTERM or SIGINT, after ``--max-seconds`` (the nemesis's
longest hold), or when ``--interface`` is gone (its host was removed by ``fanout
down``); it lets every packet it holds go on before it exits. Run it inside the
host's namespace: ``python -m infra.faults.delay --queue N --delay-ms D --jitter-ms J``.
:func:`start` and :func:`stop_all` are how the nemesis runs it, with a pid file per
host in the run directory so that a later heal finds a delayer an earlier nemesis
left.
"""

from __future__ import annotations

import argparse
import collections
import errno
import json
import logging
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Generic, TypeVar

from infra.errors import InfraError
from infra.services import procs
from infra.services.hosts import Host

log = logging.getLogger(__name__)

# -- linux/netlink.h, linux/netfilter/nfnetlink.h, nfnetlink_queue.h ---------------------
NETLINK_NETFILTER: Final = 12
NFNL_SUBSYS_QUEUE: Final = 3
NLM_F_REQUEST: Final = 0x1
NLM_F_ACK: Final = 0x4
NLMSG_ERROR: Final = 2
NFQNL_MSG_PACKET: Final = 0
NFQNL_MSG_VERDICT: Final = 1
NFQNL_MSG_CONFIG: Final = 2
NFQA_PACKET_HDR: Final = 1
NFQA_VERDICT_HDR: Final = 2
NFQA_PAYLOAD: Final = 10
NFQA_CAP_LEN: Final = 13
NFQA_CFG_CMD: Final = 1
NFQA_CFG_PARAMS: Final = 2
NFQA_CFG_QUEUE_MAXLEN: Final = 3
NFQA_CFG_MASK: Final = 4
NFQA_CFG_FLAGS: Final = 5
NFQA_CFG_F_GSO: Final = 1 << 2
NFQNL_CFG_CMD_BIND: Final = 1
NFQNL_CFG_CMD_UNBIND: Final = 2
NFQNL_CFG_CMD_PF_BIND: Final = 3
NFQNL_CFG_CMD_PF_UNBIND: Final = 4
NFQNL_COPY_META: Final = 1
NFQNL_COPY_PACKET: Final = 2
NF_DROP: Final = 0
NF_ACCEPT: Final = 1
_NLMSGHDR: Final = struct.Struct("=IHHII")  # len, type, flags, seq, portid (host order)
_NLATTR: Final = struct.Struct("=HH")  # len, type
_NLA_TYPE_MASK: Final = 0x3FFF
_SO_SNDBUFFORCE: Final = 32  # root may pass net.core.wmem_max / rmem_max
_SO_RCVBUFFORCE: Final = 33
_SO_MARK: Final = 36
_COPY_RANGE: Final = 0xFFFF

#: Packets the kernel holds for a queue (its default is 1024): 40k packets/s at 200 ms,
#: far past what this machine's nodes send each other. The netlink receive buffer only
#: has to take a burst between two turns of the loop (held packets are not in it):
#: 16 MB is ~8000 messages of a full-size packet's copy; the raw socket's send buffer
#: the same, for a burst of copies due at once.
QUEUE_MAXLEN: Final = 8192
BUFFER_BYTES: Final = 16 << 20
#: The mark on the packets the delayer sends itself; the nemesis's chain returns them
#: at once, so that they are neither queued again nor dropped twice by a lossy rule.
RESENT_MARK: Final = 0x66616E6F
#: The longest a delayer runs unless told (as the nemesis's ``MAX_HOLD_S``), and the
#: line it logs once its queues are bound: what :func:`start` waits for before any rule sends it packets.
MAX_SECONDS: Final = 3600.0
BOUND: Final = "bound to nfqueue"
_VERDICTS_PER_SEND: Final = 256
_WATCH_S: Final = 1.0
_START_S: Final = 10.0
_STOP_S: Final = 5.0


class DelayError(InfraError):
    """The delayer cannot hold packets here; the message says why and what to do."""


# -- messages (pure) ---------------------------------------------------------------------

def attr(kind: int, value: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    body = _NLATTR.pack(_NLATTR.size + len(value), kind) + value
    return body + b"\0" * (-len(body) % 4)


def message(msg: int, queue: int, attrs: bytes, *, seq: int = 0, flags: int = NLM_F_REQUEST,
            family: int = socket.AF_UNSPEC) -> bytes:
    """A ``nfnetlink_queue`` message: nlmsghdr, nfgenmsg (queue number big-endian), attrs."""
    nfgen = struct.pack("!BBH", family, 0, queue)  # family, NFNETLINK_V0, res_id
    length = _NLMSGHDR.size + len(nfgen) + len(attrs)
    return _NLMSGHDR.pack(length, (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + nfgen + attrs


def config(queue: int, seq: int, *, command: int | None = None, pf: int = socket.AF_INET,
           copy: int | None = None, maxlen: int | None = None, flags: int | None = None) -> bytes:
    """An ``NFQNL_MSG_CONFIG`` asking for an acknowledgement."""
    attrs = b""
    if command is not None:
        attrs += attr(NFQA_CFG_CMD, struct.pack("!BxH", command, pf))
    if copy is not None:
        size = _COPY_RANGE if copy == NFQNL_COPY_PACKET else 0
        attrs += attr(NFQA_CFG_PARAMS, struct.pack("!IB", size, copy))
    if maxlen is not None:
        attrs += attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
    if flags is not None:
        attrs += attr(NFQA_CFG_MASK, struct.pack("!I", flags))
        attrs += attr(NFQA_CFG_FLAGS, struct.pack("!I", flags))
    return message(NFQNL_MSG_CONFIG, queue, attrs, seq=seq, flags=NLM_F_REQUEST | NLM_F_ACK)


def verdict(queue: int, packet_id: int, decision: int = NF_ACCEPT) -> bytes:
    """An ``NFQNL_MSG_VERDICT`` for one packet (no acknowledgement: errors come anyway)."""
    return message(NFQNL_MSG_VERDICT, queue,
                   attr(NFQA_VERDICT_HDR, struct.pack("!II", decision, packet_id)))


@dataclass(frozen=True)
class Message:
    """One netlink message received: its type, sequence number and payload."""

    kind: int
    seq: int
    payload: bytes


def messages(data: bytes) -> Iterator[Message]:
    """The netlink messages in one datagram."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, seq, _portid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            return
        yield Message(kind, seq, data[offset + _NLMSGHDR.size:offset + length])
        offset += (length + 3) & ~3


def attrs(payload: bytes) -> dict[int, bytes]:
    """The attributes after a message's 4-byte nfgenmsg, by type."""
    found, offset = {}, 4
    while offset + _NLATTR.size <= len(payload):
        length, kind = _NLATTR.unpack_from(payload, offset)
        if length < _NLATTR.size:
            break
        found[kind & _NLA_TYPE_MASK] = payload[offset + _NLATTR.size:offset + length]
        offset += (length + 3) & ~3
    return found


@dataclass(frozen=True)
class Packet:
    """A packet a queue brings: its queue, its id, and its bytes if they came whole."""

    queue: int
    id: int
    data: bytes | None = None


def packet(msg: Message) -> Packet | None:
    """The packet an ``NFQNL_MSG_PACKET`` brings, else None.

    Its bytes only if the whole packet came (no ``NFQA_CAP_LEN``, which marks a cut copy).
    """
    if msg.kind != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET or len(msg.payload) < 4:
        return None
    found = attrs(msg.payload)
    header = found.get(NFQA_PACKET_HDR)
    if not header or len(header) < 4:
        return None
    whole = NFQA_CAP_LEN not in found
    return Packet(struct.unpack_from("!H", msg.payload, 2)[0],
                  struct.unpack_from("!I", header)[0],
                  found.get(NFQA_PAYLOAD) if whole else None)


def error_code(msg: Message) -> int | None:
    """The errno an ``NLMSG_ERROR`` carries (0: an acknowledgement), else None."""
    if msg.kind != NLMSG_ERROR or len(msg.payload) < 4:
        return None
    return -struct.unpack_from("=i", msg.payload)[0]


# -- when each packet goes (pure) -----------------------------------------------------------

def draw(rng: random.Random, delay_ms: float, jitter_ms: float) -> float:
    """One packet's delay in seconds: normal(delay, jitter), never below 0."""
    return max(0.0, rng.gauss(delay_ms, jitter_ms)) / 1000.0


T = TypeVar("T")


class Schedule(Generic[T]):
    """Held packets in arrival order, each let go at its draw but never before the last."""

    def __init__(self) -> None:
        self._held: collections.deque[tuple[float, T, float]] = collections.deque()
        self._last = float("-inf")

    def hold(self, item: T, now: float, delay_s: float) -> float:
        """Hold ``item`` from ``now`` for ``delay_s`` (or until the one before goes)."""
        self._last = max(now + delay_s, self._last)
        self._held.append((self._last, item, now))
        return self._last

    def due(self, now: float) -> list[tuple[T, float]]:
        """The items whose time has come, in order, each with how long it was held."""
        out = []
        while self._held and self._held[0][0] <= now:
            _, item, since = self._held.popleft()
            out.append((item, now - since))
        return out

    def drain(self, now: float) -> list[tuple[T, float]]:
        """Every held item, in order (the delayer is stopping)."""
        out = [(item, now - since) for _, item, since in self._held]
        self._held.clear()
        return out

    def next_at(self) -> float | None:
        return self._held[0][0] if self._held else None

    def __len__(self) -> int:
        return len(self._held)


# -- the delayer ------------------------------------------------------------------------------

class Delayer:
    """Two queues' packets held and let go; see the module docstring.

    ``queue`` brings what the host receives, ``out_queue`` what it sends. The
    constructor opens nothing; :meth:`open` binds the queues, :meth:`serve` runs until
    told to stop, :meth:`close` lets every held packet go and unbinds.
    """

    def __init__(self, queue: int, out_queue: int, delay_ms: float, jitter_ms: float,
                 rng: random.Random | None = None) -> None:
        self.queue, self.out_queue = queue, out_queue
        self.delay_ms, self.jitter_ms = delay_ms, jitter_ms
        self.rng = rng or random.Random()
        self.inbound: Schedule[Packet] = Schedule()
        self.outbound: Schedule[Packet] = Schedule()
        self.sock: socket.socket | None = None
        self.raw: socket.socket | None = None
        self.held = self.resent = self.lost = self.overruns = self.refused = 0
        self.waited_s = self.longest_s = 0.0
        self._seq = 0

    def open(self) -> None:
        try:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
            self.raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        except OSError as exc:
            msg = (f"the delayer cannot open its sockets ({exc}): it needs root and a kernel "
                   "with CONFIG_NETFILTER_NETLINK_QUEUE")
            raise DelayError(msg) from None
        _buffer(self.sock, _SO_RCVBUFFORCE, socket.SO_RCVBUF)
        _buffer(self.raw, _SO_SNDBUFFORCE, socket.SO_SNDBUF)
        self.raw.setsockopt(socket.SOL_SOCKET, _SO_MARK, RESENT_MARK)
        self.sock.bind((0, 0))
        # PF (un)bind is a no-op since Linux 3.8, kept for older kernels, which need it.
        self._configure(self.queue, command=NFQNL_CFG_CMD_PF_UNBIND, check=False)
        self._configure(self.queue, command=NFQNL_CFG_CMD_PF_BIND, check=False)
        for queue, copy in ((self.queue, NFQNL_COPY_META), (self.out_queue, NFQNL_COPY_PACKET)):
            self._configure(queue, command=NFQNL_CFG_CMD_BIND, what=f"bind queue {queue}")
            self._configure(queue, copy=copy, what=f"set queue {queue}'s copy mode")
            self._configure(queue, maxlen=QUEUE_MAXLEN, what=f"lengthen queue {queue}")
        # Received packets stay whole (their ids are all that is needed); sent ones are
        # copied, and the kernel splits a GSO packet only when this flag is off.
        self._configure(self.queue, flags=NFQA_CFG_F_GSO, check=False)

    def serve(self, until: float, wake: socket.socket, interface: str | None) -> str:
        """Hold and let go until ``until`` (monotonic), a byte on ``wake`` or no ``interface``.

        Returns why it stopped.
        """
        assert self.sock is not None  # noqa: S101 - open() comes first
        watch = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= until:
                return "its --max-seconds ran out"
            if now >= watch:
                if interface and not _has_interface(interface):
                    return f"{interface} is gone (its host was removed)"
                watch = now + _WATCH_S
            self._release(self.inbound.due(now) + self.outbound.due(now))
            heads = [t for t in (self.inbound.next_at(), self.outbound.next_at()) if t is not None]
            wait = min(until, watch, *heads) - now
            ready, _, _ = select.select([self.sock, wake], [], [], max(wait, 0.0))
            if wake in ready:
                return "it was told to stop"
            if self.sock in ready:
                self._receive()

    def close(self) -> None:
        """Let every held packet go on, in order; unbind the queues; close the sockets."""
        if self.sock is not None and self.raw is not None:
            now = time.monotonic()
            self._release(self.inbound.drain(now) + self.outbound.drain(now))
            for queue in (self.queue, self.out_queue):
                self.sock.sendto(config(queue, self._next_seq(), command=NFQNL_CFG_CMD_UNBIND),
                                 (0, 0))
        for sock in (self.sock, self.raw):
            if sock is not None:
                sock.close()
        self.sock = self.raw = None

    def summary(self) -> str:
        mean = 1000 * self.waited_s / (self.held + self.resent or 1)
        return (f"held {self.held} packets received and resent {self.resent} sent (mean wait "
                f"{mean:.1f} ms, longest {1000 * self.longest_s:.1f} ms); {self.lost} could "
                f"not be resent, {self.overruns} receive overruns, {self.refused} verdicts "
                "refused")

    def _configure(self, queue: int, *, what: str = "", check: bool = True,
                   command: int | None = None, copy: int | None = None,
                   maxlen: int | None = None, flags: int | None = None) -> None:
        """Send one config message and wait for its acknowledgement."""
        assert self.sock is not None  # noqa: S101
        seq = self._next_seq()
        self.sock.sendto(config(queue, seq, command=command, copy=copy, maxlen=maxlen,
                                flags=flags), (0, 0))
        deadline = time.monotonic() + _START_S
        while time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            for answer in messages(self.sock.recv(65536)):
                code = error_code(answer)
                if code is not None and answer.seq == seq:
                    self.sock.settimeout(None)
                    if code and check:
                        raise _config_error(queue, what, code)
                    return
        msg = f"the kernel did not answer the delayer's request to {what or 'configure'}"
        raise DelayError(msg)

    def _receive(self) -> None:
        """Take every message waiting on the socket; drop the originals of sent packets."""
        assert self.sock is not None  # noqa: S101
        copied: list[int] = []
        while True:
            try:
                data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                self.overruns += 1  # the kernel dropped what did not fit: counted, go on
                continue
            now = time.monotonic()
            for msg in messages(data):
                self._take(msg, now, copied)
        self._verdicts(self.out_queue, copied, NF_DROP)

    def _take(self, msg: Message, now: float, copied: list[int]) -> None:
        got = packet(msg)
        if got is None:
            self.refused += bool(error_code(msg))  # a verdict on a packet no longer held
            return
        wait = draw(self.rng, self.delay_ms, self.jitter_ms)
        if got.queue != self.out_queue:
            self.inbound.hold(Packet(got.queue, got.id), now, wait)
            return
        whole = got.data is not None and len(got.data) >= 20 and got.data[0] >> 4 == 4
        if whole:
            copied.append(got.id)  # its original goes now; its copy is sent when due
        self.outbound.hold(got if whole else Packet(got.queue, got.id), now, wait)

    def _release(self, due: list[tuple[Packet, float]]) -> None:
        """Let ``due`` go in order: accept the held, send the copies."""
        assert self.raw is not None  # noqa: S101
        accept: dict[int, list[int]] = {self.queue: [], self.out_queue: []}
        for item, waited in due:
            if item.data is None:
                accept[item.queue].append(item.id)
                self.held += 1
            else:
                self._resend(item.data)
            self.waited_s += waited
            self.longest_s = max(self.longest_s, waited)
        for queue, ids in accept.items():
            self._verdicts(queue, ids, NF_ACCEPT)

    def _resend(self, data: bytes) -> None:
        assert self.raw is not None  # noqa: S101
        try:
            self.raw.sendto(data, (socket.inet_ntoa(data[16:20]), 0))
            self.resent += 1
        except OSError:  # a drop rule of another fault, a full buffer: lost, as on a link
            self.lost += 1

    def _verdicts(self, queue: int, ids: list[int], decision: int) -> None:
        assert self.sock is not None  # noqa: S101
        for start in range(0, len(ids), _VERDICTS_PER_SEND):
            chunk = ids[start:start + _VERDICTS_PER_SEND]
            self.sock.sendto(b"".join(verdict(queue, i, decision) for i in chunk), (0, 0))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq


def _buffer(sock: socket.socket, forced: int, option: int) -> None:
    """A big buffer: past the sysctl's cap as root (the ``FORCE`` option), else up to it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, forced, BUFFER_BYTES)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, option, BUFFER_BYTES)


def _config_error(queue: int, what: str, code: int) -> DelayError:
    reason = os.strerror(code)
    if code == errno.EBUSY:
        hint = f"another process holds queue {queue} in this namespace: stop it or pick another"
    elif code in (errno.EPERM, errno.EACCES):
        hint = "run it as root (CAP_NET_ADMIN) inside the host's namespace"
    else:
        hint = "is nfnetlink_queue in this kernel (CONFIG_NETFILTER_NETLINK_QUEUE)?"
    msg = f"the delayer could not {what} ({reason}): {hint}"
    return DelayError(msg)


def _has_interface(name: str) -> bool:
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


# -- running it for the nemesis ----------------------------------------------------------------

#: The delayers this process started, so that it reaps them when it stops them.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def pid_file(run_dir: Path, host: str) -> Path:
    """Where the pid of ``host``'s delayer is kept: the run directory, for a later heal."""
    return run_dir / f"nemesis-delay-{host}.pid"


def start(host: Host, run_dir: Path, queue: int, delay_ms: float, jitter_ms: float,
          interface: str, *, max_seconds: float = MAX_SECONDS) -> int:
    """Start a delayer in ``host``'s namespace; wait until its queues are bound; its pid.

    It binds ``queue`` (what the host gets) and ``queue + 1`` (what it sends), in a
    session of its own, so that a Ctrl-C meant for the nemesis reaches the nemesis alone,
    which removes its rules before it stops the delayer.
    """
    log_path = run_dir / "logs" / f"nemesis-delay-{host.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    offset = log_path.stat().st_size if log_path.exists() else 0
    argv = [sys.executable, "-m", "infra.faults.delay", "--queue", str(queue), "--delay-ms",
            str(delay_ms), "--jitter-ms", str(jitter_ms), "--max-seconds", str(max_seconds),
            "--interface", interface]
    with log_path.open("ab") as out:
        child = subprocess.Popen(host.argv(argv), stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    pid_file(run_dir, host.name).write_text(json.dumps({"pid": child.pid, "host": host.name}))
    deadline = time.monotonic() + _START_S
    while BOUND not in _read_from(log_path, offset):
        if child.poll() is not None or time.monotonic() > deadline:
            _stop(child.pid, child)
            pid_file(run_dir, host.name).unlink(missing_ok=True)
            tail = _read_from(log_path, offset).strip()[-600:] or "(no output)"
            msg = (f"the packet delayer for {host.name} did not bind its queue within "
                   f"{_START_S:.0f}s; its log {log_path} ends: {tail}")
            raise DelayError(msg)
        time.sleep(0.02)
    _CHILDREN[child.pid] = child
    return child.pid


def running(run_dir: Path) -> dict[str, int]:
    """The delayers the run's pid files name that still run, by host."""
    found = {}
    for path in sorted(run_dir.glob(pid_file(run_dir, "*").name)):
        record = _pid_record(path)
        if record and _is_delayer(record[1]):
            found[record[0]] = record[1]
    return found


def stop_all(run_dir: Path, host: str = "*") -> list[int]:
    """Stop the delayers the run's pid files name (SIGTERM, then SIGKILL); their pids."""
    stopped = []
    for path in sorted(run_dir.glob(pid_file(run_dir, host).name)):
        record = _pid_record(path)
        child = _CHILDREN.pop(record[1], None) if record else None
        if record and _is_delayer(record[1]):
            _stop(record[1], child)
            stopped.append(record[1])
        elif child is not None:
            # It is exiting by itself (its host removed). Its command line empties before
            # it can be waited for, so wait for it: no zombie left, and the pid stays ours
            # until then, so the signals of _stop cannot reach another process.
            _stop(child.pid, child)
        path.unlink(missing_ok=True)
    return stopped


def _stop(pid: int, child: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM ``pid`` (it lets its packets go and exits), SIGKILL after a bound."""
    for sig, grace in ((signal.SIGTERM, _STOP_S), (signal.SIGKILL, _STOP_S)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while _alive(pid, child) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not _alive(pid, child):
            break
    if _alive(pid, child):
        log.warning("the packet delayer (pid %d) outlived SIGKILL", pid)


def _alive(pid: int, child: subprocess.Popen[bytes] | None) -> bool:
    return child.poll() is None if child is not None else procs.running(pid)


def _is_delayer(pid: int) -> bool:
    """Whether ``pid`` is a live delayer (not a process that reused its pid)."""
    return procs.running(pid, "infra.faults.delay")


def _pid_record(path: Path) -> tuple[str, int] | None:
    try:
        record = json.loads(path.read_text())
        return str(record["host"]), int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as source:
        source.seek(offset)
        return source.read().decode(errors="replace")


# -- the command ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None, out: IO[str] | None = None) -> int:
    """``python -m infra.faults.delay``: hold one queue's packets until stopped; a summary line."""
    p = argparse.ArgumentParser(prog="python -m infra.faults.delay",
                                description="hold an NFQUEUE's packets for a normal delay, "
                                            "in order")
    p.add_argument("--queue", type=int, required=True,
                   help="the NFQUEUE of the packets the host receives (held in the kernel)")
    p.add_argument("--out-queue", type=int,
                   help="the NFQUEUE of the packets the host sends (copied, dropped, sent "
                        "again; default --queue + 1)")
    p.add_argument("--delay-ms", type=float, default=100.0, help="mean delay (default 100)")
    p.add_argument("--jitter-ms", type=float, default=50.0,
                   help="standard deviation of the delay (default 50)")
    p.add_argument("--max-seconds", type=float, default=MAX_SECONDS,
                   help=f"stop after this long (default {MAX_SECONDS:.0f})")
    p.add_argument("--interface", help="stop when this interface is gone")
    args = p.parse_args(argv)
    out_queue = args.queue + 1 if args.out_queue is None else args.out_queue
    if args.delay_ms < 0 or args.jitter_ms < 0 or not 0 <= args.queue < out_queue <= 65535:
        p.error("--delay-ms and --jitter-ms must be >= 0, and 0 <= --queue < --out-queue "
                "<= 65535")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    wake, wake_in = socket.socketpair()
    wake_in.setblocking(False)
    signal.set_wakeup_fd(wake_in.fileno())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # the wakeup fd ends the loop
    delayer = Delayer(args.queue, out_queue, args.delay_ms, args.jitter_ms)
    try:
        delayer.open()
        log.info("%s %d (in) and %d (out): holding packets %.0f ms ± %.0f ms, in order",
                 BOUND, args.queue, out_queue, args.delay_ms, args.jitter_ms)
        why = delayer.serve(time.monotonic() + args.max_seconds, wake, args.interface)
    except DelayError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        delayer.close()
    print(f"stopped because {why}: {delayer.summary()}", file=out or sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
