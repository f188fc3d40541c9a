"""``fanout rebuild --beside``: a new view built from the log beside the live one, then a switch.

The views are derived data: a store plus the checkpoint that says how much of the
changelogs it reflects. Some changes cannot be made to a running view — the
settings its checkpoint was built with (:mod:`views.fingerprint`), a new version
whose state layout differs — and the old way out (:mod:`infra.ops.rebuild`) stopped the
job and served an empty, filling store meanwhile. Here the live job and the API go
on while a second view job (the stack's ``job-beside`` service) reads the same topics
from the start into its own checkpoint (under ``<run>/views/v<N>/``) and its own store:
a SQLite file beside the checkpoint, or on Cassandra a keyspace of its own on the same
cluster (the live keyspace's name with ``_v<N>``, its schema applied first):

1. **Build.** The second job starts (with the new settings, if any); progress shows
   how many records its view is behind the log. If it dies midway it is started
   again and resumes from its checkpoint.
2. **Check.** Once it has applied everything the log held, it is verified against
   the log (:mod:`infra.checks.verify`, every user or ``--sample N``); users that diverge
   are looked at again after it has caught up with the writes that arrived during
   the check, and only a divergence that persists stops the switch.
3. **Switch.** The run directory's view pointer (:mod:`views.pointer`) is replaced
   by a rename; every API worker switches at its next request (:mod:`serving.switch`)
   and acknowledges, and the switch waits for all of them. Only then does the old
   job stop. ``stack.json`` now names the new view's store, checkpoint and settings,
   so ``up``, ``verify`` and the rest use it.

The old view stays until ``--drop-old`` deletes it (its file, or its keyspace dropped); ``--back`` switches back to it
the same way (its job resumes and catches up first). ``<run>/views/beside.json``
records a build under way, so running the command again after it was interrupted
resumes that build; ``--abandon`` stops it and deletes what it built.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from infra.checks.verify import Served, VerifyResult, end_offsets, lagging, served, verify
from infra.services.fanout import FanoutProcess
from infra.services.process import free_port
from infra.stack.stack import BESIDE, Stack, StackError, stop_service
from ingest.settings import KafkaSettings
from serving.settings import API_WORKERS_ENV
from views import pointer
from views.changelog import read_changelog
from views.join import DEFAULT_LATENESS_MS
from views.metrics import JOB_METRICS_PORT_ENV
from views.pointer import POINTER_FILE, VIEWS_DIR, Pointer, ViewRecord
from views.reference import Reference
from views.settings import (
    CHECKPOINT_DIR_ENV,
    CHECKPOINTS,
    STORE_ENV,
    TIMELINE_CAP_ENV,
    ViewSettings,
)
from views.stores import store_from_url
from views.stores.base import Store

log = logging.getLogger(__name__)

#: The build under way: the record of the view being built, and its metrics port.
BESIDE_FILE: Final = "beside.json"
#: Exit codes of a view job that another start would not change (views.job): a
#: checkpoint past the log's end, no broker, a layout or settings it cannot take.
_FATAL_EXITS: Final = frozenset({2, 3, 4, 5, 6})
#: How many times a beside job that died is started again.
RESTARTS: Final = 3
#: How long a switch waits for every API worker to acknowledge the new view.
SWITCH_TIMEOUT_S: Final = 30.0
#: The ViewSettings that are a view's own (its job's); the rest are the stack's.
_NOT_VIEW: Final = frozenset({STORE_ENV, CHECKPOINT_DIR_ENV})

Say = Callable[[str], object]
#: The longest keyspace name Cassandra takes.
_KEYSPACE_MAX: Final = 48


def view_envs() -> frozenset[str]:
    """The FANOUT_* names of the settings a view is built with."""
    return frozenset(ViewSettings.env_names().values()) - _NOT_VIEW


def current(stack: Stack) -> Pointer:
    """The stack's view pointer; one naming its first view when there is no file yet."""
    found = pointer.read(_pointer_path(stack))
    if found is not None:
        return found
    run_dir = Path(stack.run_dir)
    own = {k: v for k, v in stack.settings.items() if k in view_envs()}
    first = ViewRecord(0, stack.store_url, stack.checkpoint_dir or str(run_dir / CHECKPOINTS),
                       {**explicit(ViewSettings.from_env(stack.env())), **own})
    return Pointer(first)


