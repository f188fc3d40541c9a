r"""Locust users for fanout: home-timeline readers and writers, timed with HdrHistograms.

Run it as any locustfile (web UI, ``--headless``, ``--master``/``--worker``,
``--processes``)::

    locust -f loadgen/locustfile.py --host http://127.0.0.1:8080
    locust -f loadgen/locustfile.py --headless -u 50 -r 50 -t 60s --host ... \\
        --fanout-rate 200 --fanout-out reports/manual

Each user repeats one action drawn from the mix (``--fanout-profile``; see
:mod:`loadgen.workload`), as users drawn Zipf-like by activity (``--fanout-users`` or
``--fanout-workload``). Closed loop by default, as Locust is; with
``--fanout-rate R`` the process's users share an open-loop schedule of R actions/s
(:mod:`loadgen.openloop`) and each request is timed from its intended send time.
Each ``--fanout-*`` flag falls back to its ``LOCUST_FANOUT_*`` variable, then to its
default (:class:`loadgen.settings.LocustSettings`); a master's settings are its workers'.

Every request's latency goes into HdrHistograms through Locust's ``request`` event
(:mod:`loadgen.recording`); workers ship them encoded to the master with their
regular reports, and the master adds them up. With ``--fanout-out DIR`` the local
runner or the master writes ``hdr.json`` (everything recorded) and, every second,
``live.json`` (progress); at the end it logs a percentile table. The figures in
Locust's own UI are Locust's rounded ones, timed from the actual send.

An answer that a call lists as expected (a deleted account's timeline answers 404;
see :mod:`loadgen.action`) is a success for Locust and the histograms, is counted
apart (:class:`~loadgen.summary.Expected`, shipped and saved beside the histograms),
and tells the user's planner, which stops acting as a deleted account. Each process
learns of a deletion made by another from such an answer.

Writes need the acting user's bearer token when the API has auth on: pass a tokens
file (``fanout load`` writes one) or the API's secret; with auth off the acting user
travels in ``X-User-Id``.

**Live streams.** :class:`StreamUser` holds a reader's live home stream, leaves and
resumes with ``Last-Event-ID`` (:mod:`loadgen.streamer`); ``--fanout-streams`` of the
``-u`` users are stream users (Locust's ``fixed_count``; by default the profile's
share, 10% in ``social``, none in the others); the rest are timeline users
(:class:`TimelineUser`), acting as before. Push latency — a load user's post
accepted (202) → its ``add`` at a follower's stream — is joined from both ends
wherever they were seen (:mod:`loadgen.push`): every process records its accepts
and receipts, workers ship them to the master with their reports, and the process
that writes ``hdr.json`` matches them by tweet id. ``hdr.json`` then holds ``push`` (the matched samples, with
their writers) and ``streams`` (connects, events, resets, cut-offs, open streams over
time), and ``meta.celebrities`` when the workload or ``--fanout-celebrities`` names
them.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import gevent
import orjson
from locust import User, events, task
from locust.argument_parser import LocustArgumentParser
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner
from locust.user.users import LOCUST_STATE_STOPPING

from loadgen.action import GONE, POST, REPLY, Call, Memory, Planner, tweet_texts
from loadgen.bearer import mint
from loadgen.errors import LoadgenError
from loadgen.openloop import Pacer, Schedule, corrected, per_process_rate
from loadgen.push import PushLog, StreamTally
from loadgen.recording import Recorder
from loadgen.settings import SECRET_FIELD, LocustSettings
from loadgen.streamer import STREAM, Connect, Habits, StreamClient
from loadgen.summary import Expected, summarize, table
from loadgen.wire import Connection, WireError
from loadgen.workload import (
    Mix,
    Workload,
    ZipfPicker,
    load_tokens,
    parse_mix,
    parse_user_range,
)

log = logging.getLogger("fanout.loadgen")

RESULTS = "hdr.json"
LIVE = "live.json"
TOKEN_TTL = 86_400
#: Writes whose 202 starts a push-latency sample (their tweet reaches followers' streams).
PUSHED = frozenset({POST, REPLY})


@events.init_command_line_parser.add_listener
def _arguments(parser: LocustArgumentParser) -> None:
    g = parser.add_argument_group("fanout", "fanout workload (each flag falls back to the "
                                            "variable named in its help)")
    LocustSettings.add_flags(g, *(f for f in LocustSettings.model_fields if f != SECRET_FIELD))
    # On the parser itself: only its own flags show in the web UI, which masks this one.
    secret = LocustSettings.add_flags(parser, SECRET_FIELD)[SECRET_FIELD]
    secret.is_secret = True  # type: ignore[attr-defined]  # Locust's, as add_argument sets it


def settings_of(options: Any) -> LocustSettings:
    """The fanout flags of Locust's ``options`` over ``LOCUST_FANOUT_*`` over the defaults.

    A flag not given is None, and one given empty counts as not given: the web UI's
    form sends its fields back, blank where it showed a flag's default (None), and a
    blank ``--fanout-auth-secret`` must not hide ``LOCUST_FANOUT_AUTH_SECRET``.
    """
    flags = {field: getattr(options, field, None) for field in LocustSettings.model_fields}
    return LocustSettings.from_env(os.environ, **{k: v for k, v in flags.items() if v != ""})


def _masters(options: Any) -> LocustSettings:
    """A worker's settings: the master's, which its spawn message put in ``options``."""
    return LocustSettings(**{name: getattr(options, name) for name in LocustSettings.model_fields})


class _Run:
    """What one Locust process knows about the current test (reset at each start)."""

    def __init__(self) -> None:
        self.settings: LocustSettings | None = None
        self.recorder: Recorder | None = None
        self.expected = Expected()
        self.pacer: Pacer | None = None
        self.workload: Workload | None = None
        self.mix = Mix()
        self.tokens: dict[int, str] = {}
        self.memory = Memory()
        self.texts: list[str] = []
        self.think = 0.0
        self.seed = 0
        self.users_started = 0
        self.streams_started = 0  # apart, so the acting users draw as they did without
        self.meta: dict[str, Any] = {}
        self.out: Path | None = None
        self.live: gevent.Greenlet | None = None
        self.environment: Environment | None = None
        self.push = PushLog()
        self.tally = StreamTally()
        self.habits = Habits()

    def start(self, settings: LocustSettings, processes: int, index: int) -> None:
        """Build this process's workload, mix, schedule and recorder from the settings."""
        now = time.time()
        self.seed = settings.fanout_seed + 7919 * index
        self.mix = parse_mix(settings.fanout_profile)
        self.tokens = _tokens(settings)
        self.workload = _workload(settings).with_tokens(self.tokens)
        self.texts = self.texts or tweet_texts(self.seed)
        self.think = settings.fanout_think
        self.memory = Memory()
        self.pacer = _pacer(settings, now, processes, self.seed)
        self.start_recording(settings, now)

    def start_recording(self, settings: LocustSettings, now: float) -> None:
        """A fresh recorder, the results directory and the run's metadata."""
        self.settings = settings
        measure_from = now + settings.fanout_warmup
        self.recorder = Recorder(measure_from, settings.fanout_interval)
        self.expected = Expected(measure_from)
        self.push = PushLog(measure_from)
        self.tally = StreamTally(settings.fanout_interval)
        self.habits = Habits(settings.fanout_stream_limit, settings.fanout_stream_hold,
                             settings.fanout_stream_away)
        self.out = Path(settings.fanout_out) if settings.fanout_out else None
        self.meta = {"started_at": now, "measure_from": measure_from, "stopped_at": None,
                     "options": settings.recorded()}
        celebrities = _celebrities(settings)
        if celebrities is not None:
            self.meta["celebrities"] = celebrities

    def planner(self) -> Planner:
        """A planner for one more simulated user of this process."""
        if self.workload is None:
            msg = "the test has not started (no workload yet)"
            raise RuntimeError(msg)
        self.users_started += 1
        rng = random.Random(self.seed * 1_000_003 + self.users_started)
        return Planner(self.workload, self.mix, rng, self.memory, self.texts)

    def headers(self, call: Call) -> dict[str, str]:
        """Credentials of the call's actor: a bearer token, else X-User-Id (auth off)."""
        if call.actor is None:
            return {}
        token = self.tokens.get(call.actor)
        return {"Authorization": f"Bearer {token}"} if token else {"X-User-Id": str(call.actor)}

    def save(self, environment: Environment) -> None:
        """Write everything recorded to ``hdr.json`` (atomically), if an out dir is set."""
        if self.out is None or self.recorder is None:
            return
        self.meta |= {"host": environment.host, "runner": type(environment.runner).__name__}
        if not isinstance(environment.runner, MasterRunner | WorkerRunner):
            # A master joins what its workers report as it arrives; a worker's lists
            # must stay for its last report, so only a local process joins its own.
            self.push.join()
        _write_json(self.out / RESULTS, {"meta": self.meta, "recording": self.recorder.to_dict(),
                                         "expected": self.expected.to_dict(),
                                         "push": self.push.to_dict(),
                                         "streams": self.tally.to_dict()})


