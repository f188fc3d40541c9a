"""Network faults on a stack whose nodes have hosts: a node's host cut off, the brokers cut off.

The package's three-node stack (tests/stack/nodes/conftest.py, ``fanout up --nodes 3
--hosts``, shared with ``test_nodes.py``, which runs first): three Kafka
brokers, three Cassandra nodes and the Spark daemons each in a network namespace of
its own on a bridge (infra.services.hosts), the job, the API and this test in the root
namespace. A small history is replayed (paced) while :class:`infra.checks.checker.Workload`
posts tweets and reads home timelines through the API; the nemesis (infra.faults.nemesis)
isolates ``node-1`` — Kafka node 1 and Cassandra node 1 — from the other hosts and
from the root namespace, both ways, for :data:`FAULT_S` seconds, then heals. Checked:

- every write answered 202 is in the log once and in the views (0 lost, 0
  duplicated, 0 phantom: :func:`infra.checks.checker.check`), and ``fanout verify`` finds 0
  divergent once the job has caught up;
- the API answered every write during the fault within the client's timeout, with
  202 or a 503 whose body is JSON with a reason (never a hung request);
- reads too, with 200 (two of the three replicas make LOCAL_QUORUM) or 503: a read
  routed to the cut-off Cassandra node is sent on to the next replica after the
  store's ``speculate_ms`` (views/stores/cassandra/config.py), where it used to wait
  out the driver's 10 s request timeout, page round trip after round trip;
- ``fanout down`` leaves no namespace, link or nemesis rule behind.

Then, without a replay, writers and readers through five faults in turn
(:mod:`infra.checks.under_fault`), the cut-off :data:`FAULT_S` seconds and each of the
others :data:`SHORT_FAULT_S`:

- the job and the API (the root namespace) cut off from the brokers' port
  (``nemesis cut-root``): writes answer 503 with a reason within the write timeout,
  reads go on;
- a one-way partition (node-2 cannot reach node-3), node-3 flapping (4 s cut off, 4 s
  healed), node-2 dropping 5 % of its packets and node-1 slowed: every request
  answered within the client's timeout, writes 202 or a 503 with a reason.

After the last heal nothing acknowledged is lost and the job catches up (``verify`` 0
divergent).

Each scenario runs once (a module fixture) and each test checks one of these; the
``cut_off`` tests read the first window of the second scenario.

Run with ``-s`` for the figures (202s, the 503 window and its latencies, the time to
the first 202 and to a caught-up view after the heal).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.checks.checker import (
    REQUEST_TIMEOUT_S,
    History,
    Op,
    Report,
    Workload,
    check,
    log_ends,
    read_stats,
)
from infra.checks.under_fault import Window, acked, flapping, hold, render_probes
from infra.faults.nemesis import LOG_FILE, Nemesis
from infra.stack.stack import Stack
from ingest.events import TWEETS
from ingest.settings import KafkaSettings
from serving.app import STALLED_MS
from serving.callers import mint
from tests.support.hosts import HOSTS_REFUSED
from tests.support.paths import ROOT
from tests.support.process import wait_for
from tests.support.stack import Run
from views.stores import store_from_url

pytestmark = [pytest.mark.xdist_group("stack"),
              pytest.mark.spark, pytest.mark.broker, pytest.mark.e2e,
              pytest.mark.skipif(bool(HOSTS_REFUSED), reason=HOSTS_REFUSED)]

USERS, FOLLOWS, TWEETS_PER_HISTORY = 200, 2000, 1000
#: The history spans 0.01 days and replays 20x faster: ~43 s, through the whole fault.
SPAN_DAYS, SPEEDUP = 0.01, 20
#: How long the host stays cut off (the issue asks for at least 30 s), and the job and
#: the API cut off from the brokers.
FAULT_S = 30.0
#: How long each of the one-way partition, the flapping, the lossy and the slow host
#: holds: longer than a request's timeout (``REQUEST_TIMEOUT_S``), and two of the
#: flapping host's 8 s cycles.
SHORT_FAULT_S = 16.0


@pytest.fixture(scope="module")
def hosts_run(three_nodes: Run) -> Run:
    """The package's three-node stack on hosts (tests/stack/nodes/conftest.py)."""
    return three_nodes


@dataclass
class Faulted:
    """What happened while each fault held (its :class:`Window`), and after the heals."""

    windows: list[Window]
    history: History
    report: Report
    caught_up_s: float
    verified: str
    logged: list[dict[str, object]]
    #: How long each produce request the API gave up on had been in flight (ms).
    stalled_ms: list[int]

    @property
    def window(self) -> Window:
        return self.windows[0]

    @property
    def probes(self) -> list[dict[str, object]]:
        return self.window.probes

    def during(self, ops: list[Op]) -> list[Op]:
        return self.window.during(ops)


