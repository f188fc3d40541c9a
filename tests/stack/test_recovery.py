"""Recovering the local stack as a user would, with the ``fanout`` commands only.

One stack (Kafka, the view job, the API) in one run directory, driven through
``fanout up``/``down``/``replay``/``verify`` as subprocesses — the README's
"Recovering" section, typed by hand:

- (a) the job SIGKILLed mid-replay, then ``fanout up``;
- (b) Kafka SIGKILLed mid-replay while the API takes writes, then ``fanout up``: every
  write answered 202 is in the log and in the views;
- (c) ``fanout down`` and ``fanout up`` twice during a replay: nothing lost or doubled;
- (d) every process of the stack SIGKILLed (a reboot), then ``fanout up``.

After each, ``fanout verify`` must report 0 divergent users. Through (a), and through
(e) and (f) on a Cassandra stack (the node, then the job SIGKILLed), live home streams
are held by :class:`infra.checks.checker.StreamHolder` clients that drop and resume with
``Last-Event-ID`` at random: each one's page must end equal to the first page ``/home``
serves (which verify holds to the SQL), with 0 missed, duplicated and phantom events. Every service carries a
``FANOUT_FAULT_TAG`` in its environment (the stack hands its settings to each), so
the test finds all of a stack's processes — JVMs and Python workers included — and
checks that none is left at the end.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from infra import webclient
from infra.checks.checker import History, StreamHolder, Workload, check, check_streams, log_ends
from infra.demo import live_event
from infra.stack.stack import Stack
from ingest.events import TWEETS
from ingest.history import iter_events
from ingest.settings import KafkaSettings
from tests.support.process import tagged, wait_for
from tests.support.stack import CAP, REPLAY_S, Run, finish, kill, speedup_of, tree
from views.changelog import read_changelog
from views.settings import CHECKPOINT_DIR_ENV
from views.stores import store_from_url
from views.stores.sqlite import SQLiteStore

pytestmark = [pytest.mark.xdist_group("stack"),
              pytest.mark.e2e, pytest.mark.spark]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("recovery")
    state = Run(root, root / "history")
    state.fanout("generate", "--out", str(state.history), "--users", "400", "--follows",
                 "6000", "--tweets", "6000", "--seed", "11")
    try:
        yield state
    finally:
        state.down_leaving_nothing()


#: Users whose home streams are held (the most followed of the generated histories'
#: first ids), and the page each holds.
STREAMED, STREAM_LIMIT = range(1, 13), 20


def _hold_streams(run: Run) -> list[StreamHolder]:
    """Stream clients on the stack's API that drop and resume with Last-Event-ID."""
    api = run.stack()["api_url"]
    return [StreamHolder(api, user, None, limit=STREAM_LIMIT, drop_every=4, seed=user).start()
            for user in STREAMED]


def _streams_exact(holders: list[StreamHolder]) -> None:
    """Every held page ends equal to ``/home``'s first page: nothing missed or repeated."""
    try:
        report = check_streams(holders, wait=120)
    finally:
        for holder in holders:
            holder.stop()
        for holder in holders:
            holder.join(20)
    print(f"\nlive streams: {report.render()}")
    assert report.ok, report.render()
    assert report.events > 0 and report.resumes > 0, report.render()


def test_a_job_killed_mid_replay_resumes_on_up(run: Run) -> None:
    run.fanout("up")
    holders = _hold_streams(run)
    speedup = speedup_of(run.history)
    replay = run.replay(speedup)
    time.sleep(REPLAY_S / 3)
    job = run.stack()["pids"]["job"]
    # The job's temporary files are in its checkpoint, not /tmp (its block manager's
    # directory, say); a SIGKILL leaves them, and the next incarnation clears them.
    stack = Stack.load(run.run_dir)
    assert stack is not None
    scratch = Path(stack.env()[CHECKPOINT_DIR_ENV]) / "tmp"
    killed = {p.name for p in scratch.glob("blockmgr-*")}
    assert killed, f"no block manager directory in {scratch}: {sorted(scratch.glob('*'))}"
    kill(tree(job))  # the job and its JVM and Python workers, as an OOM kill could
    status = run.fanout("status", check=False)
    assert '"job": "stopped"' in status.stdout and status.returncode == 1
    finish(replay)
    up = run.fanout("up")
    assert "job: started" in up.stdout and "broker: was running" in up.stdout, up.stdout
    assert killed.isdisjoint(p.name for p in scratch.glob("blockmgr-*")), sorted(scratch.iterdir())
    run.verify()
    _streams_exact(holders)
    with SQLiteStore(run.stack()["store_url"].removeprefix("sqlite:///"), cap=CAP) as store:
        assert live_event(run.stack()["api_url"], store), "the demo's post did not arrive live"


