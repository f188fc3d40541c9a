"""infra.services.procs: liveness by pid and marker, sessions, memory, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from infra.services import procs

SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)", "fanout-procs-marker"]


def test_a_process_just_started_is_running_with_its_marker() -> None:
    """Right after Popen returns, whatever the exec's state in the kernel."""
    started = [subprocess.Popen(SLEEPER) for _ in range(20)]
    try:
        assert all(procs.running(p.pid, "fanout-procs-marker") for p in started)
        assert not any(procs.running(p.pid, "some-other-marker") for p in started)
        assert all(procs.rss(p.pid) > 0 for p in started)
        assert "fanout-procs-marker" in procs.cmdline(started[0].pid)
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_a_zombie_or_a_gone_process_is_not_running() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while procs.running(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # exited, not reaped: a zombie
    assert not procs.running(process.pid)
    assert procs.cmdline(process.pid) == ""
    process.wait()
    assert not procs.running(process.pid, "python")
    assert procs.rss(process.pid) == 0


def test_session_members_finds_a_sessions_processes() -> None:
    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
         "print('started', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert leader.stdout is not None and leader.stdout.readline() == "started\n"
        members = dict(procs.session_members(leader.pid))
        assert len(members) == 2 and leader.pid in members
        assert os.getpid() not in members
    finally:
        for pid in procs.session_members(leader.pid):
            os.kill(pid[0], 9)
        leader.wait()
