"""``fanout verifier``: correctness as a live metric, a few sampled users a second.

``fanout verify`` reads the whole log and every timeline once; this service checks
all the time, cheaply, while the stack runs (``fanout up`` starts it; it is on
unless ``FANOUT_VERIFIER=off`` or ``fanout up --no-verifier``). It follows the
changelogs (:class:`~infra.checks.logtail.LogTail`: read once from the start, then only
what is appended) and folds them into a :class:`~views.reference.Reference` — the
SQL of DESIGN §4b — *up to the offsets the store has applied* (the API's
``/healthz`` says which), never further: the reference stands where the view
stands, so a view that lags, or a job that was killed and replays, is never
compared with records it has not reached. Then, ``FANOUT_VERIFIER_RATE`` times a
second, it picks a random user that follows someone and compares the first page
the API serves (``FANOUT_VERIFIER_ENTRIES`` entries, over HTTP, with the user's
own bearer token, as any client reads it) with the reference's first entries,
field by field: entry, time, actor, original tweet and its author.

**When a comparison counts.** The applied offsets are read before and after the
page; if they differ, a micro-batch committed meanwhile and the read is *skipped*
(``moved``). The API's celebrity cache (:mod:`serving.celebrities`) trails the store
by design: a celebrity's new entries show within two refreshes
(``FANOUT_CELEBRITY_REFRESH_S``), a late one within its full reload
(``FANOUT_CELEBRITY_FULL_RELOAD_S``, 60 s by default). So records count as *recent* from when
the verifier first sees the view apply them: for two refreshes and a margin, or, when
they name a possible celebrity (anyone with more distinct followers, ever, than the
demotion bound), for the full reload and that; a user whom a recent record concerns
(below) is not compared yet (``touched``).

Folding costs a rebuild of the reference's index (about 2 s of CPU for 600,000
events), so after a fold the next waits until the last one's cost is at most
:data:`FOLD_SHARE` of the time since (a fifth of a core at most); in between, the view runs ahead of the reference by the records the tail still
holds, and a user is compared only if none of those records, nor a recent one,
names them, anyone they follow, or anyone whose entries their page shows (else
skipped: ``touched``) — a record that names none of these cannot change that page. A
mismatch is first a *suspect*: it is counted divergent only when the user's page
differs again at a later stable position, once the view has committed more or has
applied the whole log (drawn again before that, the user is read for the nines only). On SQLite, rows and offsets commit together, so a mismatch
repeats; on Cassandra a micro-batch's rows land before its offsets (and a killed
job leaves a half-written batch until it replays it), so a mismatch that does not
repeat is counted apart (``fanout_verify_transient``), not as divergence. An
answer that does not come (the API, the store or the broker down) is skipped
(``unavailable``).

**What it exports** (:class:`VerifierMetrics`, on ``FANOUT_VERIFIER_PORT``):
``fanout_verify_checked`` users compared, ``fanout_verify_divergent`` of them
divergent, ``fanout_verify_transient``, ``fanout_verify_skipped{reason}``,
``fanout_verify_reference_records`` and ``fanout_verify_last_check_timestamp_seconds``.
Counts since the process started, exported as gauges: the dashboard asks for the
bare names, and a prometheus_client ``Counter`` would export ``…_total``. Each
divergence is logged with the user, the position and the first difference.

**Nines** (:mod:`infra.checks.nines`, DESIGN §8): every read, first or again, also goes to
the sampler's :class:`~infra.checks.nines.Nines`, which follows a wrong check with re-reads
up to 60 s and reports the share correct within 1 s, 10 s and 60 s of the view
reaching the checked position (``fanout_verify_consistent_within_ratio{sampler,
window, span}``). There are two samplers, each with its own random stream and its
own reads, in turn each step: ``a`` also keeps the counts above (checked, divergent,
transient, skipped); ``b`` keeps only nines, and the difference between the two is
the measurement's noise, which :func:`summary` states.

Its reads carry ``X-Fanout-Monitor``: answered like any other read, but not
appended to the activity log (DESIGN §4b, inactive users), so that sampling does not
keep every user it has looked at "active" and fanned out to.
"""

