"""The nemesis's ``slow`` fault (infra.faults.nemesis, infra.faults.delay): a real delay, in order, healed.

Two hosts of their own (real namespaces, as in ``test_hosts.py``, no Kafka or
Cassandra) and a TCP echo server in one of them: round trips to it are timed from the
root namespace and from the other host before the fault, while the host is slow, and
after the heal. Where the kernel has no netem (this machine's), ``slow`` runs the
NFQUEUE delayer of :mod:`infra.faults.delay`; the pure parts of that delayer — its netlink
messages and its FIFO release schedule — are tested here without a socket.
"""

from __future__ import annotations

import json
import random
import socket
import statistics
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from infra.faults import delay
from infra.faults.nemesis import Nemesis, netem_available
from infra.services.hosts import HostNetwork
from tests.infra.services.test_hosts import LAYOUT, needs_netns
from tests.support.paths import ROOT
from tests.support.process import wait_for

pytestmark = [pytest.mark.xdist_group("stack")]  # its worker group: tests/plugins/workers.py

ECHO_PORT = 7007
DELAY_MS, JITTER_MS = 100, 20
ECHO = textwrap.dedent(f"""
    import socket, socketserver

    class Echo(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := self.request.recv(65536):
                self.request.sendall(data)

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    server = socketserver.ThreadingTCPServer(("0.0.0.0", {ECHO_PORT}), Echo)
    server.daemon_threads = True
    print("listening", flush=True)
    server.serve_forever()
""")
PROBE = textwrap.dedent("""
    import json, socket, sys, time
    address, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with socket.create_connection((address, port), timeout=10) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(count):
            start = time.monotonic()
            conn.sendall(b"x")
            assert conn.recv(1) == b"x"
            rtts.append(1000 * (time.monotonic() - start))
    print(json.dumps(rtts))
""")


