"""What ``fanout load`` sets up around Locust: the target, the data, users and tokens.

- :func:`target`: the API to load and its store — a running stack (``run/stack.json``),
  an explicit ``--target`` URL (loopback only unless allowed), or a fresh stack that it
  starts, fills with a synthetic history and waits for (``--start``), and stops after.
- :func:`prepare`: the workload (readers ranked by how many they follow, authors by
  followers) and the fan-out probe's targets (normal and celebrity authors, one
  follower each, from the store's follow graph and celebrity table), and, when the
  API has auth on, bearer tokens minted with the API's own code and secret.
- :func:`api_for`: the API of a read mode; the stack's own for ``fanout``, a second
  API process on the same store with ``FANOUT_READ_MODE=read`` for the baseline.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from infra import webclient
from infra.errors import LoadRunError
from infra.services.fanout import FanoutProcess
from infra.services.process import free_port
from infra.settings import API_URL_ENV
from infra.stack.stack import Stack, api_env, down
from loadgen.probe import Target
from loadgen.workload import Workload, dump_tokens
from serving.settings import (
    ACCESS_LOG_ENV,
    API_HOST_ENV,
    API_PORT_ENV,
    AUTH_ENV,
    AUTH_SECRET_ENV,
    READ_MODE_ENV,
    WORKER_ID_ENV,
)
from views.settings import CELEBRITY_THRESHOLD_ENV, STORE_ENV
from views.stores import store_from_url
from views.stores.base import Store

log = logging.getLogger(__name__)

TOKEN_TTL = 6 * 3600
READ_API_WORKER_ID = "1023"  # snowflake worker id of the extra API: distinct from the stack's


@dataclass(frozen=True)
class History:
    """Size of the synthetic history a ``--start`` stack is filled with."""

    users: int = 2_000
    follows: int = 30_000
    tweets: int = 20_000
    celebrity_threshold: int = 300
    seed: int = 7


@dataclass
class LoadTarget:
    """Where the load goes: the API, its store and the environment of the stack."""

    api_url: str
    store_url: str | None
    env: dict[str, str]
    history: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prepared:
    """Workload and token files for Locust, probe targets, and the API's auth state."""

    workload: Path
    tokens: Path | None
    targets: list[Target]
    auth: bool
    users: int


# -- the target ---------------------------------------------------------------------------
#: Where ``--start`` puts its stack, under the run directory (kept there with ``--keep``).
STARTED = "load"


@contextlib.contextmanager
def target(run_dir: Path, *, url: str | None, start: bool, history: History,
           allow_remote: bool, auth: str, keep: bool,
           store: str | None = None) -> Iterator[LoadTarget]:
    """The API to load; see the module docstring. A started stack is stopped after.

    ``store`` (``sqlite`` or ``cassandra``) picks a started stack's store as
    ``fanout up --store`` does; None leaves it to ``FANOUT_STORE``.
    """
    if start:
        with _started(run_dir / STARTED, history, auth, keep, store) as started:
            yield started
        return
    stack = Stack.load(run_dir)
    api = url or (stack.api_url if stack else None) or os.environ.get(API_URL_ENV)
    if not api:
        kept = run_dir / STARTED
        if Stack.load(kept) is not None:
            msg = (f"no API to load: no stack is up in {run_dir}, but `fanout load --start "
                   f"--keep` left one in {kept}: pass --run-dir {kept}")
        else:
            msg = (f"no API to load: no stack is up in {run_dir}; pass --target URL, or "
                   "--start to start one")
        raise LoadRunError(msg)
    check_loopback(api, allow_remote)
    env = stack.env() if stack else {}
    store = env.get(STORE_ENV) or os.environ.get(STORE_ENV)
    yield LoadTarget(api.rstrip("/"), store, env)