#: The settings a record always names, defaults included (views.fingerprint's), so that
#: a job of one view never takes another's value from the stack's settings.
_EXPLICIT: Final = ("timeline_cap", "celebrity_threshold", "demote_ratio", "key_buckets",
                    "shuffle_partitions", "kafka_source")


def explicit(view: ViewSettings) -> dict[str, str]:
    """``view``'s values of :data:`_EXPLICIT`, by environment variable name."""
    names = ViewSettings.env_names()
    return {names[f]: str(getattr(view, f)) for f in _EXPLICIT}


def build(run_dir: Path, overrides: Mapping[str, str], *, sample: int | None,
          timeout: float, say: Say = print) -> ViewRecord:
    """Build a view beside the live one with ``overrides`` (FANOUT_* names), then switch."""
    stack = _stack(run_dir)
    pending = _pending(stack)
    if pending is None:
        pending = _plan(stack, overrides)
        say(f"building view v{pending.number} beside the live one: store "
            f"{pending.store_url}, checkpoint {pending.checkpoint_dir}"
            + (f", settings {_shown(overrides)}" if overrides else ""))
    elif overrides and any(pending.settings.get(k) != v for k, v in overrides.items()):
        msg = (f"view v{pending.number} is being built beside already, with "
               f"{_shown(pending.settings)}: run `fanout rebuild --beside` without settings "
               "to finish it, or `fanout rebuild --beside --abandon` to drop it first")
        raise StackError(msg)
    else:
        say(f"resuming the build of view v{pending.number} beside the live one")
    return _build_and_switch(stack, pending, sample=sample, timeout=timeout, say=say)


def back(run_dir: Path, *, sample: int | None, timeout: float, say: Say = print) -> ViewRecord:
    """Switch back to the view the last switch replaced; its job catches up first."""
    stack = _stack(run_dir)
    pending = _pending(stack)
    now = current(stack)
    if pending is None:
        if now.previous is None:
            msg = "there is no earlier view to go back to (none was replaced, or it was dropped)"
            raise StackError(msg)
        pending = now.previous
        say(f"going back to view v{pending.number}: its job resumes and catches up first")
    elif now.previous is None or pending != now.previous:
        msg = (f"view v{pending.number} is being built beside: finish it (`fanout rebuild "
               "--beside`) or drop it (`fanout rebuild --beside --abandon`) first")
        raise StackError(msg)
    return _build_and_switch(stack, pending, sample=sample, timeout=timeout, say=say)


def drop_old(run_dir: Path, say: Say = print) -> list[str]:
    """Delete the view the last switch replaced (store and checkpoint); say what went."""
    stack = _stack(run_dir)
    now = current(stack)
    old = now.previous
    if old is None:
        say("nothing to drop: no earlier view is kept")
        return []
    pending = _pending(stack)
    if pending is not None and pending == old:
        msg = (f"view v{old.number} is being switched back to: let `fanout rebuild --back` "
               "finish, or abandon it (`fanout rebuild --beside --abandon`) first")
        raise StackError(msg)
    pointer.write(_pointer_path(stack), Pointer(now.current, None, now.switch))
    done = _delete_view(stack, old)
    for line in done:
        say(line)
    return done


def abandon(run_dir: Path, say: Say = print) -> list[str]:
    """Stop the build under way and delete what it built (a view switched away from stays)."""
    stack = _stack(run_dir)
    pending = _pending(stack)
    if pending is None:
        say("no view is being built beside")
        return []
    if stop_service(stack, BESIDE):
        say(f"stopped the job of view v{pending.number}")
    stack.save()
    now = current(stack)
    done = [] if pending == now.previous else _delete_view(stack, pending)
    (_views_dir(stack) / BESIDE_FILE).unlink(missing_ok=True)
    for line in done:
        say(line)
    return done


# -- the build ---------------------------------------------------------------------------