RUN = _Run()


def _tokens(settings: LocustSettings) -> dict[int, str]:
    if settings.fanout_tokens:
        return load_tokens(Path(settings.fanout_tokens))
    if settings.fanout_auth_secret:
        users = _workload(settings)
        secret = settings.fanout_auth_secret.encode()
        return {u: mint(u, secret, TOKEN_TTL) for u in {*users.readers, *users.authors}}
    return {}


def _workload(settings: LocustSettings) -> Workload:
    if settings.fanout_workload:
        return Workload.load(Path(settings.fanout_workload))
    lo, hi = parse_user_range(settings.fanout_users)
    return Workload.from_range(lo, hi, seed=settings.fanout_seed)


def _celebrities(settings: LocustSettings) -> list[int] | None:
    """The celebrities the settings or the workload name, or None if neither knows."""
    if settings.fanout_celebrities:
        return sorted(int(u) for u in settings.fanout_celebrities.split(",") if u.strip())
    if settings.fanout_workload:
        return Workload.load(Path(settings.fanout_workload)).celebrities or None
    return None


def _pacer(settings: LocustSettings, now: float, processes: int, seed: int) -> Pacer | None:
    if not settings.fanout_rate:
        return None
    rate = per_process_rate(settings.fanout_rate, processes)
    schedule = Schedule(rate, now, poisson=settings.fanout_arrivals == "poisson", seed=seed)
    return Pacer(schedule, time.time, gevent.sleep)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _options(environment: Environment) -> Any:
    if environment.parsed_options is None:
        msg = "Locust's options are not parsed yet (the locustfile needs them)"
        raise RuntimeError(msg)
    return environment.parsed_options