from __future__ import annotations

import argparse
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from infra.checks.apireader import ApiReader, Unavailable
from infra.checks.logtail import LogicalTP, LogReset, LogTail, named_users
from infra.checks.nines import SAMPLERS, Nines, NinesGauges, shown
from infra.errors import InfraError
from infra.services.process import stop_on_signals
from infra.settings import (
    API_URL_ENV,
    VerifierSettings,
)
from ingest.events import Event, Follow, Relation
from ingest.settings import KafkaSettings
from serving.celebrities import FULL_RELOAD_S
from serving.settings import ServingSettings
from views.kafka_offsets import KafkaReadError
from views.reference import HomeRow, Reference
from views.settings import ViewSettings

log = logging.getLogger(__name__)

#: Longest share of the time the reference may spend being folded and re-indexed.
FOLD_SHARE: Final = 0.2
#: Shortest time between two folds (seconds).
MIN_FOLD_S: Final = 1.0
#: Longest a step reads the log (seconds): the first read of a long log takes many steps.
POLL_S: Final = 0.5
#: How often, at most, Kafka is asked whether the view has applied the whole log.
ENDS_EVERY_S: Final = 5.0
#: Suspects kept at once; more mismatches wait until these are settled.
MAX_SUSPECTS: Final = 100
#: Pause after Kafka did not answer, before trying again (seconds).
RETRY_S: Final = 2.0
SKIP_REASONS: Final = ("moved", "touched", "unavailable")
#: Added to the API's own staleness bounds before a record stops being recent (seconds).
SETTLE_MARGIN_S: Final = 1.0