def _build_and_switch(stack: Stack, target: ViewRecord, *, sample: int | None,
                      timeout: float, say: Say) -> ViewRecord:
    port = _record_pending(stack, target)
    kafka = KafkaSettings(bootstrap=stack.bootstrap, partitions=stack.partitions,
                          topic_prefix=stack.topic_prefix)
    if _keyspace(target) is not None:
        from views.stores.cassandra.schema import apply_at  # noqa: PLC0415 - the driver

        applied = apply_at(target.store_url)  # the job checks the schema, as `up`'s does
        if applied:
            say(f"view v{target.number}: keyspace {_keyspace(target)} created "
                f"({len(applied)} schema steps)")
    job = _BesideJob(stack, target, port)
    job.ensure(timeout)
    store = _open(target)
    try:
        _catch_up(job, store, kafka, timeout, say)
        result = _check(kafka, store, target, ViewSettings.from_env(job_env(stack, target)),
                        sample, say)
    finally:
        store.close()
    if not result.ok:
        msg = (f"view v{target.number} does not match the log ({result.divergent} divergent "
               f"users, lagging: {result.lagging_partitions or 'none'}); reads stay on the live "
               f"view. Its job keeps running: `fanout rebuild --beside` checks it again, "
               f"`fanout rebuild --beside --abandon` drops it.\n{result.render()}")
        raise StackError(msg)
    job.check_alive()  # the view switched to has a job that keeps it live
    return _switch(stack, target, port, say)


