"""Hosts of their own (infra.services.hosts): made, reached, refused, and cleaned up after a crash.

Real namespaces, veth pairs and a bridge on this machine (the suite runs as root), with
two hosts on a subnet the network picks; no mock of the kernel. Skipped where this
process cannot make namespaces, with the refusal the product gives as the reason.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from infra.services.hosts import (
    HOSTS_FILE,
    HostNetwork,
    list_links,
    list_namespaces,
    refusal,
    remove,
)
from tests.support.hosts import HOSTS_REFUSED, leftovers
from tests.support.paths import ROOT

pytestmark = [pytest.mark.xdist_group("stack")]  # its worker group: tests/plugins/workers.py

needs_netns = pytest.mark.skipif(bool(HOSTS_REFUSED), reason=HOSTS_REFUSED)
LAYOUT = {"a": 11, "b": 12}


@needs_netns
def test_a_crashed_run_leaves_nothing_once_cleaned_up(tmp_path):
    # A process makes the hosts and dies without a word (SIGKILL-like os._exit).
    script = textwrap.dedent(f"""
        import os
        from infra.services.hosts import HostNetwork
        network = HostNetwork({str(tmp_path)!r}, {LAYOUT!r}).ensure()
        print(network.run_id, flush=True)
        os._exit(9)
    """)
    made = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert made.returncode == 9, made.stderr
    run_id = made.stdout.strip()
    assert len(leftovers(run_id)) == 5  # two namespaces, two veths, the bridge

    removed = remove(tmp_path)

    # A namespace takes its veth pair with it, though not always at once (the kernel
    # dismantles it in the background): a veth still there is deleted by its name.
    assert [r for r in removed if r.startswith("netns")] == [
        f"netns fanout-{run_id}-a", f"netns fanout-{run_id}-b"]
    assert f"link fo{run_id}-br" in removed
    assert leftovers(run_id) == []
    assert json.loads((tmp_path / HOSTS_FILE).read_text())["made"] == []


@needs_netns
def test_a_crashed_run_whose_directory_is_gone_is_swept_by_the_next_one(tmp_path):
    gone = tmp_path / "gone"
    network = HostNetwork(gone, LAYOUT).ensure()
    shutil.rmtree(gone)  # the run was killed, then its temporary directory deleted
    try:
        assert len(leftovers(network.run_id)) == 5
        removed = remove(tmp_path / "another-run")  # what `fanout down` runs there
        assert f"link fo{network.run_id}-br" in removed
        assert leftovers(network.run_id) == []
    finally:
        network.remove()


@needs_netns
def test_what_the_record_lost_is_found_by_the_run_s_prefix(tmp_path):
    network = HostNetwork(tmp_path, LAYOUT).ensure()
    record = json.loads((tmp_path / HOSTS_FILE).read_text())
    (tmp_path / HOSTS_FILE).write_text(json.dumps({**record, "made": []}))
    try:
        assert len(leftovers(network.run_id)) == 5
        remove(tmp_path)
        assert leftovers(network.run_id) == []
    finally:
        network.remove()


@needs_netns
def test_hosts_reach_each_other_and_the_bridge_but_nothing_outside(tmp_path):
    network = HostNetwork(tmp_path, LAYOUT).ensure()
    try:
        a, b = network.host("a"), network.host("b")
        with socket.socket() as server:  # in the root namespace, on the bridge
            server.bind((network.gateway, 0))
            server.listen()
            port = server.getsockname()[1]
            assert _connect(a, network.gateway, port) == "ok"
        assert _connect(a, b.address, 9) == "refused"  # b answers: a RST, no listener
        assert _connect(a, "192.0.2.1", 9) == "unreachable"  # no route out
        assert sorted(network.namespaces()) == sorted([a.netns, b.netns])
        # The same network ensured again is kept as it is.
        again = HostNetwork(tmp_path, LAYOUT).ensure()
        assert (again.run_id, again.net) == (network.run_id, network.net)
    finally:
        network.remove()
    assert leftovers(network.run_id) == []
    assert not [n for n in list_namespaces() if network.run_id in n]
    assert not [n for n in list_links() if network.run_id in n]


def _connect(host, address: str, port: int) -> str:
    probe = textwrap.dedent(f"""
        import errno, socket, sys
        try:
            socket.create_connection(({address!r}, {port}), timeout=3).close()
            print("ok")
        except ConnectionRefusedError:
            print("refused")
        except OSError as exc:
            print("unreachable" if exc.errno == errno.ENETUNREACH else repr(exc))
    """)
    done = subprocess.run(host.argv([sys.executable, "-c", probe]), capture_output=True,
                          text=True, timeout=30, check=False)
    return done.stdout.strip() or done.stderr


def test_a_process_without_root_is_refused_with_the_reason():
    # A user namespace: the same files, but uid 65534 and no capability of the machine.
    done = subprocess.run(
        ["unshare", "--user", sys.executable, "-c",
         "from infra.services.hosts import require_netns; require_netns()"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "needs root" in done.stderr
    assert "drop --hosts to run every node on loopback" in done.stderr


def test_a_kernel_that_refuses_namespaces_is_named_in_the_refusal():
    # Root in a user namespace of its own: `ip netns add` is tried, and the kernel says no.
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", sys.executable, "-c",
         "from infra.services.hosts import require_netns; require_netns()"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "`ip netns add` failed here" in done.stderr


def test_the_refusal_says_what_is_missing():
    assert refusal(0, "/usr/bin/ip", None) is None
    assert "iproute2" in (refusal(0, None, None) or "")
    assert "uid 1000" in (refusal(1000, "/usr/bin/ip", None) or "")
