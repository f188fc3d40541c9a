"""``fanout rebuild``: set the views aside so that the next job rebuilds them from the log.

The views are derived data (DESIGN §2): a store plus the Spark checkpoint that says
how much of the changelogs the store reflects. When the changelogs lose records the
checkpoint has read — topics deleted and recreated, a Kafka log directory lost —
the two no longer describe the log, and the job refuses to go on (``OffsetsPastEnd`` in ``views.source``). This
module owns the documented way out: with the job stopped, move the checkpoint
directory and the SQLite store (with its ``-wal``/``-shm`` files) aside under a
timestamped name (or delete them with ``--force``). It stops nothing itself: it
refuses while the stack's view job runs. The next ``fanout job``/``fanout up`` then
starts from the earliest offsets into an empty store, and the user replays the
history into the broker. It also tells ``fanout up`` when a run directory holds
views that a fresh, empty Kafka log cannot match (:func:`infra.settings.stale_views`).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from infra.settings import run_dir_views, sqlite_path
from infra.stack.stack import Stack, StackError, alive
from views.settings import CHECKPOINT_DIR_ENV, CHECKPOINTS, STORE_ENV, STORE_FILE, ViewSettings

log = logging.getLogger(__name__)

#: Suffixes of the files SQLite keeps beside a database in WAL mode.
_SQLITE_COMPANIONS = ("-wal", "-shm")


def view_paths(run_dir: Path, environ: Mapping[str, str]) -> tuple[Path, Path | None, str]:
    """(checkpoint directory, SQLite store file or None, store URL) of ``run_dir``.

    The environment wins (``FANOUT_CHECKPOINT_DIR``, ``FANOUT_STORE``); otherwise the
    places ``fanout up`` uses inside the run directory.
    """
    view = run_dir_views(run_dir, environ)
    return view.checkpoint_dir, sqlite_path(view.store_url), view.store_url


def rebuild(run_dir: Path, environ: Mapping[str, str], *, force: bool = False,
            now: float | None = None) -> list[str]:
    """Move (or with ``force`` delete) the checkpoint and the store; say what was done.

    ``environ`` names them (else they are the run directory's): see :func:`view_paths`.
    """
    checkpoint, store, url = view_paths(run_dir, environ)
    if store is None:
        msg = (f"the store {url.split('@')[-1]} is not a SQLite file: point {STORE_ENV} at "
               "a fresh keyspace (`fanout schema apply`) and move the checkpoint "
               f"{checkpoint} aside yourself")
        raise StackError(msg)
    _refuse_while_running(run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    done = []
    targets = [checkpoint, store, *(Path(f"{store}{s}") for s in _SQLITE_COMPANIONS)]
    for path in targets:
        if path.exists():
            done.append(_delete(path) if force else _set_aside(path, stamp))
    return done


def _refuse_while_running(run_dir: Path) -> None:
    stack = Stack.load(run_dir)
    if stack is None:
        return
    job = stack.pids.get("job")
    if job and alive(job):
        msg = (f"the view job of the stack in {run_dir} runs (pid {job}): stop it first "
               f"(`fanout --run-dir {run_dir} down`); rebuild stops nothing itself")
        raise StackError(msg)
    api = stack.pids.get("api")
    if api and alive(api):
        log.warning("the API (pid %d) keeps serving the old store until it is restarted", api)


def _set_aside(path: Path, stamp: str) -> str:
    """``fanout.sqlite`` → ``fanout.aside-<stamp>.sqlite`` (``-wal`` kept last)."""
    name, tail = path.name, ""
    for suffix in _SQLITE_COMPANIONS:
        if name.endswith(suffix):
            name, tail = name.removesuffix(suffix), suffix
    base = Path(name)
    target = path.with_name(f"{base.stem}.aside-{stamp}{base.suffix}{tail}")
    path.rename(target)
    return f"moved {path} to {target}"


def _delete(path: Path) -> str:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    return f"deleted {path}"


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``fanout rebuild`` to the ``fanout`` command."""
    p = sub.add_parser(
        "rebuild", help="rebuild the views from the topics: beside the live ones, then "
                   "switch (--beside), or set them aside for the next job",
        description=f"With the view job stopped, move the checkpoint (env "
                    f"{CHECKPOINT_DIR_ENV}; default RUN_DIR/{CHECKPOINTS}) and the SQLite "
                    f"store (env {STORE_ENV}; default RUN_DIR/{STORE_FILE}) aside, so "
                    "that the next `fanout job`/`fanout up` rebuilds the views from "
                    "whatever the topics hold. Use it when the job stops because the "
                    "topics end before its checkpoint (topics recreated, a Kafka "
                    "log lost); then replay the history into the broker.")
    p.add_argument("--force", action="store_true",
                   help="delete the checkpoint and the store instead of moving them aside")
    side = p.add_argument_group(
        "beside the live view", "Build a new view from the topics with a second job while "
        "the live job and the API go on, verify it, then switch every API worker to it "
        "(infra.ops.beside). Use it to change a setting the checkpoint cannot take, or when a "
        "new version cannot resume the checkpoint.")
    side.add_argument("--beside", action="store_true",
                      help="build a new view beside the live one, then switch reads to it "
                           "(again after an interruption: resume that build)")
    side.add_argument("--back", action="store_true",
                      help="switch back to the view the last switch replaced (its job "
                           "resumes and catches up first)")
    side.add_argument("--drop-old", action="store_true",
                      help="delete the view the last switch replaced")
    side.add_argument("--abandon", action="store_true",
                      help="with --beside: stop the build under way and delete its view")
    side.add_argument("--sample", type=int, default=None, metavar="N",
                      help="verify N random users of the new view before the switch "
                           "(default: every user)")
    side.add_argument("--timeout", type=float, default=1800.0, metavar="SECONDS",
                      help="longest wait for the new view's job to start, and to catch up")
    env = ViewSettings.env_help
    for flag, name in _BESIDE_SETTINGS.items():
        side.add_argument(flag, type=int, default=None, dest=name,
                          help=f"the new view's {name.replace('_', ' ')} ({env(name)})")
    side.add_argument("--kafka-source", choices=("spark", "python"), default=None,
                      help=f"the Kafka source of the new view's job ({env('kafka_source')})")
    p.set_defaults(func=_cmd_rebuild)


#: The settings ``--beside`` may change, as flags: what a checkpoint cannot take.
_BESIDE_SETTINGS = {"--timeline-cap": "timeline_cap",
                    "--celebrity-threshold": "celebrity_threshold",
                    "--key-buckets": "key_buckets", "--shuffle-partitions": "shuffle_partitions"}


def _cmd_rebuild(args: argparse.Namespace) -> int:
    chosen = [f for f in ("beside", "back", "drop_old") if getattr(args, f)]
    if len(chosen) > 1 or (args.abandon and not args.beside):
        msg = "give one of --beside, --back and --drop-old (--abandon goes with --beside)"
        raise StackError(msg)
    if chosen:
        return _cmd_beside(args)
    return _cmd_set_aside(args)


def _cmd_beside(args: argparse.Namespace) -> int:
    from infra.ops import beside

    run_dir = Path(args.run_dir)
    if args.drop_old:
        beside.drop_old(run_dir)
    elif args.abandon:
        beside.abandon(run_dir)
    elif args.back:
        beside.back(run_dir, sample=args.sample, timeout=args.timeout)
    else:
        names = ViewSettings.env_names()
        overrides = {names[n]: str(getattr(args, n))
                     for n in (*_BESIDE_SETTINGS.values(), "kafka_source")
                     if getattr(args, n) is not None}
        beside.build(run_dir, overrides, sample=args.sample, timeout=args.timeout)
    return 0


def _cmd_set_aside(args: argparse.Namespace) -> int:
    done = rebuild(Path(args.run_dir), args.environ, force=args.force)
    for line in done:
        print(line)
    if not done:
        print("nothing to set aside: no checkpoint and no store")
    print("next: start the view job (`fanout job` or `fanout up`), then replay the history "
          "into the broker (`fanout replay DIR`) if its topics are empty")
    return 0
