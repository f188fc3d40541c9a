"""Three Kafka brokers, three Cassandra nodes, two Spark workers: each killed mid-replay.

The scenarios run in sequence, in the order below, against the package's three-node
stack (``conftest.py``: ``fanout up --nodes 3``, on hosts of its own where the machine
allows), and each leaves it whole again; ``test_partitions.py`` takes it over after. In each, a small generated history is replayed (paced, so that it lasts
through the fault) while :class:`infra.checks.checker.Workload` posts tweets and reads home
timelines through the API; a node is SIGKILLed (``kill -9`` of the pid that
``stack.json`` records) mid-replay and later started again with ``fanout up``. Then
:func:`infra.checks.checker.check` holds every write answered 202 against the log and the
views — nothing lost, doubled or invented — and ``fanout verify`` finds the views
equal to the SQL recomputed from the log:

(a) the Kafka broker leading the most partitions: writes are accepted again once
    leadership fails over (the 503 window is printed);
(b) one Cassandra node: the job and the readers carry on at LOCAL_QUORUM with no
    error; restarted, the node is brought up to date (hints), and a read at ONE
    from it alone agrees with the quorum;
(c) a Spark worker: the driver keeps its application, the other worker's executor
    runs the tasks, and the job continues from its checkpoint;
(d) two Cassandra nodes: the job stops making progress with a log line per retry
    and /healthz says degraded; restarted, the job resumes by itself (same pid).

Run with ``-s`` for the figures. ``test_history_on_an_existing_cluster`` runs the
non-destructive half (replay, writers, checker, verify) against a cluster that
``FANOUT_API_URL``, ``KAFKA_BOOTSTRAP``, ``FANOUT_STORE`` and ``FANOUT_SPARK_MASTER``
name, and is skipped without them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from infra import webclient
from infra.checks.checker import History, Report, Workload, check, log_ends, read_stats
from infra.stack.stack import Stack
from ingest.events import TWEETS
from ingest.settings import KafkaSettings
from serving.callers import mint
from tests.support.paths import ROOT
from tests.support.process import wait_for
from tests.support.stack import Run, users_checked
from views.stores import store_from_url

pytestmark = [pytest.mark.xdist_group("stack"),
              pytest.mark.spark, pytest.mark.broker, pytest.mark.e2e]

USERS, FOLLOWS, TWEETS_PER_HISTORY = 200, 2000, 1000
#: Generated histories start now (the API's writers post as the same users, and the
#: job dead-letters a post days older than its author's newest), span this long and
#: replay this much faster: ~43 s each, through the fault and the `fanout up` after it
#: (18-41 s from the kill here).
SPAN_DAYS, SPEEDUP = 0.01, 20
#: The Kafka leader's fault is the shortest (~18 s, the failover and `up`): its
#: history's span, a replay of ~30 s.
LEADER_SPAN_DAYS = 0.007
_ENV_OUT = ("KAFKA_BOOTSTRAP", "SPARK_MASTER")


def _env() -> dict[str, str]:
    """This process's environment without anything that would point ``fanout`` elsewhere."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("FANOUT_") and k not in _ENV_OUT}