# -- Locust events ----------------------------------------------------------------------
def fresh_loop_time() -> None:
    """Bring gevent's loop clock up to now, so that timers started next count from now.

    Locust makes the hub while it imports, and the loop does not run until the test
    starts. A timer started before the loop first runs counts from the clock the loop
    was made with: ``-t 10s`` after 7 s of imports on a busy machine ended the run 3 s
    after it began. Called last in ``init``, just before Locust starts its run-time timer.
    """
    gevent.get_hub().loop.update_now()


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    RUN.environment = environment  # worker_report does not pass it
    options = environment.parsed_options
    if options is not None:
        # Decided before the first spawn, where Locust's dispatcher reads it.
        settings = settings_of(options)
        streams = settings.fanout_streams
        if streams < 0:
            streams = parse_mix(settings.fanout_profile).stream_users(int(options.num_users or 0))
        StreamUser.fixed_count = streams
        if not streams:  # Locust would give a class of no fixed count its weight's share
            environment.user_classes = [c for c in environment.user_classes
                                        if c is not StreamUser]
    fresh_loop_time()


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    options, runner = _options(environment), environment.runner
    if isinstance(runner, MasterRunner):
        # Custom options travel to the workers with each spawn message: give them the
        # master's settings, not their own environment's, and how many share the rate.
        settings = settings_of(options)
        vars(options).update(settings.model_dump())
        options.fanout_processes = max(1, runner.worker_count)
        RUN.start_recording(settings, time.time())
    elif isinstance(runner, WorkerRunner):
        RUN.start(_masters(options), int(getattr(options, "fanout_processes", 1)),
                  runner.worker_index)
    else:
        RUN.start(settings_of(options), 1, 0)
    if not isinstance(runner, WorkerRunner) and RUN.out is not None:
        RUN.live = gevent.spawn(_live, environment)


@events.request.add_listener
def _on_request(name: str, response_time: float, exception: BaseException | None,
                context: dict[str, Any] | None = None, start_time: float | None = None,
                **_: Any) -> None:
    if RUN.recorder is None:
        return
    service = response_time / 1000
    sent = start_time if start_time is not None else time.time() - service
    due = (context or {}).get("fanout_due") or sent
    RUN.recorder.record(name, due=due, done=sent + service,
                        latency=corrected(due, sent, service), service=service,
                        ok=exception is None)
    if (status := (context or {}).get("fanout_expected")) is not None:
        RUN.expected.add(name, status, due)