@pytest.fixture(scope="module")
def isolated(hosts_run: Run) -> Faulted:
    """Replay, writers and readers; node-1 cut off from every host and the root namespace."""
    return _scenario(hosts_run, [("isolate node-1", lambda n: n.isolate("node-1"), FAULT_S)],
                     replay=True)


@pytest.fixture(scope="module")
def in_turn(hosts_run: Run) -> Faulted:
    """Writers and readers; the job and the API cut off from the brokers' port, then a
    one-way partition, a flapping host, a lossy one and a slow one, in turn.

    Run without :func:`isolated` (``-k``), the stack's view would hold no follows, and
    ``verify`` no user: the history is replayed first, unpaced."""
    if not hosts_run.history.exists():
        _generate(hosts_run)
        hosts_run.fanout("replay", "--no-progress", str(hosts_run.history), timeout=300)
    return _scenario(hosts_run, [
        ("cut-root", lambda n: n.cut_root(), FAULT_S),
        ("one-way node-2 -> node-3", lambda n: n.one_way("node-2", "node-3"), SHORT_FAULT_S),
        ("flap node-3", flapping("node-3"), SHORT_FAULT_S),
        ("lossy node-2 5%", lambda n: n.lossy("node-2", 5.0), SHORT_FAULT_S),
        ("slow node-1 100±50ms", lambda n: n.slow("node-1", 100, 50), SHORT_FAULT_S)],
        replay=False)


@pytest.fixture(scope="module")
def cut_off(in_turn: Faulted) -> Faulted:
    """The first window of :func:`in_turn`: the job and the API cut off from the brokers.

    It shares the scenario's writers, readers and final check rather than running its
    own: one workload and one ``verify`` fewer, with the same 30 s under the fault."""
    assert in_turn.windows[0].name == "cut-root", [w.name for w in in_turn.windows]
    return in_turn


def _scenario(run: Run, faults: list[tuple[str, Callable[[Nemesis], object], float]], *,
              replay: bool) -> Faulted:
    """Writers and readers on the API (and a paced replay), each fault for its seconds,
    heal."""
    stack = Stack.load(run.run_dir)
    assert stack is not None
    kafka = KafkaSettings(bootstrap=stack.bootstrap, partitions=stack.partitions,
                          topic_prefix=stack.topic_prefix)
    history = History()
    history.start_offsets = log_ends(kafka.bootstrap, kafka.topic(TWEETS))
    secret = stack.env().get("FANOUT_AUTH_SECRET", "").encode()
    workload = Workload(stack.api_url, list(range(1, USERS + 1)), history,
                        lambda u: mint(u, secret, 3600),
                        write_every=0.1, read_every=0.1, seed=1).start()
    replaying = _replay(run) if replay else None
    nemesis = Nemesis(run.run_dir, echo=False)
    logged_before = _logged(run)
    api_log = stack.log_of("api")
    api_log_from = api_log.stat().st_size if api_log.exists() else 0
    try:
        wait_for(lambda: acked(history, 0) >= 20, 120, "20 writes answered 202 before the fault")
        windows = [hold(nemesis, name, apply, stack.api_url, history, seconds, USERS)
                   for name, apply, seconds in faults]
    finally:
        workload.stop()
        if replaying is not None and replaying.poll() is None and sys.exc_info()[0] is not None:
            replaying.kill()
    if replaying is not None:
        out, _ = replaying.communicate(timeout=300)
        assert replaying.returncode == 0, f"the replay failed:\n{out[-3000:]}"
    verify_began = time.monotonic()
    verified = run.verify()
    caught_up = time.monotonic() - verify_began
    with store_from_url(stack.store_url, cap=800) as store:
        report = check(history, kafka.bootstrap, kafka.topic(TWEETS), store)
    result = Faulted(windows, history, report, caught_up, verified,
                     _logged(run)[len(logged_before):], _stalled_ms(api_log, api_log_from))
    shown = "\n".join(w.render(history) for w in windows)
    print(f"\n{shown}\n{report.render()}\nverify (view caught up) "
          f"{caught_up:.0f}s after the replay: {verified.strip().splitlines()[-1]}")
    return result


def _replay(run: Run) -> subprocess.Popen[str]:
    """A small history, generated now and replayed paced, through the fault."""
    _generate(run)
    return subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "--run-dir", str(run.run_dir), "replay",
         str(run.history), "--speedup", str(SPEEDUP), "--no-progress", "--max-failures", "-1"],
        cwd=ROOT, env=run.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _generate(run: Run) -> None:
    """The small history, starting now (the API's writers post as its users)."""
    run.fanout("generate", "--out", str(run.history), "--users", str(USERS), "--follows",
               str(FOLLOWS), "--tweets", str(TWEETS_PER_HISTORY), "--seed", "1", "--start",
               str(int(time.time() * 1000)), "--span-days", str(SPAN_DAYS), "--mix", "posts")