class _BesideJob:
    """The stack's ``job-beside`` service for one view: started, watched, restarted."""

    def __init__(self, stack: Stack, target: ViewRecord, port: int) -> None:
        self.stack, self.target, self.port = stack, target, port
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def ready_file(self) -> Path:
        return Path(self.target.checkpoint_dir).parent / "job.ready"

    def ensure(self, timeout: float) -> None:
        """Start the job unless it runs; wait until its query has started."""
        if self.stack.running(BESIDE):
            return
        env = {**job_env(self.stack, self.target), JOB_METRICS_PORT_ENV: str(self.port)}
        Path(self.target.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        job = FanoutProcess(Path(self.stack.run_dir), "job", env, ready_file=self.ready_file,
                            log_name=BESIDE, what=f"the job of view v{self.target.number}")
        self.process = job.spawn()  # not start(): a death on the way is restarted, below
        self.stack.record(BESIDE, job)
        self.stack.save()
        deadline = time.monotonic() + timeout
        while not job.ready():
            self.check_alive()
            if time.monotonic() > deadline:
                msg = f"the job of view v{self.target.number} was not ready after {timeout:.0f}s"
                raise StackError(msg + self._see_log())
            time.sleep(0.2)

    def check_alive(self) -> bool:
        """True if the job runs; False if it died and was started again (it resumes).

        Raises when it died of something another start would not change, or too often.
        """
        code = self.process.poll() if self.process is not None else None
        if (self.process is not None and code is None) or self.stack.running(BESIDE):
            return True  # our own child that has not exited runs, whatever /proc says
        recorded = Stack.load(Path(self.stack.run_dir))
        if recorded is None or BESIDE not in recorded.pids:
            msg = (f"the job of view v{self.target.number} was stopped (`fanout down`?); "
                   "run `fanout rebuild --beside` again to resume the build")
            raise StackError(msg)
        if code in _FATAL_EXITS or self.restarts >= RESTARTS:
            why = f"exited {code}" if code is not None else "is gone"
            msg = f"the job of view v{self.target.number} {why}; reads stay on the live view"
            raise StackError(msg + self._see_log())
        self.restarts += 1
        log.warning("the job of view v%d died (%s); starting it again: it resumes from its "
                    "checkpoint %s", self.target.number,
                    f"exit {code}" if code is not None else "killed", self.target.checkpoint_dir)
        self.stack.pids.pop(BESIDE, None)
        self.ensure(timeout=300.0)
        return False

    def _see_log(self) -> str:
        return f": see {self.stack.log_of(BESIDE)}"


#: A round of catching up that began this close to the log's end (records) or ended
#: this soon (seconds) leaves the new view about as far behind as the live one.
_NEAR_RECORDS: Final = 1000
_NEAR_S: Final = 30.0


def _catch_up(job: _BesideJob, store: Store, kafka: KafkaSettings, timeout: float,
              say: Say) -> None:
    """Wait until the new view is as close to the log's end as a live view; show the lag.

    In rounds: each takes the log's end offsets and waits until the view has applied
    them. Writes go on meanwhile, so the end moves; a round that began near it, or
    did not take long, leaves the view behind by about one batch, as the live job is.
    """
    deadline = time.monotonic() + timeout
    shown = 0.0
    while True:
        target, began = end_offsets(kafka), time.monotonic()
        behind = _behind(store, target)
        while lagging(store, target):
            job.check_alive()
            if time.monotonic() - shown >= 5.0:
                shown = time.monotonic()
                say(f"view v{job.target.number}: {_behind(store, end_offsets(kafka))} "
                    "records behind the log")
            if time.monotonic() > deadline:
                msg = (f"view v{job.target.number} did not catch up within {timeout:.0f}s "
                       f"({_behind(store, end_offsets(kafka))} records behind); its job keeps "
                       "running: run `fanout rebuild --beside` again to go on waiting")
                raise StackError(msg)
            time.sleep(0.25)
        if behind <= _NEAR_RECORDS or time.monotonic() - began <= _NEAR_S:
            say(f"view v{job.target.number} has caught up with the log")
            return


def _behind(store: Store, ends: Mapping[tuple[str, int], int]) -> int:
    applied = store.applied_offsets()
    return sum(max(0, end - 1 - applied.get(tp, -1)) for tp, end in ends.items())


def _check(kafka: KafkaSettings, store: Store, target: ViewRecord, view: ViewSettings,
           sample: int | None, say: Say) -> VerifyResult:
    """``fanout verify`` on the new view; the users who diverge are compared again, exactly.

    The log keeps taking writes while the check runs, and the view applies them: a
    user whose timeline changed between the log's read and the view's differs for
    no fault of the view's. So each user who diverges is read again while no batch
    commits (the store's applied offsets the same before and after the reads), and
    compared with the log read up to exactly those offsets (:func:`_recheck`); only a
    divergence that stands through :data:`_ROUNDS` such reads counts. Both comparisons
    apply the lateness bound ``view``'s job applies.
    """
    cap, lateness = view.timeline_cap, view.lateness_ms()
    opener = functools.partial(store_from_url, target.store_url, cap=cap)
    result = verify(kafka, store, cap, sample=sample, wait=60.0, opener=opener,
                    lateness=lateness)
    if result.divergent_users:
        log.info("view v%d: %d users differ from the log as read; comparing them again at "
                 "one position of the view", target.number, result.divergent)
        _recheck(kafka, store, cap, result, lateness)
    say(f"view v{target.number}: {result.render()}")
    return result


#: How many times a user who diverges is read again, each time at a position of the view
#: of its own. A store whose batches become visible row by row (Cassandra) may show a
#: page assembled from rows of two batches, which matches the log at neither position;
#: the next read, later, does not. A row the view got wrong stays wrong in every read.
_ROUNDS: Final = 3
#: Users read again together; each group at a position of the view of its own.
_GROUP: Final = 8
#: How many times a group is read again to find a moment when no batch commits during
#: its reads.
_STILL_READS: Final = 50


def _recheck(kafka: KafkaSettings, store: Store, cap: int, result: VerifyResult,
             lateness: int | None = DEFAULT_LATENESS_MS) -> None:
    """Replace ``result``'s divergence by the users who differ in every one of its reads.

    :data:`_ROUNDS` reads, each at a position of the view (:func:`_recheck_once`). The
    view's positions only move on, so one reference of the log serves every round, the
    records past the last position added to it each time.
    """
    ref, since = Reference(lateness), None
    for round_ in range(1, _ROUNDS + 1):
        since = _recheck_once(kafka, store, cap, result, ref, since)
        if not result.divergent:
            return
        if round_ < _ROUNDS:
            log.info("%d users differ at a position of the view; reading them again",
                     result.divergent)


def _recheck_once(kafka: KafkaSettings, store: Store, cap: int, result: VerifyResult,
                  ref: Reference, since: Offsets | None) -> Offsets | None:
    """Replace ``result``'s divergence by the users who differ at a position of the view.

    ``ref`` holds the log up to ``since`` (None: nothing yet); returns where it holds
    it up to after.

    The users are read a few at a time: a group's reads take a fraction of a batch
    interval, so a moment with no commit during them comes soon, where the reads of
    every user at once might straddle a commit each time. Each group is compared with
    the log up to its own position, ``ref`` carried forward from one to the next.
    """
    users = result.divergent_users
    seen: list[Offsets] = []  # every position of the view the reads saw, in order
    groups: list[tuple[Offsets, dict[int, Served]]] = []
    for i in range(0, len(users), _GROUP):
        group = users[i:i + _GROUP]
        for _ in range(_STILL_READS):
            applied = _position(store, seen)
            rows = {user: served(store, user, cap) for user in group}
            if _position(store, seen) == applied:
                break
        else:
            msg = (f"the new view committed a batch during every one of {_STILL_READS} "
                   f"reads of {len(group)} users to check again")
            raise StackError(msg)
        if groups and groups[-1][0] == applied:
            groups[-1][1].update(rows)
        else:
            groups.append((applied, rows))
    # A store whose batches become visible row by row (Cassandra: the executors write,
    # then the offsets commit) may have shown part of the next batch: its position is
    # taken too, and a user matches at either. The reads polled the position between
    # groups, so a group's next position is the one seen after it; only the last
    # group's is waited for.
    read = [(applied, None if store.atomic_batches else _commit_after(store, seen, applied),
             rows) for applied, rows in groups]
    result.divergent, result.divergent_users, result.samples = 0, [], []
    for applied, after, rows in read:
        since = _advance(ref, kafka, since, applied)
        wanted = {u: ref.home_fast(u, cap) for u in rows if u not in ref.deleted_accounts}
        if after is not None:
            since = _advance(ref, kafka, since, after)
            later = {u: ref.home_fast(u, cap) for u in rows if u not in ref.deleted_accounts}
        for user, want in wanted.items():
            got = rows[user]
            if got != want and (after is None or user not in later or got != later[user]):
                result.divergent += 1
                result.divergent_users.append(user)
                shown = len(got) if isinstance(got, list) else got
                result.samples.append(f"user {user}: expected {len(want)} entries, "
                                      f"served {shown}{_first_difference(got, want)}")
    return since


Offsets = dict[tuple[str, int], int]
#: How long a recheck waits for the batch being written to commit (seconds).
_COMMIT_WAIT_S: Final = 60.0


def _position(store: Store, seen: list[Offsets]) -> Offsets:
    """The view's applied offsets now, noted in ``seen`` when they moved."""
    now = store.applied_offsets()
    if not seen or seen[-1] != now:
        seen.append(now)
    return now


def _commit_after(store: Store, seen: list[Offsets], applied: Offsets) -> Offsets | None:
    """The position after ``applied``: the next one ``seen``, else the next commit."""
    later = seen[seen.index(applied) + 1:]
    if later:
        return later[0]
    after = _next_commit(store, applied)
    if after is not None:
        seen.append(after)
    return after


def _next_commit(store: Store, applied: Offsets) -> Offsets | None:
    """The view's offsets once a batch after ``applied`` has committed; None if none does."""
    deadline = time.monotonic() + _COMMIT_WAIT_S
    while time.monotonic() < deadline:
        now = store.applied_offsets()
        if now != applied:
            return now
        time.sleep(0.1)
    return None


def _advance(ref: Reference, kafka: KafkaSettings, since: Offsets | None,
             applied: Offsets) -> Offsets:
    """Add the log's records up to ``applied`` to ``ref``; where the next read starts."""
    until = {tp: offset + 1 for tp, offset in applied.items()}
    if until != since:
        ref.add(read_changelog(kafka, until=until, since=since).events)
    return until


def _first_difference(got: Served, want: list[Any]) -> str:
    """Where two pages first differ, for the sample line."""
    if not isinstance(got, list):
        return ""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f" (first difference at {i}: served {a}, expected {b})"
    return ""


def _switch(stack: Stack, target: ViewRecord, port: int, say: Say) -> ViewRecord:
    """Point the API at ``target``, wait for every worker, then stop the old job."""
    path = _pointer_path(stack)
    now = current(stack)
    new = Pointer(target, now.current, now.switch + 1)
    started = time.monotonic()
    pointer.write(path, new)
    _await_workers(stack, new)
    took = time.monotonic() - started
    if stop_service(stack, "job"):
        say(f"stopped the job of view v{now.current.number}")
    stack.pids["job"], stack.markers["job"] = stack.pids.pop(BESIDE), stack.markers.pop(BESIDE)
    stack.store_url, stack.checkpoint_dir = target.store_url, target.checkpoint_dir
    stack.settings = {**{k: v for k, v in stack.settings.items() if k not in view_envs()},
                      **target.settings}
    stack.job_metrics_port = port
    stack.save()
    (_views_dir(stack) / BESIDE_FILE).unlink(missing_ok=True)
    say(f"switched reads to view v{target.number} in {took * 1000:.0f} ms (every API worker); "
        f"view v{now.current.number} is kept: `fanout rebuild --back` returns to it, "
        "`fanout rebuild --drop-old` deletes it")
    return target


def _await_workers(stack: Stack, new: Pointer) -> None:
    """Wait until every API worker serves ``new`` (none: the API is not running)."""
    if not stack.running("api"):
        return
    path = _pointer_path(stack)
    expected = int(stack.env().get(API_WORKERS_ENV) or 0) or os.cpu_count() or 1
    deadline = time.monotonic() + SWITCH_TIMEOUT_S
    while True:
        acks = pointer.serving_workers(path).values()
        moved = sum(1 for a in acks if a.get("switch") == new.switch)
        if moved >= expected and all(a.get("switch") == new.switch for a in acks):
            return
        if time.monotonic() > deadline:
            msg = (f"{moved} of {expected} API workers switched to view v{new.current.number} "
                   f"within {SWITCH_TIMEOUT_S:.0f}s; {path} names it, so restart the API "
                   f"(`fanout --run-dir {stack.run_dir} down`, then `up`) to serve it; see "
                   f"{stack.log_of('api')}")
            raise StackError(msg)
        time.sleep(0.005)


# -- records -----------------------------------------------------------------------------

def _stack(run_dir: Path) -> Stack:
    stack = Stack.load(run_dir.resolve())
    if stack is None:
        msg = f"no stack in {run_dir}: start one with `fanout --run-dir {run_dir} up`"
        raise StackError(msg)
    if not stack.store_url.startswith(("sqlite:///", "cassandra://")):
        msg = (f"the store {stack.store_url.split('@')[-1]} is neither a SQLite file nor a "
               "Cassandra keyspace: no view can be built beside it")
        raise StackError(msg)
    return stack


def _plan(stack: Stack, overrides: Mapping[str, str]) -> ViewRecord:
    """The next view: a new numbered directory, the live settings with ``overrides``."""
    now = current(stack)
    numbers = [now.current.number] + ([now.previous.number] if now.previous else [])
    number = max(numbers) + 1
    while (_views_dir(stack) / f"v{number}").exists():
        number += 1
    where = _views_dir(stack) / f"v{number}"
    return ViewRecord(number, _store_of(stack.store_url, number, where),
                      str(where / CHECKPOINTS), {**now.current.settings, **overrides})


def _store_of(live_url: str, number: int, where: Path) -> str:
    """The store URL of view ``number``: a file in ``where``, or a keyspace beside the live one.

    A Cassandra view's keyspace is the live one's name without its ``_v<N>`` (if it is a
    view built beside too) with ``_v<number>``, on the same hosts with the same options.
    """
    if not live_url.startswith("cassandra://"):
        return f"sqlite:///{where / 'fanout.sqlite'}"
    parts = urlsplit(live_url)
    base = re.sub(r"_v\d+$", "", parts.path.strip("/"))
    keyspace = f"{base}_v{number}"
    if len(keyspace) > _KEYSPACE_MAX:
        msg = (f"the keyspace {keyspace!r} of view v{number} would be longer than Cassandra's "
               f"{_KEYSPACE_MAX} characters: run the stack on a shorter keyspace name")
        raise StackError(msg)
    return urlunsplit(parts._replace(path=f"/{keyspace}"))


def metrics_url(stack: Stack) -> str | None:
    """Where the job of the view being built answers metrics scrapes (``fanout status``)."""
    path = _views_dir(stack) / BESIDE_FILE
    port = json.loads(path.read_text()).get("metrics_port", 0) if path.exists() else 0
    return f"http://127.0.0.1:{port}/metrics" if port else None


def _pending(stack: Stack) -> ViewRecord | None:
    path = _views_dir(stack) / BESIDE_FILE
    if not path.exists():
        return None
    return ViewRecord(**json.loads(path.read_text())["view"])


def _record_pending(stack: Stack, target: ViewRecord) -> int:
    """Record the build under way (so a second run resumes it); its job's metrics port."""
    path = _views_dir(stack) / BESIDE_FILE
    port = json.loads(path.read_text()).get("metrics_port", 0) if path.exists() else 0
    port = port or free_port()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"view": asdict(target), "metrics_port": port}, indent=2))
    tmp.replace(path)
    return port