@events.report_to_master.add_listener
def _on_report_to_master(data: dict[str, Any], **_: Any) -> None:
    if RUN.recorder is not None:
        data["fanout"] = RUN.recorder.drain()
        data["fanout_expected"] = RUN.expected.drain()
        data["fanout_push"] = RUN.push.drain()
        data["fanout_streams"] = RUN.tally.drain()


@events.worker_report.add_listener
def _on_worker_report(data: dict[str, Any], **_: Any) -> None:
    if RUN.recorder is not None and "fanout" in data:
        RUN.recorder.merge(data["fanout"])
        RUN.expected.merge(data.get("fanout_expected", {}))
        RUN.push.merge(data.get("fanout_push", {}))
        RUN.push.join()
        RUN.tally.merge(data.get("fanout_streams", {}))
        if RUN.environment is not None:
            RUN.save(RUN.environment)  # the last reports arrive after `quitting`


@events.reset_stats.add_listener
def _on_reset_stats(**_: Any) -> None:
    if RUN.recorder is not None:
        RUN.recorder.reset()
        RUN.expected.drain()


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_: Any) -> None:
    RUN.meta["stopped_at"] = time.time()
    if RUN.live is not None:
        RUN.live.kill(block=False)
        RUN.live = None
    RUN.save(environment)


@events.quitting.add_listener
def _on_quitting(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner) or RUN.recorder is None:
        return
    RUN.meta["stopped_at"] = RUN.meta.get("stopped_at") or time.time()
    RUN.save(environment)
    seconds = RUN.meta["stopped_at"] - RUN.meta["measure_from"]
    log.info("HdrHistogram latencies (ms, timed from the %s send time):\n%s",
             "intended" if RUN.settings and RUN.settings.fanout_rate else "actual",
             table(summarize(RUN.recorder, max(seconds, 1e-9), RUN.expected.to_dict())))


def _live(environment: Environment) -> None:
    """Every second: progress to ``live.json``; stop at ``--fanout-max-requests``."""
    bound = RUN.settings.fanout_max_requests if RUN.settings else 0
    while RUN.recorder is not None and RUN.out is not None:
        count = RUN.recorder.count()
        _write_json(RUN.out / LIVE, {
            "now": time.time(), "started_at": RUN.meta["started_at"],
            "measure_from": RUN.meta["measure_from"], "count": count,
            "errors": sum(RUN.recorder.errors.values()), "warmup": RUN.recorder.warmup,
            "late": RUN.pacer.late if RUN.pacer else 0,
            "users": environment.runner.user_count if environment.runner else 0})
        if bound and count >= bound and environment.runner is not None:
            log.info("--fanout-max-requests %d reached: stopping", bound)
            environment.runner.quit()
            return
        gevent.sleep(1.0)


# -- the simulated user -------------------------------------------------------------------
class TimelineUser(User):
    """Reads home timelines (paging on now and then) and writes, in the configured mix.

    Each user keeps one keep-alive connection (:class:`loadgen.wire.Connection`, lean
    enough that the generator is not what gets measured) and reports every request to
    Locust's ``request`` event, as Locust's own HTTP users do: Locust's statistics and
    the HdrHistograms (:func:`_on_request`) both see it.
    """

    network_timeout = 30.0
    connection_timeout = 10.0

    def wait_time(self) -> float:
        """No wait in the open loop (the pacer waits); the think time in the closed one."""
        return 0.0 if RUN.pacer is not None else random.uniform(0, 2 * RUN.think)

    def on_start(self) -> None:
        self.planner = RUN.planner()
        if self.host is None:
            msg = "no host to load: pass --host (fanout load passes its target)"
            raise LoadgenError(msg)
        self.connection = Connection(self.host, connect_timeout=self.connection_timeout,
                                     timeout=self.network_timeout)

    def on_stop(self) -> None:
        self.connection.close()

    @task
    def act(self) -> None:
        """One action: wait for its slot (open loop), send, follow up on the answer."""
        due = RUN.pacer.acquire() if RUN.pacer is not None else None
        call: Call | None = self.planner.next_call()
        pages = 0
        while call is not None:
            pages += 1
            status, body = self._send(call, due, self.planner.needs_body(call, pages))
            if status in call.expected:
                self.planner.refused(call, status)
                return
            call, due = self.planner.answered(call, body, pages), None

    def _send(self, call: Call, due: float | None,
              decode: bool) -> tuple[int, dict[str, Any] | None]:
        """Send ``call``; (status, body), status 0 when nothing answered.

        The body is the decoded JSON (``decode``), else {} for any 2xx; None when the
        request failed or was an expected refusal.
        """
        context: dict[str, Any] = {"fanout_due": due} if due is not None else {}
        payload = orjson.dumps(call.body) if call.body is not None else None
        start_time, start = time.time(), time.perf_counter()
        status, raw = 0, b""
        failure: Exception | None = None
        try:
            status, raw = self.connection.request(call.method, call.url(), RUN.headers(call),
                                                  payload)
        except WireError as exc:
            failure = exc
        parsed: Any = None
        if failure is None and status in call.expected:
            context["fanout_expected"] = status
        elif failure is None:
            parsed, failure = _parsed(status, raw, decode)
        elapsed = time.perf_counter() - start
        if call.name in PUSHED and isinstance(parsed, dict) and "tweet_id" in parsed:
            RUN.push.accept(int(parsed["tweet_id"]), start_time + elapsed, call.actor or 0)
        self.environment.events.request.fire(
            request_type=call.method, name=call.name, start_time=start_time,
            response_time=elapsed * 1000, response_length=len(raw),
            response=None, context=context, exception=failure)
        return status, parsed if isinstance(parsed, dict) else None