def _stalled_ms(api_log: Path, offset: int) -> list[int]:
    """The in-flight time of each produce request the API's producer timed out (librdkafka
    logs each), from ``offset`` of its log on."""
    if not api_log.exists():
        return []
    with api_log.open("rb") as lines:
        lines.seek(offset)
        text = lines.read().decode("utf-8", "replace")
    return [int(ms) for ms in re.findall(r"Timed out ProduceRequest in flight \(after (\d+)ms", text)]


def _logged(run: Run) -> list[dict[str, object]]:
    path = run.run_dir / LOG_FILE
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


@pytest.mark.timeout(1500)  # includes starting the module's stack and the scenario
def test_every_write_answered_202_is_in_the_log_once_and_in_the_views(isolated):
    assert isolated.report.ok, isolated.report.render()
    assert isolated.report.acknowledged > 20, isolated.report.render()
    assert "0 divergent" in isolated.verified
    assert [e["event"] for e in isolated.logged][:2] == ["apply", "heal"], isolated.logged


def test_writes_during_the_fault_answer_202_or_a_503_with_a_reason(isolated):
    during = isolated.during(isolated.history.writes)
    assert during, "no write was sent during the fault"
    hung = [op for op in during if op.status == 0]
    assert not hung, f"{len(hung)} writes got no answer within {REQUEST_TIMEOUT_S:.0f}s"
    assert {op.status for op in during} <= {202, 503}, sorted({op.status for op in during})
    assert all(p["status"] in (202, 503) for p in isolated.probes), render_probes(isolated.probes)
    assert all(p["reason"] for p in isolated.probes if p["status"] == 503), (
        render_probes(isolated.probes))


def test_reads_during_the_fault_answer_within_the_client_timeout(isolated):
    reads = isolated.during(isolated.history.reads)
    assert reads, "no read was sent during the fault"
    hung = [op for op in reads if op.status == 0]
    assert not hung, (f"{len(hung)} of {len(reads)} reads got no answer within "
                      f"{REQUEST_TIMEOUT_S:.0f}s during the fault")
    assert {op.status for op in reads} <= {200, 503}, read_stats(
        isolated.history.reads, isolated.window.began, isolated.window.healed).render()


@pytest.mark.timeout(900)  # runs the five-fault scenario
def test_cut_off_from_the_brokers_writes_answer_503_promptly_and_none_is_lost(cut_off):
    during = cut_off.during(cut_off.history.writes)
    assert cut_off.report.ok, cut_off.report.render()
    assert "0 divergent" in cut_off.verified
    assert [e["event"] for e in cut_off.logged][:2] == ["apply", "heal"], cut_off.logged
    assert not [op for op in during if op.status == 0], "writes got no answer"
    assert {op.status for op in during} <= {202, 503}, sorted({op.status for op in during})
    assert [p for p in cut_off.probes if p["status"] == 503], render_probes(cut_off.probes)
    assert all(p["reason"] for p in cut_off.probes if p["status"] == 503), (
        render_probes(cut_off.probes))
    # A request sent into the cut stays on its dead connection past the heal unless the
    # producer gives it up: held to its records' delivery timeout, they time out in
    # flight, the idempotent producer bumps its epoch, and a record can land twice.
    assert all(ms < STALLED_MS + 5_000 for ms in cut_off.stalled_ms), cut_off.stalled_ms


def test_cut_off_from_the_brokers_reads_go_on(cut_off):
    reads = cut_off.during(cut_off.history.reads)
    assert reads, "no read was sent during the fault"
    assert not [op for op in reads if op.status != 200], read_stats(
        cut_off.history.reads, cut_off.window.began, cut_off.window.healed).render()


@pytest.mark.timeout(900)  # the scenario, when run alone
def test_a_one_way_partition_a_flapping_a_lossy_and_a_slow_host_lose_and_hang_nothing(in_turn):
    assert in_turn.report.ok, in_turn.report.render()
    assert "0 divergent" in in_turn.verified
    assert [e["event"] for e in in_turn.logged].count("apply") >= 4, in_turn.logged
    slow = [e for e in in_turn.logged if e.get("fault") == "slow"]
    assert slow and slow[0]["how"] in ("netem", "nfqueue"), in_turn.logged
    for window in in_turn.windows:
        writes, reads = window.during(in_turn.history.writes), window.during(in_turn.history.reads)
        assert writes and reads, f"no write or read during {window.name}"
        assert not [op for op in writes + reads if op.status == 0], (
            f"requests got no answer within {REQUEST_TIMEOUT_S:.0f}s during {window.name}")
        assert {op.status for op in writes} <= {202, 503}, (window.name, sorted(
            {op.status for op in writes}))
        assert {op.status for op in reads} <= {200, 503}, (window.name, read_stats(
            in_turn.history.reads, window.began, window.healed).render())
        assert all(p["reason"] for p in window.probes if p["status"] == 503), (
            render_probes(window.probes))