def _keyspace(view: ViewRecord) -> str | None:
    """The Cassandra keyspace ``view`` is stored in; None for a SQLite file."""
    if not view.store_url.startswith("cassandra://"):
        return None
    from views.stores.cassandra.config import parse_url  # noqa: PLC0415 - the driver, when used

    return str(parse_url(view.store_url).keyspace)


def _drop_keyspace(view: ViewRecord) -> str:
    """Drop a Cassandra view's keyspace (its data goes; snapshots as the cluster keeps them)."""
    from views.stores.cassandra.config import parse_url  # noqa: PLC0415 - the driver, when used
    from views.stores.cassandra.schema import connect  # noqa: PLC0415

    config = parse_url(view.store_url)
    cluster, session = connect(config, wait=60)
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=120)
    finally:
        cluster.shutdown()
    return f"dropped keyspace {config.keyspace}"


def _delete_view(stack: Stack, view: ViewRecord) -> list[str]:
    """Delete a view's store (SQLite files, or its keyspace) and checkpoint (and directory)."""
    done = []
    if _keyspace(view) is not None:
        done.append(_drop_keyspace(view))
        files: tuple[Path, ...] = ()
        store = Path(view.checkpoint_dir)  # in the view's own directory, as a file would be
    else:
        store = Path(view.store_url.removeprefix("sqlite:///"))
        files = (store, Path(f"{store}-wal"), Path(f"{store}-shm"))
    for path in (*files, Path(view.checkpoint_dir)):
        if path.is_dir():
            shutil.rmtree(path)
            done.append(f"deleted {path}")
        elif path.exists():
            path.unlink()
            done.append(f"deleted {path}")
    own = _views_dir(stack) / f"v{view.number}"
    if own.is_dir() and store.parent == own:
        shutil.rmtree(own)
    return done


def _open(view: ViewRecord) -> Store:
    return store_from_url(view.store_url, cap=_cap(view)).open()


def job_env(stack: Stack, view: ViewRecord) -> dict[str, str]:
    """The environment the job of ``view`` runs with: the stack's, the view's settings over it."""
    stack_env = {k: v for k, v in stack.env().items() if k not in view_envs()}
    return {**stack_env, **view.settings, STORE_ENV: view.store_url,
            CHECKPOINT_DIR_ENV: view.checkpoint_dir}


def _cap(view: ViewRecord) -> int:
    return ViewSettings.from_env({TIMELINE_CAP_ENV: view.settings[TIMELINE_CAP_ENV]}
                                 if TIMELINE_CAP_ENV in view.settings else {}).timeline_cap


def _views_dir(stack: Stack) -> Path:
    return Path(stack.run_dir) / VIEWS_DIR


def _pointer_path(stack: Stack) -> Path:
    return Path(stack.run_dir) / POINTER_FILE


def _shown(settings: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "the live settings"

