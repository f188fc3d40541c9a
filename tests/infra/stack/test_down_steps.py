"""``fanout down`` stops every service once, each no later than what it uses
(``infra.stack.stack.DOWN_STEPS``), and a failed ``up`` what it started, in that order;
the whole-stack tests check that nothing is left."""

from __future__ import annotations

import itertools
import subprocess
import sys
import uuid
from pathlib import Path

from infra.services.fanout import alive
from infra.stack.stack import DOWN_STEPS, SERVICES, Stack, stop_services
from tests.support.process import wait_for


def test_down_stops_every_service_once_and_none_before_what_started_after_it():
    steps = [name for step in DOWN_STEPS for name in step]
    assert sorted(steps) == sorted(SERVICES) and len(set(steps)) == len(steps)
    step_of = {name: i for i, step in enumerate(DOWN_STEPS) for name in step}
    for first, then in itertools.combinations(SERVICES, 2):  # SERVICES: the order `up` starts
        assert step_of[then] <= step_of[first], f"{first} stops before {then}, which uses it"


_SERVICE = """
import signal, sys, time
def stop(*_):
    with open(sys.argv[1], "a") as log:
        log.write(sys.argv[2] + "\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1] + "-" + sys.argv[2], "w").close()  # ready: SIGTERM is handled
time.sleep(120)
"""


def test_what_a_failed_up_started_is_stopped_in_downs_order_and_nothing_else(
        tmp_path: Path) -> None:
    """``stop_services``: ``down``'s steps for the services a failed ``up`` started."""
    stopped = tmp_path / "stopped"
    marker = f"fanout-test-{uuid.uuid4().hex}"
    stack = Stack(str(tmp_path), "127.0.0.1:1", "sqlite:///x", "http://127.0.0.1:1")
    procs = {}
    for name in ("broker", "job", "api", "verifier"):
        procs[name] = subprocess.Popen([sys.executable, "-c", _SERVICE, str(stopped), name,
                                        marker], start_new_session=True)
        stack.pids[name], stack.markers[name] = procs[name].pid, marker
    try:
        wait_for(lambda: all(Path(f"{stopped}-{name}").exists() and alive(p.pid, marker)
                             for name, p in procs.items()), 30, "the services")
        assert stop_services(stack, ["broker", "api", "job"], timeout=10) == [
            "api", "job", "broker"]
        assert stopped.read_text().split() == ["api", "job", "broker"]
        assert procs["verifier"].poll() is None and stack.pids.keys() == {"verifier"}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