def fanout(run_dir: Path, *args: str, timeout: float = 600,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``fanout --run-dir RUN ARGS...``; fail with its output if it fails."""
    result = subprocess.run([sys.executable, "-m", "infra.cli", "--run-dir", str(run_dir), *args],
                            cwd=ROOT, env=env or _env(), capture_output=True, text=True,
                            timeout=timeout, check=False)
    assert result.returncode == 0, (f"fanout {' '.join(args)} exited {result.returncode}:\n"
                                    f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


@pytest.fixture(scope="module")
def run(three_nodes: Run) -> Run:
    """The package's three-node stack (tests/stack/nodes/conftest.py), shared with
    ``test_partitions.py``: each scenario here leaves it whole again (``fanout up``)."""
    return three_nodes


@pytest.fixture(scope="module")
def stack(run: Run) -> Stack:
    loaded = Stack.load(run.run_dir)
    assert loaded is not None
    return loaded


def _current(stack: Stack) -> Stack:
    loaded = Stack.load(Path(stack.run_dir))
    assert loaded is not None
    return loaded


def _kafka(stack: Stack) -> KafkaSettings:
    return KafkaSettings(bootstrap=stack.bootstrap, partitions=stack.partitions,
                         topic_prefix=stack.topic_prefix)


def _secret(stack: Stack) -> bytes:
    return stack.env().get("FANOUT_AUTH_SECRET", "").encode()


def _status(stack: Stack) -> dict[str, str]:
    shown = subprocess.run([sys.executable, "-m", "infra.cli", "--run-dir", stack.run_dir,
                            "status"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                           timeout=60, check=False)
    return dict(json.loads(shown.stdout)["services"])


@dataclass
class Scenario:
    """One fault's history, replay and figures."""

    name: str
    run: Run
    stack: Stack
    seed: int
    history: History
    workload: Workload
    replay: subprocess.Popen[str]
    fault: tuple[float, float] = (0.0, 0.0)


@pytest.fixture
def begun() -> Iterator[list[Scenario]]:
    """The scenarios a test began; their writers and replay end with the test, pass or fail."""
    started: list[Scenario] = []
    yield started
    for s in started:
        s.workload.stop()
        if s.replay.poll() is None:
            s.replay.kill()
            s.replay.communicate(timeout=60)


def _begin(run: Run, stack: Stack, name: str, seed: int, tmp_path: Path,
           begun: list[Scenario], span_days: float = SPAN_DAYS) -> Scenario:
    """Generate a history, start the workload, then the paced replay of the history."""
    out = tmp_path / f"history-{seed}"
    run.fanout("generate", "--out", str(out), "--users", str(USERS),
           "--follows", str(FOLLOWS), "--tweets", str(TWEETS_PER_HISTORY), "--seed", str(seed),
           "--start", str(int(time.time() * 1000)), "--span-days", str(span_days),
           "--mix", "posts")
    kafka = _kafka(stack)
    history = History()
    history.start_offsets = log_ends(kafka.bootstrap, kafka.topic(TWEETS))
    secret = _secret(stack)
    workload = Workload(stack.api_url, list(range(1, USERS + 1)), history,
                        lambda u: mint(u, secret, 3600), write_every=0.1, read_every=0.1,
                        seed=seed).start()
    replay = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "--run-dir", stack.run_dir, "replay", str(out),
         "--speedup", str(SPEEDUP), "--no-progress", "--max-failures", "-1"],
        cwd=ROOT, env=run.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    begun.append(scenario := Scenario(name, run, stack, seed, history, workload, replay))
    return scenario


def _finish(s: Scenario) -> Report:
    """Stop the workload, wait for the replay, the job to catch up, check, verify."""
    s.workload.stop()
    out, _ = s.replay.communicate(timeout=300)
    assert s.replay.returncode == 0, f"the replay failed:\n{out[-3000:]}"
    stack = _current(s.stack)
    kafka = _kafka(stack)
    began = time.monotonic()
    verified = s.run.fanout("verify", "--wait", "420", timeout=600)
    caught_up = time.monotonic() - began
    with store_from_url(stack.store_url, cap=800) as store:
        report = check(s.history, kafka.bootstrap, kafka.topic(TWEETS), store)
    during = read_stats(s.history.reads, *s.fault)
    print(f"\n[{s.name}] {report.render()}\n[{s.name}] reads during the fault "
          f"({s.fault[1] - s.fault[0]:.1f}s): {during.render()}; all reads: "
          f"{read_stats(s.history.reads).render()}; verify after {caught_up:.0f}s: "
          f"{verified.stdout.strip().splitlines()[-1]}")
    assert report.ok, report.render()
    assert report.acknowledged > 20, f"too few writes answered 202: {report.render()}"
    assert "divergent" in verified.stdout
    assert users_checked(verified.stdout) > 0, verified.stdout
    return report


def _kill(stack: Stack, name: str) -> int:
    pid = stack.pids[name]
    assert stack.running(name), f"{name} is not running before the fault"
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not stack.running(name), 30, f"{name} (pid {pid}) to die")
    return pid