def test_c_down_and_up_twice_during_a_replay_lose_and_double_nothing(run: Run) -> None:
    run.fanout("up")
    before = Counter(e.topic for e in read_changelog(run.kafka()).events)
    history = Counter(e.topic for e in iter_events(run.history))
    replay = run.replay(speedup_of(run.history))
    for _ in range(2):
        time.sleep(REPLAY_S / 4)
        down = run.fanout("down")
        assert "broker" in down.stdout and "fanout up" in down.stdout, down.stdout
        run.fanout("up")
    finish(replay)
    after = Counter(e.topic for e in read_changelog(run.kafka()).events)
    assert after - before == history, (after - before, history)  # each event exactly once
    run.verify()


@dataclass
class Writes:
    """What the API accepted (202 with a token) while the broker was killed."""

    tweets: set[int] = field(default_factory=set)
    follows: set[tuple[int, int]] = field(default_factory=set)
    outcomes: Counter[int | str] = field(default_factory=Counter)


def _write(base: str, user: int, stop: threading.Event, out: Writes) -> None:
    with webclient.client(base_url=base, timeout=15, headers={"X-User-Id": str(user)}) as client:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                if i % 2:
                    response = client.post("/v1/tweets", json={"text": f"u{user} #{i}"})
                else:
                    response = client.put(f"/v1/users/{user}/following/{(user + i) % 400 + 1}")
            except httpx.TransportError:
                out.outcomes["transport"] += 1
                time.sleep(0.2)
                continue
            out.outcomes[response.status_code] += 1
            if response.status_code == 202 and i % 2:
                out.tweets.add(int(response.json()["tweet_id"]))
            elif response.status_code == 202:
                out.follows.add((user, (user + i) % 400 + 1))
            time.sleep(0.05 if response.status_code == 202 else 0.3)


def test_b_kafka_killed_mid_replay_while_the_api_takes_writes(run: Run) -> None:
    run.fanout("up")
    base = run.stack()["api_url"]
    out, stop = Writes(), threading.Event()
    writers = [threading.Thread(target=_write, args=(base, u, stop, out)) for u in (7, 8)]
    for thread in writers:
        thread.start()
    try:
        replay = run.replay(speedup_of(run.history))
        time.sleep(REPLAY_S / 3)
        broker = run.stack()["pids"]["broker"]
        kill([broker])
        wait_for(lambda: out.outcomes[503] > 0, 60, "the API to refuse writes with 503")
        up = run.fanout("up")
        assert "broker: started" in up.stdout and "job: was running" in up.stdout, up.stdout
        accepted = out.outcomes[202]
        wait_for(lambda: out.outcomes[202] > accepted + 5, 120,
                 "the API to accept writes again once Kafka is back")
        finish(replay)
    finally:
        stop.set()
        for thread in writers:
            thread.join(60)
    assert out.outcomes[503] > 0 and out.outcomes[202] > 0, out.outcomes
    logged = read_changelog(run.kafka()).events
    tweets = {e.tweet_id for e in logged if e.topic == "tweets"}
    follows = {(e.follower_id, e.followee_id) for e in logged if e.topic == "follows"}
    assert out.tweets <= tweets and out.follows <= follows  # every 202 is in the log
    run.verify()
    with SQLiteStore(run.run_dir / "fanout.sqlite", cap=CAP) as store:
        assert set(store.tweets(sorted(out.tweets))) == out.tweets  # and in the views
        followed = {(u, a) for u in (7, 8) for a in store.followees(u)}
        # Accepted follows may have been undone by the history since: check the live ones.
        live = {edge for edge in out.follows if edge in followed}
        assert live, "no accepted follow is in the views"
    print(f"\nwrites while Kafka was killed and brought back: {dict(out.outcomes)}")


def test_d_every_process_killed_like_a_reboot_then_up(run: Run) -> None:
    run.fanout("up")
    replay = run.replay(speedup_of(run.history))
    time.sleep(REPLAY_S / 3)
    everything = tagged(run.tag)
    assert len(everything) >= 4, everything  # Kafka, the job (+ its JVM), the API
    kill(everything)
    wait_for(lambda: not tagged(run.tag), 30, "every process of the stack to die")
    replay.wait(60)  # it may fail or finish: the broker died under it
    up = run.fanout("up")
    # Kafka, the job, the API and the live verifier: every service of the stack again.
    assert up.stdout.count("started") == 4, up.stdout
    finish(run.replay(None))  # the interrupted replay again: duplicates change nothing
    run.verify()