def _parsed(status: int, raw: bytes, decode: bool) -> tuple[Any, Exception | None]:
    """(body, failure) of an answer: the decoded JSON (``decode``) or {}, if 2xx."""
    if not 200 <= status < 300:
        return None, ResponseError(f"HTTP {status}: {raw[:200].decode(errors='replace')}")
    if not decode:
        return {}, None
    try:
        return orjson.loads(raw), None
    except orjson.JSONDecodeError:
        return None, ResponseError(f"HTTP {status}: the body is not JSON")


class ResponseError(Exception):
    """An answer the user counts as failed: not 2xx, or not JSON."""


# -- the stream holder ------------------------------------------------------------------------
class StreamUser(User):
    """Holds a reader's live home stream as an app does: reads, leaves, resumes.

    A reader drawn Zipf-like by activity, as the home reads draw theirs, holds one
    stream (:class:`loadgen.streamer.StreamClient`) for ``--fanout-stream-hold`` s on
    average, goes away for ``--fanout-stream-away`` s and comes back with
    ``Last-Event-ID``. Each connect is reported as a request, ``GET home stream``
    (to the answer's head; a deleted reader's 404 is an expected answer, and the user
    draws another reader); what the stream brings goes to the run's push log and
    stream tally. How many there are is set at start-up (:func:`_on_init`).
    """

    #: Set from the options at start-up (:func:`_on_init`); 1 until then, as Locust
    #: drops a class of no weight and no fixed count before any option is read.
    fixed_count = 1
    weight = 0
    connection_timeout = 10.0

    def wait_time(self) -> float:
        """The time away between two sessions."""
        return self.client.away()

    def on_start(self) -> None:
        if self.host is None or RUN.workload is None:
            msg = "no host to load, or the test has not started: pass --host"
            raise LoadgenError(msg)
        RUN.streams_started += 1
        self.rng = random.Random(RUN.seed * 1_000_003 - RUN.streams_started)
        self.readers = ZipfPicker(RUN.workload.readers, RUN.workload.exponent)
        self.client = self._client()

    def on_stop(self) -> None:
        self.client.close()

    def _client(self) -> StreamClient:
        reader = next((u for u in (self.readers.pick(self.rng) for _ in range(5))
                       if u not in RUN.memory.gone), self.readers.pick(self.rng))
        token = RUN.tokens.get(reader)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        assert self.host is not None
        return StreamClient(self.host, reader, headers, RUN.habits, self.rng, RUN.push, RUN.tally,
                            RUN.meta["started_at"], self._connected)

    @task
    def hold(self) -> None:
        """One session of the stream; a reader found gone is replaced by another."""
        how = self.client.session(lambda: self._state == LOCUST_STATE_STOPPING)
        if how == "gone":
            RUN.memory.gone.add(self.client.user)
            self.client.close()
            self.client = self._client()

    def _connected(self, connect: Connect) -> None:
        context: dict[str, Any] = {}
        failure = None
        if connect.status in GONE:
            context["fanout_expected"] = connect.status
        elif connect.error is not None:
            failure = ResponseError(connect.error)
        self.environment.events.request.fire(
            request_type="GET", name=STREAM, start_time=time.time() - connect.seconds,
            response_time=connect.seconds * 1000, response_length=0, response=None,
            context=context, exception=failure)