def _acked_since(history: History, since: float) -> int:
    return sum(1 for op in history.writes if op.status == 202 and op.began >= since)


def _leaders(stack: Stack) -> Counter[int]:
    """Partitions of the stack's topics that each broker leads."""
    from confluent_kafka.admin import AdminClient

    kafka = _kafka(stack)
    topics = AdminClient({"bootstrap.servers": stack.bootstrap}).list_topics(timeout=10).topics
    return Counter(p.leader for t in kafka.physical_topics() for p in topics[t].partitions.values())


# -- the scenarios, in order (pytest runs a module's tests in file order) -------------------

@pytest.mark.timeout(1500)  # includes starting the module's stack
def test_every_cassandra_node_knows_the_ring_and_the_keyspace(stack):
    """Once ``up`` returns, each node lists the other two and has the schema: a keyspace
    created while a node did not yet know the ring counted one node, and another node
    then refused ``USE`` of it."""
    from infra.services.cassandraring import node_cluster
    from views.stores.cassandra.config import parse_url

    config = parse_url(stack.store_url)
    assert len(config.hosts) == 3
    for host in config.hosts:
        cluster = node_cluster(host, config.port)
        try:
            session = cluster.connect()
            peers = {str(r.peer) for r in session.execute("SELECT peer FROM system.peers_v2")}
            tables = {r.table_name for r in session.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s",
                (config.keyspace,))}
        finally:
            cluster.shutdown()
        assert peers == set(config.hosts) - {host}, f"{host} knows peers {sorted(peers)}"
        assert {"schema_version", "home_chunks"} <= tables, f"{host} has tables {sorted(tables)}"


@pytest.mark.timeout(900)
def test_a_kafka_leader_killed(run, stack, tmp_path, begun):
    s = _begin(run, stack, "kafka leader", 1, tmp_path, begun, LEADER_SPAN_DAYS)
    job_pid = stack.pids["job"]
    wait_for(lambda: _acked_since(s.history, 0) >= 20, 60, "writes before the fault")
    leaders = _leaders(stack)
    node, led = leaders.most_common(1)[0]
    killed_at = time.time()
    _kill(stack, f"kafka-{node}")
    wait_for(lambda: _acked_since(s.history, killed_at + 1) >= 10, 120,
             "writes answered 202 after the failover")
    after = _leaders(stack)
    assert node not in after, f"broker {node} still leads partitions: {after}"
    time.sleep(5)
    run.fanout("up", timeout=600)
    s.fault = (killed_at, time.time())
    report = _finish(s)
    held = max((op.took for op in s.history.writes
                if op.status == 202 and killed_at - 1 <= op.began <= killed_at + 30), default=0)
    print(f"[kafka leader] broker {node} led {led} of {sum(leaders.values())} partitions; "
          f"leaders after: {dict(after)}; longest 503 window {report.longest_refusal():.1f}s; "
          f"slowest 202 around the kill {held:.1f}s")
    assert _current(stack).pids["job"] == job_pid, "the job must survive a broker's death"
    nodes = {k: v for k, v in _status(stack).items() if k.startswith(("kafka-", "cassandra-"))}
    assert set(nodes.values()) == {"running"}, f"`fanout status` after `up`: {nodes}"


def _one_read(stack: Stack, host: str, level: str, tweet_ids: list[int]) -> dict[int, bool]:
    """``tweets`` rows (id -> deleted) read at ``level`` from node ``host`` alone."""
    from cassandra import ConsistencyLevel
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import WhiteListRoundRobinPolicy

    from views.stores.cassandra.config import parse_url

    config = parse_url(stack.store_url)
    profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([host]),
                               consistency_level=ConsistencyLevel.name_to_value[level],
                               request_timeout=30)
    cluster = Cluster([host], port=config.port, execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                      protocol_version=5)
    try:
        session = cluster.connect(config.keyspace)
        query = session.prepare("SELECT tweet_id, deleted FROM tweets WHERE tweet_id IN ?")
        rows: dict[int, bool] = {}
        for i in range(0, len(tweet_ids), 100):
            rows.update((r.tweet_id, bool(r.deleted))
                        for r in session.execute(query, [tweet_ids[i:i + 100]]))
        return rows
    finally:
        cluster.shutdown()