# -- the same stack on a local Cassandra node ----------------------------------------------

@pytest.fixture(scope="module")
def cassandra_run(run: Run) -> Iterator[Run]:
    """A second stack, ``fanout up --store cassandra``, replaying the same history.

    The SQLite stack is down first (checked: nothing of it left): its job, API and live
    verifier would otherwise take the two cores' time while the Cassandra node starts
    and the kills play out."""
    run.down_leaving_nothing()
    state = Run(run.root / "cassandra", run.history)
    try:
        yield state
    finally:
        state.down_leaving_nothing()


def test_e_cassandra_killed_mid_replay_the_job_rides_it_out(cassandra_run: Run) -> None:
    """SIGKILL the node: reads 503 with Retry-After, health degraded, the job retries
    (its writes and its session wait for the node); `fanout up` brings the node back,
    the job carries on (never restarted) and the views verify."""
    run = cassandra_run
    first = run.fanout("up", "--store", "cassandra", timeout=600)
    assert "cassandra: started" in first.stdout, first.stdout
    base = run.stack()["api_url"]
    holders = _hold_streams(run)
    replay = run.replay(speedup_of(run.history))
    time.sleep(REPLAY_S / 3)
    kill([run.stack()["pids"]["cassandra"]])

    def refused() -> httpx.Response | None:
        try:
            response = webclient.get(f"{base}/v1/users/3/tweets", timeout=30)
        except httpx.TransportError:
            return None
        return response if response.status_code == 503 else None

    response = wait_for(refused, 120, "reads to answer 503 while Cassandra is down")
    assert isinstance(response, httpx.Response)
    assert int(response.headers["Retry-After"]) > 0 and response.json()["error"] == "unavailable"
    health = webclient.get(f"{base}/healthz", timeout=30)
    assert health.status_code == 503 and health.json()["status"] == "degraded", health.text
    again = run.fanout("up", timeout=600)
    assert "cassandra: started" in again.stdout and "job: was running" in again.stdout, \
        again.stdout
    finish(replay)
    run.verify()
    wait_for(lambda: webclient.get(f"{base}/healthz", timeout=30).status_code == 200, 60,
             "the API to find the store again (its driver tries every 10 s at most)")
    _streams_exact(holders)
    # Whether a write landed in the outage depends on where the job was; the retry and
    # its log line are checked in tests/views/stores/test_executor_sink.py.
    job_log = (run.run_dir / "logs" / "job.log").read_text(errors="replace")
    print(f"\njob log lines about retried Cassandra writes: {job_log.count('running them again')}"
          f", about a reconnect: {job_log.count('no Cassandra node answers')}")


def test_f_cassandra_job_killed_while_the_api_takes_writes_and_holds_streams(
        cassandra_run: Run) -> None:
    """SIGKILL the job on the Cassandra stack while posts are acknowledged and streams
    held; `fanout up` starts it again: every 202 is in the log and the store, the
    views verify and every stream's page is exact."""
    run = cassandra_run
    stack = run.stack()
    kafka = KafkaSettings(bootstrap=stack["bootstrap"], partitions=stack["partitions"],
                          topic_prefix=stack["topic_prefix"])
    history = History()
    history.start_offsets = log_ends(kafka.bootstrap, kafka.topic(TWEETS))
    holders = _hold_streams(run)
    workload = Workload(stack["api_url"], list(STREAMED), history, lambda _: None,
                        writers=2, readers=1, write_every=0.2, read_every=0.2, seed=6).start()
    try:
        wait_for(lambda: sum(op.status == 202 for op in history.writes) >= 20, 120,
                 "20 posts answered 202 before the kill")
        kill(tree(stack["pids"]["job"]))
        time.sleep(5)  # posts go on into the log while no job runs
        up = run.fanout("up", timeout=600)
        assert "job: started" in up.stdout, up.stdout
        after_up = time.time()
        wait_for(lambda: sum(op.status == 202 and op.began >= after_up
                             for op in history.writes) >= 5, 120, "posts after `fanout up`")
    finally:
        workload.stop()
    run.verify()
    with store_from_url(stack["store_url"], cap=CAP) as store:
        report = check(history, kafka.bootstrap, kafka.topic(TWEETS), store)
    print(f"\n{report.render()}")
    assert report.ok and report.acknowledged >= 25, report.render()
    _streams_exact(holders)
