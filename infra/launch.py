"""``fanout up``: start the local stack and record it (see :mod:`infra.stack`).

Settings come from the environment, as for every service; ``up`` only adds what it
decides itself — the broker address, the store file, checkpoint directory and API
port inside the run directory — and hands the same environment to every service.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from infra.broker import free_port
from infra.rebuild import stale_views
from infra.stack import (
    AUTH_SECRET_FILE,
    Stack,
    StackError,
    alive,
    spawn,
    stop_pid,
    wait_for_file,
    wait_for_http,
)
from ingest.settings import KafkaSettings
from ingest.topics import create_topics
from serving.settings import ServingSettings
from views.settings import ViewSettings

log = logging.getLogger(__name__)


def up(run_dir: Path, *, port: int | None = None, extra_env: dict[str, str] | None = None,
       timeout: float = 240.0) -> Stack:
    """Start broker (unless KAFKA_BOOTSTRAP is set), view job and API; return the Stack."""
    run_dir = run_dir.resolve()
    existing = Stack.load(run_dir)
    if existing is not None and any(map(alive, existing.pids.values())):
        msg = f"a stack is already up in {run_dir} (pids {existing.pids}): 'fanout down' first"
        raise StackError(msg)
    kafka, view, api = KafkaSettings(), ViewSettings(), ServingSettings()
    if not kafka.bootstrap:
        _refuse_stale_views(run_dir, view)
    run_dir.mkdir(parents=True, exist_ok=True)
    _auth_secret(run_dir)
    pids: dict[str, int] = {}
    try:
        bootstrap = kafka.bootstrap or _start_broker(run_dir, pids)
        kafka = KafkaSettings(bootstrap=bootstrap, partitions=kafka.partitions,
                              topic_prefix=kafka.topic_prefix)
        create_topics(kafka)
        stack = _describe(run_dir, kafka, view, api, port or free_port(), pids)
        env = {**stack.env(), **(extra_env or {}),
               "FANOUT_CHECKPOINT_DIR": str(run_dir / "checkpoints"),
               "FANOUT_API_HOST": api.host, "FANOUT_API_PORT": stack.api_url.rsplit(":", 1)[1]}
        _start_job(run_dir, env, pids, timeout)
        api_process = spawn(run_dir, "serve", [], env)
        pids["api"] = api_process.pid
        wait_for_http(f"{stack.api_url}/healthz", api_process, timeout=60)
    except BaseException:
        for name, pid in reversed(pids.items()):
            stop_pid(pid, name)
        raise
    stack.save()
    return stack


def _refuse_stale_views(run_dir: Path, view: ViewSettings) -> None:
    """An embedded broker starts empty: views of an earlier run cannot match it."""
    stale = stale_views(run_dir / "checkpoints", _store_url(run_dir, view))
    if stale:
        shown = ", ".join(map(str, stale))
        msg = (f"{shown} hold views of an earlier embedded broker, whose topics are gone "
               f"(it keeps them in memory only): run `fanout --run-dir {run_dir} rebuild` "
               "to set them aside, then `fanout up` and replay the history")
        raise StackError(msg)


def _auth_secret(run_dir: Path) -> None:
    """A fresh random token secret in ``<run>/auth.secret`` unless FANOUT_AUTH_SECRET is set.

    :meth:`Stack.env` hands the file's secret to the API and to later ``fanout``
    commands (``fanout token``); a secret set in the environment wins, so a stale
    file from an earlier run is removed then.
    """
    path = run_dir / AUTH_SECRET_FILE
    path.unlink(missing_ok=True)
    if os.environ.get("FANOUT_AUTH_SECRET"):
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))


def _start_broker(run_dir: Path, pids: dict[str, int]) -> str:
    ready = run_dir / "broker.ready"
    ready.unlink(missing_ok=True)
    process = spawn(run_dir, "broker", ["--ready-file", str(ready)], {})
    pids["broker"] = process.pid
    return wait_for_file(ready, process, "the broker", timeout=60)


def _start_job(run_dir: Path, env: dict[str, str], pids: dict[str, int], timeout: float) -> None:
    ready = run_dir / "job.ready"
    ready.unlink(missing_ok=True)
    process = spawn(run_dir, "job", ["--ready-file", str(ready)], env)
    pids["job"] = process.pid
    wait_for_file(ready, process, "the view job", timeout=timeout)


def _store_url(run_dir: Path, view: ViewSettings) -> str:
    """The store of the stack: the configured one, or a SQLite file in the run directory."""
    if view.store_url == ViewSettings.model_fields["store_url"].default:
        return f"sqlite:///{run_dir / 'fanout.sqlite'}"
    return view.store_url


def _describe(run_dir: Path, kafka: KafkaSettings, view: ViewSettings, api: ServingSettings,
              port: int, pids: dict[str, int]) -> Stack:
    store_url = _store_url(run_dir, view)
    if not api.host.startswith("127.") and api.host != "localhost":
        msg = f"the local stack serves on loopback only, not {api.host}"
        raise StackError(msg)
    return Stack(run_dir=str(run_dir), bootstrap=kafka.bootstrap, store_url=store_url,
                 api_url=f"http://{api.host}:{port}", topic_prefix=kafka.topic_prefix,
                 partitions=kafka.partitions, pids=pids)