def _cassandra_hosts(stack: Stack) -> list[str]:
    """The Cassandra nodes' addresses, node 1 first (loopback aliases, or the hosts')."""
    from views.stores.cassandra.config import parse_url

    return list(parse_url(stack.store_url).hosts)


def _hint_lines(stack: Stack, target: str) -> int:
    """Lines of the other nodes' logs saying hints went to ``target``."""
    count = 0
    for path in Path(stack.run_dir, "logs").glob("cassandra-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if "hint" in line.lower() and target in line and "Finished" in line:
                count += 1
    return count


@pytest.mark.timeout(900)
def test_b_one_cassandra_node_killed(run, stack, tmp_path, begun):
    stack = _current(stack)
    s = _begin(run, stack, "one cassandra node", 2, tmp_path, begun)
    job_pid = stack.pids["job"]
    wait_for(lambda: _acked_since(s.history, 0) >= 20, 60, "writes before the fault")
    killed_at = time.time()
    _kill(stack, "cassandra-3")
    time.sleep(25)  # the job and the readers on two nodes of three
    during = read_stats(s.history.reads, killed_at)
    run.fanout("up", timeout=600)
    s.fault = (killed_at, time.time())
    report = _finish(s)
    acked = [op.tweet_id for op in s.history.writes if op.status == 202]
    first, _, third = _cassandra_hosts(stack)
    quorum = _one_read(stack, first, "LOCAL_QUORUM", acked)
    began = time.monotonic()
    wait_for(lambda: _one_read(stack, third, "ONE", acked) == quorum, 180,
             "node 3 read at ONE to agree with the quorum")
    print(f"[one cassandra node] reads while it was down: {during.render()}; node 3 agreed at "
          f"ONE after {time.monotonic() - began:.1f}s more; hint deliveries logged: "
          f"{_hint_lines(stack, third)}")
    assert len(quorum) == len(acked), "acknowledged tweets are missing at quorum"
    assert during.errors == 0, f"readers saw errors with one node down: {during.render()}"
    assert _current(stack).pids["job"] == job_pid, "the job must survive one node's death"
    assert report.ok


@pytest.mark.timeout(900)
def test_c_spark_worker_killed(run, stack, tmp_path, begun):
    from infra.stack.multinode import SparkWorkers

    stack = _current(stack)
    job_pid = stack.pids["job"]
    cluster = SparkWorkers.of(Path(stack.run_dir), stack.spark_master)
    cluster._pids = {n.removeprefix("spark-"): p for n, p in stack.pids.items()
                     if n.startswith("spark-")}
    wait_for(lambda: cluster.executors_of("worker-1") and cluster.executors_of("worker-2"), 60,
             "an executor on each worker")
    survivor = cluster.executors_of("worker-2")
    s = _begin(run, stack, "spark worker", 3, tmp_path, begun)
    wait_for(lambda: _acked_since(s.history, 0) >= 20, 60, "writes before the fault")
    executors = cluster.executors_of("worker-1")
    killed_at = time.time()
    _kill(stack, "spark-worker-1")
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in executors), 60,
             f"the executors {executors} of the killed worker to exit")
    time.sleep(20)
    assert cluster.executors_of("worker-2") == survivor, "the other worker's executor changed"
    run.fanout("up", timeout=600)
    s.fault = (killed_at, time.time())
    _finish(s)
    log = Path(stack.run_dir, "logs", "job.log").read_text(errors="replace")
    print(f"[spark worker] executors {executors} lost with worker-1; {survivor} on worker-2 "
          f"carried on; the driver logged {log.count('Lost executor')} executor loss(es)")
    assert _current(stack).pids["job"] == job_pid, "the driver must survive a worker's death"