class VerifierMetrics:
    """The verifier's series, in a registry of their own (module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.checked = Gauge("fanout_verify_checked", "Sampled users whose first page was "
                             "compared with the reference, since the verifier started.",
                             registry=r)
        self.divergent = Gauge("fanout_verify_divergent", "Compared users whose page differed "
                               "from the reference, twice at stable positions.", registry=r)
        self.transient = Gauge("fanout_verify_transient", "Mismatches that did not repeat "
                               "at a later position (a batch read half-written).", registry=r)
        self.skipped = Gauge("fanout_verify_skipped", "Sampled users not compared, by why: "
                             "moved (a batch committed during the read), touched (records "
                             "the reference has not reached name them), unavailable.",
                             ["reason"], registry=r)
        for reason in SKIP_REASONS:
            self.skipped.labels(reason)
        self.records = Gauge("fanout_verify_reference_records",
                             "Changelog events folded into the reference.", registry=r)
        self.last_check = Gauge("fanout_verify_last_check_timestamp_seconds",
                                "When a user was last compared (Unix time).", registry=r)
        self.nines = NinesGauges(r)


def summary(text: str) -> dict[str, Any]:
    """What ``fanout status`` shows of a scrape of the verifier."""
    values: dict[str, float] = {}
    skipped: dict[str, int] = {}
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    for s in samples:
        if s.name == "fanout_verify_skipped":
            skipped[s.labels["reason"]] = int(s.value)
        elif not s.labels:
            values[s.name] = s.value
    last = values.get("fanout_verify_last_check_timestamp_seconds", 0.0)
    return {"checked": int(values.get("fanout_verify_checked", 0)),
            "divergent": int(values.get("fanout_verify_divergent", 0)),
            "transient": int(values.get("fanout_verify_transient", 0)),
            "skipped": skipped,
            "last_check_age_s": round(time.time() - last, 1) if last else None,
            "consistent_within": shown(samples)}


@dataclass(frozen=True)
class Settle:
    """How long applied records stay recent (module docstring), and who is a celebrity."""

    #: For every record: two celebrity-cache refreshes and a margin.
    seconds: float = 2 * 0.5 + SETTLE_MARGIN_S
    #: For a record naming a possible celebrity: a full reload of the cache, and that.
    celebrity_seconds: float = FULL_RELOAD_S + 2 * 0.5 + SETTLE_MARGIN_S
    #: Distinct followers, ever, from which a user may be a celebrity.
    celebrity_followers: float = 800 * 0.8

    @classmethod
    def of(cls, serving: ServingSettings, view: ViewSettings) -> Settle:
        """The bounds of an API and a view job run with these settings."""
        refresh = 2 * serving.celebrity_refresh_s + SETTLE_MARGIN_S
        return cls(refresh, serving.celebrity_full_reload_s + refresh,
                   view.celebrity_threshold * view.demote_ratio)


@dataclass(frozen=True)
class Suspect:
    """A mismatch seen once: where, and what differed."""

    position: dict[LogicalTP, int]
    difference: str


@dataclass
class Sampler:
    """One random stream of users and its nines; the first also keeps the counts."""

    name: str
    random: random.Random
    nines: Nines
    primary: bool


class LiveVerifier:
    """The sampling loop: fold the log to the view's position, compare a user, repeat."""

    def __init__(self, settings: VerifierSettings, kafka: KafkaSettings, api: ApiReader,
                 metrics: VerifierMetrics | None = None, seed: int | None = None,
                 settle: Settle | None = None, lateness: int | None = None) -> None:
        self.settings, self.kafka, self.api = settings, kafka, api
        self.settle = settle or Settle()
        #: The view's lateness bound (ms, None: off), which the reference applies too: the
        #: tail releases each partition's records in offset order, as it requires.
        self.lateness = lateness
        self.metrics = metrics or VerifierMetrics()
        # Two independent streams (DESIGN §8): b's nines beside a's are the noise floor.
        seeds = random.Random(seed)
        self.samplers = [Sampler(name, random.Random(seeds.getrandbits(64)), Nines(), i == 0)
                         for i, name in enumerate(SAMPLERS)]
        self.suspects: dict[int, Suspect] = {}
        self._reset_state()

    def _reset_state(self) -> None:
        self.tail = LogTail(self.kafka)
        self.ref = Reference(self.lateness)
        self.folded: dict[LogicalTP, int] = {}
        # Who each user ever followed or blocked, and was ever followed by, in the records
        # the view has applied (supersets of the live edges: what a record may touch).
        self.follows: dict[int, set[int]] = {}
        self.followers: dict[int, set[int]] = {}
        self._observed: dict[LogicalTP, int] = {}  # the newest applied offsets seen
        self._recent: deque[tuple[float, set[int]]] = deque()  # (until, users named)
        self._recent_celebrity: deque[tuple[float, set[int]]] = deque()
        self.pool: list[int] = []
        self.suspects.clear()
        self._next_fold = 0.0
        self._ends_asked = 0.0
        self._caught_up_at: dict[LogicalTP, int] | None = None
        self._reached: tuple[dict[LogicalTP, int], float] = ({}, time.monotonic())
        for sampler in self.samplers:  # positions are counted again from the start
            sampler.nines.open.clear()
        self.metrics.records.set(0)

    def run(self, stop: threading.Event) -> None:
        """Check ``rate`` users a second until ``stop`` is set."""
        interval = 1.0 / self.settings.rate
        warned = ""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.step()
                warned = ""
            except LogReset as exc:
                log.warning("live verifier: %s: reading the log again from the start", exc)
                self.tail.close()
                self._reset_state()
            except KafkaReadError as exc:  # what was read stays; the tail retries on its own
                if str(exc) != warned:
                    log.warning("live verifier: Kafka does not answer: %s", exc)
                warned = str(exc)
                stop.wait(RETRY_S)
            stop.wait(max(0.0, interval - (time.monotonic() - started)))
        self.tail.close()

    def step(self) -> None:
        """Read what the log has new, fold it if the view has applied it, compare one user."""
        if not self.tail.started:
            self.tail.start()
        self.tail.poll(POLL_S)
        try:
            applied = self.api.applied()
        except Unavailable as exc:
            self._skip("unavailable", exc)
            return
        if any(applied.get(tp, -1) < offset for tp, offset in self.folded.items()):
            msg = (f"the served store has applied less than the reference holds "
                   f"({_where(applied)}): another store is served now")
            raise LogReset(msg)
        self._reached_at(applied)
        self._observe(applied)
        self._fold(applied)
        for sampler in self.samplers:
            self.check(sampler)

    def _observe(self, applied: dict[LogicalTP, int]) -> None:
        """Note the users that records the view applied since the last look name, as recent."""
        if applied == self._observed or not self.tail.reached(applied):
            return
        now = time.monotonic()
        ordinary: set[int] = set()
        celebrity: set[int] = set()
        events = list(self.tail.between(self._observed, applied))
        self._remember_follows(events)
        for event in events:
            names = named_users(event)
            big = any(len(self.followers.get(u, ())) >= self.settle.celebrity_followers
                      for u in names)
            (celebrity if big else ordinary).update(names)
        self._recent.append((now + self.settle.seconds, ordinary))
        self._recent_celebrity.append((now + self.settle.celebrity_seconds, celebrity))
        self._observed = dict(applied)

    def _recently_named(self) -> set[int]:
        """The users that records applied recently name (module docstring)."""
        now, out = time.monotonic(), set[int]()
        for recent in (self._recent, self._recent_celebrity):
            while recent and recent[0][0] <= now:
                recent.popleft()
            for _, names in recent:
                out |= names
        return out

    def _fold(self, applied: dict[LogicalTP, int]) -> None:
        """Move the reference to ``applied`` if the tail has it and the budget allows."""
        if applied == self.folded or time.monotonic() < self._next_fold:
            return
        if not self.tail.reached(applied):
            return
        started = time.perf_counter()
        events = self.tail.release(applied)
        self.ref.add(events)
        self.folded = dict(applied)
        self.pool = self.ref.users()
        if self.pool:
            self.ref.home_fast(self.pool[0], 1)  # builds the index now, inside the budget
        cost = time.perf_counter() - started
        self._next_fold = time.monotonic() + max(MIN_FOLD_S, cost / FOLD_SHARE)
        self.metrics.records.inc(len(events))
        log.debug("reference moved to %s: %d events in %.2fs", _where(applied), len(events), cost)

    def _remember_follows(self, events: Iterable[Event]) -> None:
        for event in events:
            if isinstance(event, Follow | Relation):
                self.follows.setdefault(event.follower_id, set()).add(event.followee_id)
            if isinstance(event, Follow):
                self.followers.setdefault(event.followee_id, set()).add(event.follower_id)

    def check(self, sampler: Sampler | None = None) -> None:
        """Compare one user's first page at a stable position, or count why not."""
        sampler = sampler or self.samplers[0]
        try:
            before = self.api.applied()
        except Unavailable as exc:
            self._skip("unavailable", exc, sampler)
            return
        reached = self._reached_at(before)
        sampler.nines.expire(time.monotonic())
        self._export(sampler)
        if not self.tail.reached(before) or any(
                before.get(tp, -1) < o for tp, o in self.folded.items()):
            return  # the tail, or the view, is not where the reference is yet
        user, counted = self._pick(sampler, before)
        if user is None:
            return
        n = self.settings.entries
        want = self.ref.home_fast(user, n)
        named = {u for event in self.tail.held(before) for u in named_users(event)}
        if (named | self._recently_named()) & self._related(user, want):
            self._skip("touched", None, sampler)
            return
        try:
            got = self.api.page(user, n)
            after = self.api.applied()
        except Unavailable as exc:
            self._skip("unavailable", exc, sampler)
            return
        if after != before:
            self._skip("moved", None, sampler)
            return
        sampler.nines.read(user, reached, time.monotonic(), got == want)
        self._export(sampler)
        if counted:
            self._judge(user, want, got, before)

    def _reached_at(self, position: dict[LogicalTP, int]) -> float:
        """When the verifier first saw the view at ``position`` (its newest one)."""
        if position != self._reached[0]:
            self._reached = (dict(position), time.monotonic())
        return self._reached[1]

    def _export(self, sampler: Sampler) -> None:
        self.metrics.nines.export(sampler.name, sampler.nines)

    def _related(self, user: int, want: list[HomeRow]) -> set[int]:
        """Everyone a record must name to change ``user``'s first page."""
        related = {user, *self.follows.get(user, ())}
        for row in want:
            related.update((row.actor_id, row.original_author_id))
        return related

    def _pick(self, sampler: Sampler, position: dict[LogicalTP, int]) -> tuple[int | None, bool]:
        """Whom to read next, and whether the read counts (checked, divergent, transient).

        A suspect whose re-check is due, else a wrong check whose re-read is due, else a
        random user (None: nobody yet). Only the first sampler's suspects and samples
        count; re-reads feed the nines only.
        """
        if sampler.primary:
            for user, suspect in self.suspects.items():
                if suspect.position != position or self._caught_up(position):
                    return user, True
        again = sampler.nines.due(time.monotonic())
        if again is not None:
            return again, False
        if not self.pool:
            return None, False
        user = self.pool[sampler.random.randrange(len(self.pool))]
        # A suspect drawn again before its re-check is due is a re-read for the nines only:
        # a mismatch counts divergent only if it repeats at a later position (docstring).
        return user, sampler.primary and user not in self.suspects

    def _caught_up(self, position: dict[LogicalTP, int]) -> bool:
        """Whether the view has applied every record of the log (asked now and then)."""
        if self._caught_up_at == position:
            return True
        if time.monotonic() - self._ends_asked < ENDS_EVERY_S:
            return False
        self._ends_asked = time.monotonic()
        ends = self.tail.ends()
        if all(position.get(tp, -1) >= end - 1 for tp, end in ends.items()):
            self._caught_up_at = dict(position)
            return True
        return False

    def _judge(self, user: int, want: list[HomeRow], got: list[HomeRow] | str,
               position: dict[LogicalTP, int]) -> None:
        suspect = self.suspects.pop(user, None)
        if got == want:
            if suspect is not None:
                self.metrics.transient.inc()
                log.info("user %d: the mismatch seen at %s did not repeat at %s (%s)", user,
                         _where(suspect.position), _where(position), suspect.difference)
            self._checked()
            return
        difference = first_difference(want, got)
        if suspect is None:
            if len(self.suspects) < MAX_SUSPECTS:
                self.suspects[user] = Suspect(dict(position), difference)
                log.info("user %d: mismatch at %s, to be confirmed: %s", user,
                         _where(position), difference)
            return
        self._checked()
        self.metrics.divergent.inc()
        earlier = "" if suspect.position == position else \
            f" (and at {_where(suspect.position)} before)"
        log.warning("DIVERGENT: user %d at %s%s: %s", user, _where(position), earlier,
                    difference)

    def _checked(self) -> None:
        self.metrics.checked.inc()
        self.metrics.last_check.set(time.time())

    def _skip(self, reason: str, exc: Exception | None = None,
              sampler: Sampler | None = None) -> None:
        if sampler is None or sampler.primary:  # the counts are the first sampler's
            self.metrics.skipped.labels(reason).inc()
        if exc is not None:
            log.debug("live verifier: skipped: %s", exc)