@pytest.fixture
def echoing(tmp_path):
    """Hosts a and b, with an echo server in b; torn down even when the test fails."""
    network = HostNetwork(tmp_path, LAYOUT)
    try:
        network.ensure()
        server = subprocess.Popen(network.host("b").argv([sys.executable, "-c", ECHO]),
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            assert server.stdout.readline().strip() == "listening"
            yield network
        finally:
            server.kill()
            server.wait(timeout=10)
    finally:
        delay.stop_all(tmp_path)
        network.remove()


def _rtts(prefix: list[str], address: str, count: int) -> list[float]:
    """``count`` round trips to the echo server, in ms, from the namespace ``prefix`` runs in."""
    done = subprocess.run([*prefix, sys.executable, "-c", PROBE, address, str(ECHO_PORT),
                           str(count)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [float(r) for r in json.loads(done.stdout)]


def _transfer(address: str, size: int = 1 << 20) -> tuple[bytes, bytes, float]:
    """``size`` random bytes sent to the echo server; what was sent, what came back, seconds."""
    sent = random.Random(7).randbytes(size)
    got = bytearray()
    start = time.monotonic()
    with socket.create_connection((address, ECHO_PORT), timeout=30) as conn:
        writer = threading.Thread(target=conn.sendall, args=(sent,), daemon=True)
        writer.start()
        while len(got) < size:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
        writer.join(timeout=30)
    return sent, bytes(got), time.monotonic() - start


def _queue_rules(host) -> list[str]:
    shown = subprocess.run(host.argv(["iptables", "-w", "5", "-S"]), capture_output=True,
                           text=True, timeout=20, check=False).stdout
    return [line for line in shown.splitlines() if "NFQUEUE" in line]


@needs_netns
def test_a_slow_host_delays_its_link_both_ways_in_order_until_healed(echoing, tmp_path):
    a, b = echoing.host("a"), echoing.host("b")
    nemesis = Nemesis(tmp_path, echo=False)
    before = _rtts([], b.address, 10) + _rtts(a.argv([]), b.address, 5)

    fault = nemesis.slow("b", delay_ms=DELAY_MS, jitter_ms=JITTER_MS)
    try:
        assert fault.detail["how"] == ("netem" if netem_available() else "nfqueue")
        assert any(nemesis.status()["b"])
        from_root = _rtts([], b.address, 12)
        from_peer = _rtts(a.argv([]), b.address, 8)
        sent, got, took = _transfer(b.address)
    finally:
        nemesis.heal()
    after = _rtts([], b.address, 10) + _rtts(a.argv([]), b.address, 5)

    print(f"\nRTT ms median before {statistics.median(before):.2f}, slow from root "
          f"{statistics.median(from_root):.1f} (min {min(from_root):.1f}, max "
          f"{max(from_root):.1f}), slow from host a {statistics.median(from_peer):.1f}, "
          f"after {statistics.median(after):.2f}; 1 MB echoed in {took:.2f}s")
    # A round trip crosses the slow host twice (in and out), each way ~100 ms.
    assert statistics.median(before) < 50
    assert statistics.median(from_root) >= 1.5 * DELAY_MS
    assert statistics.median(from_peer) >= 1.5 * DELAY_MS
    assert got == sent  # every byte, in order
    assert statistics.median(after) < 50
    assert nemesis.status() == {"a": [], "b": []}
    assert _queue_rules(b) == []
    assert not list(tmp_path.glob("nemesis-delay-*.pid"))
    if "pid" in fault.detail:
        assert not Path(f"/proc/{fault.detail['pid']}").exists()


@needs_netns
@pytest.mark.skipif(netem_available(), reason="netem runs no delayer to leave behind")
def test_a_delayer_an_earlier_nemesis_left_is_stopped_by_the_next_heal(echoing, tmp_path):
    # A nemesis slows b, then dies without healing (os._exit: no finally, no signal).
    script = textwrap.dedent(f"""
        import os
        from infra.faults.nemesis import Nemesis
        fault = Nemesis({str(tmp_path)!r}, echo=False).slow("b", 100, 20)
        print(fault.detail["pid"], flush=True)
        os._exit(9)
    """)
    made = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert made.returncode == 9, made.stderr
    pid = int(made.stdout.strip())
    b = echoing.host("b")
    assert delay.running(tmp_path) == {"b": pid}
    assert len(_queue_rules(b)) == 2
    assert statistics.median(_rtts([], b.address, 3)) >= DELAY_MS  # still slow

    Nemesis(tmp_path, echo=False).heal()

    assert delay.running(tmp_path) == {}
    assert _queue_rules(b) == []
    assert not Path(f"/proc/{pid}").exists() or b"infra.faults.delay" not in Path(
        f"/proc/{pid}/cmdline").read_bytes()
    log_text = (tmp_path / "logs" / "nemesis-delay-b.log").read_text()
    assert "stopped because it was told to stop" in log_text


@needs_netns
@pytest.mark.skipif(netem_available(), reason="netem runs no delayer to leave behind")
def test_a_delayer_whose_host_is_removed_stops_by_itself(tmp_path):
    # `fanout down` removes the hosts without a heal; the delayer must not linger (and
    # keep its namespace alive) until its --max-seconds.
    network = HostNetwork(tmp_path, LAYOUT)
    try:
        network.ensure()
        pid = Nemesis(tmp_path, echo=False).slow("b", 100, 20).detail["pid"]
    finally:
        network.remove()
    try:
        wait_for(lambda: not delay.running(tmp_path), 10, "the delayer to see eth0 gone")
    finally:
        delay.stop_all(tmp_path)
    log_text = (tmp_path / "logs" / "nemesis-delay-b.log").read_text()
    assert "stopped because eth0 is gone" in log_text
    assert not Path(f"/proc/{pid}/cmdline").exists() or b"infra.faults.delay" not in Path(
        f"/proc/{pid}/cmdline").read_bytes()
    # Reaped, not left a zombie child of this process (an os.wait() elsewhere would get it).
    assert pid not in {child.pid for child in psutil.Process().children()}


# -- the delayer's pure parts ----------------------------------------------------------------

def test_a_config_message_carries_the_queue_big_endian_and_asks_for_an_ack():
    data = delay.config(258, seq=9, command=delay.NFQNL_CFG_CMD_BIND,
                        copy=delay.NFQNL_COPY_META, maxlen=8192)
    (msg,) = delay.messages(data)
    assert msg.kind == (delay.NFNL_SUBSYS_QUEUE << 8) | delay.NFQNL_MSG_CONFIG
    assert msg.seq == 9
    length, _, flags, _, _ = struct.unpack_from("=IHHII", data)
    assert length == len(data) and len(data) % 4 == 0
    assert flags == delay.NLM_F_REQUEST | delay.NLM_F_ACK
    assert msg.payload[:4] == b"\x00\x00\x01\x02"  # AF_UNSPEC, v0, queue 258 big-endian
    found = delay.attrs(msg.payload)
    assert found[delay.NFQA_CFG_CMD] == bytes([delay.NFQNL_CFG_CMD_BIND, 0, 0, socket.AF_INET])
    assert found[delay.NFQA_CFG_PARAMS] == b"\x00\x00\x00\x00" + bytes([delay.NFQNL_COPY_META])
    assert found[delay.NFQA_CFG_QUEUE_MAXLEN] == struct.pack("!I", 8192)


def test_verdicts_sent_together_parse_back_one_by_one():
    data = b"".join(delay.verdict(5, packet) for packet in (1, 2, 0xFFFFFFFF))
    parsed = list(delay.messages(data))
    assert [m.kind for m in parsed] == [(3 << 8) | delay.NFQNL_MSG_VERDICT] * 3
    headers = [delay.attrs(m.payload)[delay.NFQA_VERDICT_HDR] for m in parsed]
    assert [struct.unpack("!II", h) for h in headers] == [
        (delay.NF_ACCEPT, 1), (delay.NF_ACCEPT, 2), (delay.NF_ACCEPT, 0xFFFFFFFF)]


def test_a_packet_message_gives_its_queue_id_and_bytes_and_an_error_its_errno():
    # What the kernel sends: nfgenmsg, NFQA_PACKET_HDR (id, hw_protocol, hook), a mark,
    # and with NFQNL_COPY_PACKET the packet; NFQA_CAP_LEN when the copy was cut short.
    header = delay.attr(delay.NFQA_PACKET_HDR, struct.pack("!IHB", 77, 0x0800, 3))
    mark, ip = delay.attr(3, struct.pack("!I", 0)), b"\x45" + bytes(27)
    meta = delay.message(delay.NFQNL_MSG_PACKET, 5, header + mark, flags=0)
    whole = delay.message(delay.NFQNL_MSG_PACKET, 6, header + delay.attr(
        delay.NFQA_PAYLOAD, ip), flags=0)
    cut = delay.message(delay.NFQNL_MSG_PACKET, 6, header + delay.attr(
        delay.NFQA_PAYLOAD, ip[:20]) + delay.attr(delay.NFQA_CAP_LEN, struct.pack("!I", 28)),
        flags=0)
    error = struct.pack("=IHHII", 36, delay.NLMSG_ERROR, 0, 4, 0) + struct.pack("=i", -16) + (
        b"\0" * 16)
    first, second, third, fourth = delay.messages(meta + whole + cut + error)
    assert delay.packet(first) == delay.Packet(5, 77, None)
    assert delay.error_code(first) is None
    assert delay.packet(second) == delay.Packet(6, 77, ip)
    assert delay.packet(third) == delay.Packet(6, 77, None)  # cut: held, not sent again
    assert delay.error_code(fourth) == 16 and fourth.seq == 4  # EBUSY
    assert delay.packet(fourth) is None


def test_packets_leave_in_the_order_they_came_each_no_earlier_than_its_draw():
    schedule = delay.Schedule()
    assert schedule.hold(1, now=0.0, delay_s=0.30) == 0.30
    assert schedule.hold(2, now=0.01, delay_s=0.05) == 0.30  # would overtake 1: waits for it
    assert schedule.hold(3, now=0.02, delay_s=0.40) == pytest.approx(0.42)
    assert schedule.due(0.29) == [] and schedule.next_at() == 0.30
    assert [(p, round(w, 2)) for p, w in schedule.due(0.30)] == [(1, 0.30), (2, 0.29)]
    assert schedule.due(0.41) == [] and len(schedule) == 1
    assert [p for p, _ in schedule.drain(0.41)] == [3]  # stopping: all go at once, in order
    assert len(schedule) == 0 and schedule.next_at() is None


def test_a_draw_is_normal_around_the_delay_and_never_negative():
    rng = random.Random(3)
    draws = [delay.draw(rng, 100, 20) for _ in range(4000)]
    assert statistics.mean(draws) == pytest.approx(0.100, abs=0.002)
    assert statistics.stdev(draws) == pytest.approx(0.020, abs=0.002)
    assert min(delay.draw(rng, 0, 50) for _ in range(100)) == 0.0