def _retry_lines(stack: Stack) -> int:
    """The job's lines saying a Cassandra request (or opening the store) is retried.

    The writes run in the executors, so their lines are in the executors' logs in the
    Spark workers' directory; the driver's are in the job's log.
    """
    run_dir = Path(stack.run_dir)
    paths = [run_dir / "logs" / "job.log", *run_dir.glob("spark/work/*/*/stderr")]
    return sum(text.count("running them again in") + text.count("opening the store failed")
               for text in (p.read_text(errors="replace") for p in paths if p.exists()))


@pytest.mark.timeout(1500)  # includes starting the module's stack when run alone
def test_d_two_cassandra_nodes_killed(run, stack, tmp_path, begun):
    stack = _current(stack)
    s = _begin(run, stack, "two cassandra nodes", 4, tmp_path, begun)
    job_pid = stack.pids["job"]
    retries_before = _retry_lines(stack)
    wait_for(lambda: _acked_since(s.history, 0) >= 20, 60, "writes before the fault")
    killed_at = time.time()
    _kill(stack, "cassandra-2")
    _kill(stack, "cassandra-3")

    body: dict[str, str] = {}

    def health() -> int:
        # The probe is a quorum read: with the replicas' deaths not yet noticed, the
        # coordinator waits out its read timeout before saying so.
        try:
            answer = webclient.get(f"{stack.api_url}/healthz", timeout=30)
        except httpx.HTTPError:
            return 0
        if answer.status_code == 503:
            body.update(answer.json())
        return answer.status_code

    wait_for(lambda: health() == 503, 90, "/healthz to say degraded")
    wait_for(lambda: _retry_lines(stack) > retries_before + 1, 180,
             "the job to log its retries")
    time.sleep(10)
    retries = _retry_lines(stack) - retries_before
    assert _current(stack).running("job"), "the job must wait for a quorum, not exit"
    run.fanout("up", timeout=600)
    s.fault = (killed_at, time.time())
    _finish(s)
    print(f"[two cassandra nodes] /healthz said {body.get('status')}: {body.get('message')}; "
          f"the job logged {retries} retries, one line each")
    assert body["status"] == "degraded"
    assert _current(stack).pids["job"] == job_pid, "the job must resume by itself"


# -- against a cluster that is already there -------------------------------------------

_EXTERNAL = ("FANOUT_API_URL", "KAFKA_BOOTSTRAP", "FANOUT_STORE", "FANOUT_SPARK_MASTER")


@pytest.mark.skipif(not all(os.environ.get(v) for v in _EXTERNAL),
                    reason=f"set {', '.join(_EXTERNAL)} (and FANOUT_AUTH_SECRET if its API "
                           "checks tokens) to run the history against an existing cluster")
@pytest.mark.timeout(600)
def test_history_on_an_existing_cluster(tmp_path):
    env = dict(os.environ)
    run_dir = tmp_path / "none"  # no stack: every fanout command takes the environment
    kafka = KafkaSettings.from_env(env)
    out = tmp_path / "history"
    fanout(run_dir, "generate", "--out", str(out), "--users", str(USERS), "--follows",
           str(FOLLOWS), "--tweets", str(TWEETS_PER_HISTORY), "--seed", "9", "--start",
           str(int(time.time() * 1000)), "--span-days", str(SPAN_DAYS), "--mix", "posts",
           env=env)
    history = History()
    history.start_offsets = log_ends(kafka.bootstrap, kafka.topic(TWEETS))
    secret = env.get("FANOUT_AUTH_SECRET", "").encode()
    token: Callable[[int], str | None] = (lambda u: mint(u, secret, 3600)) if secret else (
        lambda _u: None)
    with Workload(env["FANOUT_API_URL"], list(range(1, USERS + 1)), history, token):
        fanout(run_dir, "replay", str(out), "--speedup", str(SPEEDUP), "--no-progress",
               env=env)
    verified = fanout(run_dir, "verify", "--wait", "300", env=env, timeout=600)
    with store_from_url(env["FANOUT_STORE"], cap=800) as store:
        report = check(history, kafka.bootstrap, kafka.topic(TWEETS), store)
    print(f"\n[existing cluster] {report.render()}; reads: "
          f"{read_stats(history.reads).render()}; {verified.stdout.strip().splitlines()[-1]}")
    assert report.ok, report.render()