def first_difference(want: list[HomeRow], got: list[HomeRow] | str) -> str:
    """The first entry where the served page and the reference differ, field by field."""
    if isinstance(got, str):
        return f"expected {len(want)} entries, {got}"
    for i, (w, g) in enumerate(zip(want, got, strict=False)):
        if w != g:
            return f"entry {i}: expected {_row(w)}, served {_row(g)}"
    if len(want) > len(got):
        return f"entry {len(got)}: expected {_row(want[len(got)])}, served nothing more"
    return f"entry {len(want)}: expected nothing more, served {_row(got[len(want)])}"


def _row(row: HomeRow) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in row._asdict().items()) + ")"


def _where(position: Mapping[LogicalTP, int]) -> str:
    """Applied offsets for log lines: ``tweets@12,9 follows@7,-1`` (by partition)."""
    topics: dict[str, dict[int, int]] = {}
    for (topic, part), offset in position.items():
        topics.setdefault(topic, {})[part] = offset
    return " ".join(f"{t}@" + ",".join(str(parts.get(p, -1)) for p in range(max(parts) + 1))
                    for t, parts in sorted(topics.items())) or "(nothing applied)"


# -- the service ---------------------------------------------------------------------------

def serve(environ: Mapping[str, str], stop: threading.Event,
          settings: VerifierSettings | None = None,
          on_ready: Callable[[], object] | None = None) -> None:
    """Run the verifier and its endpoint until ``stop`` is set.

    ``on_ready`` is called once the endpoint listens (``fanout up`` waits for that).
    """
    settings = settings or VerifierSettings.from_env(environ)
    kafka = KafkaSettings.from_env(environ)
    api_url = environ.get(API_URL_ENV, "")
    if not kafka.bootstrap or not api_url:
        msg = (f"the live verifier needs the broker and the API ({'KAFKA_BOOTSTRAP'}, "
               f"{API_URL_ENV}): run `fanout up`, which starts it with the stack's")
        raise InfraError(msg)
    api = ServingSettings.from_env(environ)
    reader = ApiReader(api_url, api.secret() if api.auth else None)
    metrics = VerifierMetrics()
    try:
        server, _thread = start_http_server(settings.port, addr=settings.host,
                                            registry=metrics.registry)
    except OSError as exc:
        msg = f"the live verifier cannot listen on {settings.host}:{settings.port}: {exc}"
        raise InfraError(msg) from exc
    log.info("live verifier: %g users/s, first %d entries, API %s; metrics on http://%s:%d/"
             "metrics", settings.rate, settings.entries, api_url, settings.host,
             server.server_port)
    if on_ready is not None:
        on_ready()
    try:
        view = ViewSettings.from_env(environ)
        LiveVerifier(settings, kafka, reader, metrics, settle=Settle.of(api, view),
                     lateness=view.lateness_ms()).run(stop)
    finally:
        server.shutdown()
        server.server_close()
        reader.close()


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``fanout verifier`` to the command's subparsers."""
    env = VerifierSettings.env_help
    p = sub.add_parser("verifier", help="run the live verifier (foreground; `fanout up` runs "
                                        "it): sampled users' served pages against the log")
    p.add_argument("--rate", type=float, default=None,
                   help=f"users compared a second ({env('rate')})")
    p.add_argument("--entries", type=int, default=None,
                   help=f"entries of each first page compared ({env('entries')})")
    p.add_argument("--port", type=int, default=None,
                   help=f"Prometheus endpoint port ({env('port')})")
    p.add_argument("--ready-file", type=Path, default=None,
                   help="write this file once the metrics endpoint listens")
    p.set_defaults(func=_cmd_verifier)


def _cmd_verifier(args: argparse.Namespace) -> int:
    settings = VerifierSettings.from_env(args.environ, rate=args.rate, entries=args.entries,
                                         port=args.port)
    ready: Path | None = args.ready_file
    serve(args.environ, stop_on_signals(), settings,
          on_ready=(lambda: ready.write_text("started")) if ready else None)
    return 0