def check_loopback(url: str, allow_remote: bool) -> None:
    """Refuse a target that is not this machine, unless explicitly allowed."""
    host = urlsplit(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not allow_remote:
        msg = f"refusing to load {host or url!r}: only loopback targets unless --allow-remote"
        raise LoadRunError(msg)


@contextlib.contextmanager
def _started(run_dir: Path, history: History, auth: str, keep: bool,
             store: str | None) -> Iterator[LoadTarget]:
    from infra.stack.launch import up

    down(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    env = {CELEBRITY_THRESHOLD_ENV: str(history.celebrity_threshold),
           ACCESS_LOG_ENV: "false", AUTH_ENV: auth}
    log.info("starting a stack in %s (store: %s)", run_dir, store or f"{STORE_ENV} or SQLite")
    stack = up(run_dir, extra_env=env, store=store)
    try:
        seeded = seed(stack, history, run_dir / "history")
        yield LoadTarget(stack.api_url, stack.store_url, {**stack.env(), **env}, seeded)
    finally:
        if keep:
            log.info("the stack stays up: fanout --run-dir %s down", run_dir)
        else:
            down(run_dir)


def seed(stack: Stack, history: History, out: Path) -> dict[str, Any]:
    """Generate a history, replay it into the stack and wait until the view applied it."""
    from infra.demo import catch_up
    from ingest.generator import generate, write
    from ingest.history import iter_events
    from ingest.producer import ChangelogProducer
    from ingest.replay import replay
    from ingest.settings import KafkaSettings

    kafka = KafkaSettings(bootstrap=stack.bootstrap, partitions=stack.partitions,
                          topic_prefix=stack.topic_prefix)
    write(generate(history.users, history.follows, history.tweets, seed=history.seed), out)
    with ChangelogProducer(kafka) as producer:
        summary = replay(iter_events(out), producer)
    if not summary.ok or summary.events == 0:
        msg = f"the history was not replayed: {summary.render()}"
        raise LoadRunError(msg)
    with store_from_url(stack.store_url) as store:
        catch_up(kafka, store)
    return {"users": history.users, "follows": history.follows, "tweets": history.tweets,
            "celebrity_threshold": history.celebrity_threshold, "seed": history.seed,
            "events": summary.events}


# -- workload, probe targets, tokens -----------------------------------------------------------
def prepare(load: LoadTarget, private: Path, *, probe_authors: int, seed: int,
            user_range: tuple[int, int]) -> Prepared:
    """Write the workload (and tokens) into ``private``; pick the probe's targets."""
    rng = random.Random(seed)
    if load.store_url:
        with store_from_url(load.store_url) as store:
            workload, targets = _from_store(store, rng, probe_authors)
    else:
        log.warning("no store known for %s: users %d-%d, no fan-out probe", load.api_url,
                    *user_range)
        workload, targets = Workload.from_range(*user_range, seed=seed), []
    auth = auth_on(load.api_url, workload.readers[0])
    tokens = _tokens(load, workload, targets) if auth else {}
    targets = [_with_tokens(t, tokens) for t in targets]
    path = workload.dump(private / "workload.json")
    token_path = dump_tokens(tokens, private / "tokens.json") if tokens else None
    return Prepared(path, token_path, targets, auth, len(workload.readers))


def _from_store(store: Store, rng: random.Random, probe_authors: int
                ) -> tuple[Workload, list[Target]]:
    followees = {u: store.followees(u) for u in store.home_users()}
    followers: dict[int, list[int]] = {}
    for user, them in followees.items():
        for author in them:
            followers.setdefault(author, []).append(user)
    if not followers:
        msg = "the store holds no follow edges: replay a history first (or use --start)"
        raise LoadRunError(msg)
    readers = sorted(followees, key=lambda u: (-len(followees[u]), u))
    authors = sorted(followers, key=lambda a: (-len(followers[a]), a))
    celebrities = sorted(store.celebrities())
    targets = _probe_targets(followers, set(celebrities), rng, probe_authors)
    reserved = sorted({t.follower for t in targets})
    return Workload(readers, authors, reserved=reserved, source="store",
                    celebrities=celebrities), targets


def _probe_targets(followers: dict[int, list[int]], celebrities: set[int], rng: random.Random,
                   per_class: int) -> list[Target]:
    normal = sorted(a for a in followers if a not in celebrities)
    celebs = sorted(a for a in celebrities if followers.get(a))
    chosen = [*rng.sample(normal, min(per_class, len(normal))),
              *rng.sample(celebs, min(per_class, len(celebs)))]
    return [Target(a, rng.choice(followers[a]), a in celebrities, len(followers[a]))
            for a in chosen]


def auth_on(api_url: str, user: int) -> bool:
    """Whether the API wants a bearer token for a home timeline (401 without one)."""
    try:
        answer = webclient.get(f"{api_url}/v1/users/{user}/home", params={"limit": 1}, timeout=10)
    except httpx.HTTPError as exc:
        msg = (f"the API at {api_url} does not answer: {exc}. Is its stack up? "
               "`fanout status` says what runs and `fanout up` starts it (with the same "
               "--run-dir)")
        raise LoadRunError(msg) from exc
    return answer.status_code == 401


def _tokens(load: LoadTarget, workload: Workload, targets: list[Target]) -> dict[int, str]:
    from serving.callers import mint

    secret = load.env.get(AUTH_SECRET_ENV) or os.environ.get(AUTH_SECRET_ENV)
    if not secret:
        msg = (f"the API has auth on, but its secret is unknown: set {AUTH_SECRET_ENV}, or "
               "load a stack started by `fanout up` (it keeps the secret in its run dir)")
        raise LoadRunError(msg)
    users = {*workload.readers, *workload.authors}
    users |= {t.author for t in targets} | {t.follower for t in targets}
    return {u: mint(u, secret.encode(), TOKEN_TTL) for u in users}


def _with_tokens(t: Target, tokens: dict[int, str]) -> Target:
    return Target(t.author, t.follower, t.celebrity, t.followers, tokens.get(t.author),
                  tokens.get(t.follower))


@contextlib.contextmanager
def private_dir() -> Iterator[Path]:
    """A directory only this user can read, for token files; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="fanout-load-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- the API of each read mode -----------------------------------------------------------
@contextlib.contextmanager
def api_for(mode: str, load: LoadTarget, auth: bool, logs: Path) -> Iterator[str]:
    """The stack's API for ``fanout``; for ``read``, a second API process on its store."""
    if mode == "fanout":
        yield load.api_url
        return
    if not load.store_url:
        msg = "the read-mode baseline needs the target's store (run against a fanout stack)"
        raise LoadRunError(msg)
    port = free_port()
    env = {**api_env(load.env), STORE_ENV: load.store_url, READ_MODE_ENV: mode,
           API_HOST_ENV: "127.0.0.1", API_PORT_ENV: str(port),
           ACCESS_LOG_ENV: "false", WORKER_ID_ENV: READ_API_WORKER_ID,
           AUTH_ENV: "on" if auth else "off"}
    url = f"http://127.0.0.1:{port}"
    api = FanoutProcess(logs, "serve", env, health=f"{url}/healthz", what="the read-mode API")
    api.start()
    try:
        log.info("read-mode API (pid %d) on %s", api.pid, url)
        yield url
    finally:
        api.stop()
