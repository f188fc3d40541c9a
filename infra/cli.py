"""The ``fanout`` command: composes ingest, views, serving and loadgen.

Subcommands: ``up``/``down``/``status`` (the local stack), ``broker``/``job``/``serve``
(one service in the foreground; ``up`` runs these detached), ``generate``/``replay``
(ingest), ``verify``, ``dead-letters``, ``rebuild``, ``nemesis`` (network faults on a
stack on hosts) and ``demo``. Flags fall back to environment variables (named in each
``--help``). Each command builds its settings here or in the module that registers it,
from its flags over ``args.environ``: the process's environment, over the settings of
the stack recorded in the run directory, so that commands point at that stack unless
told otherwise.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from infra import webclient
from infra.checks import verifier as verifier_cli
from infra.errors import InfraError
from infra.faults import nemesis as nemesis_cli
from infra.load import run as load_cli
from infra.ops import rebuild as rebuild_cli
from infra.ops import schema as schema_cli
from infra.services import archive_builder as archive_builder_cli
from infra.services import cassandra as cassandra_cli
from infra.services import jars as jars_cli
from infra.services.process import stop_on_signals
from infra.settings import (
    HOSTS_ENV,
    HOSTS_NET_ENV,
    RUN_DIR_ENV,
    SPARK_DRIVER_HOST_ENV,
    SPARK_MASTER_ENV,
    VERIFIER_ENV,
)
from infra.stack import stack as stack_mod
from ingest.settings import BOOTSTRAP_ENV, KafkaSettings, SettingsError
from serving import cli as serving_cli
from serving.settings import API_PORT_ENV, ServingSettings
from views.metrics import JobMetricsSettings, summary
from views.settings import DEFAULT_RUN_DIR, STORE_ENV, ViewSettings

log = logging.getLogger("fanout")

#: Libraries whose INFO lines are about themselves, not about fanout.
_CHATTY_LOGGERS = ("httpx", "httpcore")
#: Commands that start a stack or a piece of one: they see the process's environment
#: only, never the settings of a stack already recorded in the run directory.
_OWN_ENVIRONMENT = frozenset({"up", "broker", "cassandra", "demo", "jars"})


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fanout`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO ("HTTP Request: GET ..."): noise between the
    # progress lines of `fanout demo` and `fanout up`. -v brings it back.
    for name in () if args.verbose else _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    args.run_dir = Path(args.run_dir or os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR)
    args.environ = _environ(args.run_dir, args.command)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except InfraError as exc:
        log.error("%s", exc)
        return 1
    except SettingsError as exc:
        log.error("fanout %s: %s", args.command, exc)
        return 2


def _environ(run_dir: Path, command: str | None) -> Mapping[str, str]:
    """The environment the command's settings fall back to.

    The process's environment over the run directory's stack's settings (whether or
    not its services run): ``fanout job`` and ``fanout serve`` restarted by hand get
    the stack's settings, and other commands name the stack's broker and store, while
    env vars and flags still win.
    """
    stack = None if command in _OWN_ENVIRONMENT else stack_mod.Stack.load(run_dir)
    return os.environ if stack is None else {**stack.env(), **os.environ}


def _parser() -> argparse.ArgumentParser:
    from ingest import cli as ingest_cli

    parser = argparse.ArgumentParser(prog="fanout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default=None,
                        help=f"run directory of the local stack (env {RUN_DIR_ENV}; "
                             f"default: ./{DEFAULT_RUN_DIR})")
    parser.add_argument("-v", "--verbose", action="store_true")
    # main() replaces it with the stack's fallback; callers of _parser() get the process's.
    parser.set_defaults(environ=os.environ)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_stack(sub)
    _add_services(sub)
    ingest_cli.register(sub)
    serving_cli.register(sub)
    _add_verify(sub)
    _add_dead_letters(sub)
    rebuild_cli.register(sub)
    schema_cli.register(sub)
    _add_demo(sub)
    load_cli.register(sub)
    jars_cli.register(sub)
    archive_builder_cli.register(sub)
    cassandra_cli.register(sub)
    verifier_cli.register(sub)
    nemesis_cli.register(sub)
    return parser


# -- up / down / status ----------------------------------------------------------------

def _add_stack(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start whatever of Kafka, the view job and the API is not "
                                  "running in the run directory (resuming from its data)")
    p.add_argument("--port", type=int, default=None,
                   help=f"API port (env {API_PORT_ENV}; default: a free port)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for start")
    p.add_argument("--store", choices=("sqlite", "cassandra"), default=None,
                   help="the store of a new stack: an SQLite file in the run directory "
                        "(default), or a local Cassandra node in RUN_DIR/cassandra (env "
                        f"{STORE_ENV}=cassandra://local; any other {STORE_ENV} URL is used "
                        "as it is)")
    p.add_argument("--cluster", action="store_true",
                   help="run the view job on a Spark standalone master and worker that 'up' "
                        f"starts on loopback (RUN_DIR/spark); {SPARK_MASTER_ENV}=spark://... "
                        "names an existing cluster instead")
    p.add_argument("--nodes", type=int, default=None, metavar="N",
                   help="a new stack of N-node clusters on this machine: N KRaft Kafka nodes "
                        "(topics at RF N), N Cassandra nodes on 127.0.0.1..N (keyspace at RF "
                        "N, LOCAL_QUORUM) and a Spark master with 2 workers (default: one "
                        "node of each, as before)")
    p.add_argument("--hosts", action="store_true",
                   help="with --nodes: run each Kafka, Cassandra and Spark node in a network "
                        "namespace of its own, on a bridge the stack makes (needs root; "
                        f"env {HOSTS_ENV}=on); `fanout nemesis` then injects network faults")
    p.add_argument("--hosts-net", default=None, metavar="CIDR",
                   help="the hosts' private subnet (env "
                        f"{HOSTS_NET_ENV}; default: the first free 10.213.K.0/24)")
    p.add_argument("--verifier", action=argparse.BooleanOptionalAction, default=None,
                   help="run the live verifier, which compares a few sampled users' pages "
                        "a second with the log, or not; kept for later 'up's (env "
                        f"{VERIFIER_ENV}; default: on)")
    _add_view_flags(p)
    p.set_defaults(func=_cmd_up)
    p = sub.add_parser("down", help="stop the stack's services; its data stays for 'up'")
    p.set_defaults(func=_cmd_down)
    p = sub.add_parser("status", help="what is running in the run directory, and how far "
                                      "behind the view job is (offsets behind, post -> "
                                      "visible, its last batch)")
    p.set_defaults(func=_cmd_status)


def _add_view_flags(p: argparse.ArgumentParser) -> None:
    ViewSettings.add_flags(p, "celebrity_threshold", "timeline_cap")


def _view_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`ViewSettings` fields that ``_add_view_flags`` sets (None: not given)."""
    return {"celebrity_threshold": args.celebrity_threshold, "timeline_cap": args.timeline_cap}


def _view_env(args: argparse.Namespace) -> dict[str, str]:
    """The view flags given, as the environment of the stack's job."""
    names = ViewSettings.env_names()
    return {names[field]: str(value) for field, value in _view_flags(args).items() if value}


def _cmd_up(args: argparse.Namespace) -> int:
    from infra.stack.launch import up

    before = stack_mod.Stack.load(args.run_dir)
    was = before.state() if before else {}
    extra = _view_env(args)
    if args.hosts or args.hosts_net:
        if not args.nodes or args.nodes < 2:
            log.error("--hosts gives each node of a multi-node stack a host: use it with "
                      "--nodes N (N >= 2) on a new run directory")
            return 2
        extra[HOSTS_ENV] = "on"
        if args.hosts_net:
            extra[HOSTS_NET_ENV] = args.hosts_net
    running = up(args.run_dir, port=args.port, extra_env=extra, store=args.store,
                 cluster=args.cluster, timeout=args.timeout, nodes=args.nodes,
                 verifier=args.verifier)
    for name, pid in running.pids.items():
        verb = "was running" if was.get(name) == "running" else "started"
        print(f"  {name}: {verb} (pid {pid})")
    kafka = running.bootstrap + ("" if running.local_kafka else " (external)")
    print(f"fanout is up in {running.run_dir}: API {running.api_url}, Kafka {kafka}, "
          f"store {running.store_url}")
    print(f"stop it with: fanout --run-dir {running.run_dir} down")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    before = stack_mod.Stack.load(args.run_dir)
    was = before.state() if before else {}
    stack_mod.down(args.run_dir)
    stopped = sorted(name for name, state in was.items() if state == "running")
    print(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")
    if before is not None:
        print(f"topics, checkpoint and store stay in {before.run_dir}: `fanout up` resumes")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    running = stack_mod.Stack.load(args.run_dir)
    if running is None:
        print(f"nothing is up in {args.run_dir}")
        return 1
    state = running.state()
    shown: dict[str, Any] = {"api": running.api_url, "kafka": running.bootstrap,
                             "store": running.store_url, "services": state}
    if state.get("job") == "running":
        shown["view_job"] = job_at_a_glance(running.job_metrics_url())
    if state.get("verifier") == "running":
        shown["verifier"] = _verifier_at_a_glance(running.verifier_url())
    if state.get(stack_mod.BESIDE) == "running":  # a view built beside (fanout rebuild --beside)
        from infra.ops.beside import metrics_url

        shown["view_beside"] = job_at_a_glance(metrics_url(running))
    print(json.dumps(shown, indent=2))
    if any(s != "running" for s in state.values()):
        print(f"start what is stopped with: fanout --run-dir {running.run_dir} up",
              file=sys.stderr)
        return 1
    return 0


def job_at_a_glance(url: str | None) -> dict[str, Any]:
    """Offsets behind, post -> visible p99 and the last batch, from the job's endpoint."""
    if url is None:
        return {"metrics": None, "error": "no metrics endpoint recorded: restart the job "
                                          "with `fanout down` and `fanout up`"}
    try:
        response = webclient.get(url, timeout=3.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        return {"metrics": url, "error": f"no answer: {exc}"}
    return {"metrics": url, **summary(response.text, time.time())}


def _verifier_at_a_glance(url: str | None) -> dict[str, Any]:
    """Users checked, divergent and skipped so far, from the live verifier's endpoint."""
    if url is None:
        return {"metrics": None, "error": "no metrics endpoint recorded"}
    try:
        response = webclient.get(url, timeout=3.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        return {"metrics": url, "error": f"no answer: {exc}"}
    return {"metrics": url, **verifier_cli.summary(response.text)}


# -- services in the foreground ----------------------------------------------------------

def _add_services(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("broker", help="run the local Kafka node, its log in RUN_DIR/kafka "
                                      "(foreground)")
    p.add_argument("--ready-file", type=Path, default=None,
                   help="write the bootstrap address here once serving")
    p.set_defaults(func=_cmd_broker)
    p = sub.add_parser("job", help="run the streaming view job (foreground)")
    p.add_argument("--ready-file", type=Path, default=None,
                   help="touch this file once the query has started")
    _add_view_flags(p)
    p.set_defaults(func=_cmd_job)
    p = sub.add_parser("serve", help="run the HTTP API (foreground)")
    p.set_defaults(func=_cmd_serve)


def _cmd_broker(args: argparse.Namespace) -> int:
    from infra.services.broker import KafkaBroker

    stop = stop_on_signals()
    with KafkaBroker(args.run_dir / "kafka", args.run_dir / "logs" / "kafka.log") as broker:
        if args.ready_file:
            args.ready_file.write_text(broker.bootstrap)
        print(f"Kafka on {broker.bootstrap} (pid {broker.pid}); Ctrl-C stops it", flush=True)
        stop.wait()
    return 0


def _cmd_job(args: argparse.Namespace) -> int:
    from infra.services.spark import build_session
    from views.job import run

    kafka = KafkaSettings.from_env(args.environ)
    view = ViewSettings.from_env(args.environ, **_view_flags(args))
    if not kafka.bootstrap:
        log.error("%s is not set and no stack is in %s: run 'fanout up' first",
                  BOOTSTRAP_ENV, args.run_dir)
        return 2
    driver = args.environ.get(SPARK_DRIVER_HOST_ENV)
    if driver:  # executors on hosts of their own reach the driver on the bridge
        os.environ["SPARK_LOCAL_IP"] = driver
    conf = {"spark.driver.host": driver, "spark.driver.bindAddress": driver} if driver else {}
    with stack_mod.job_lock(view.checkpoint_dir):
        spark = build_session("fanout-views", shuffle_partitions=view.shuffle_partitions,
                              master=args.environ.get(SPARK_MASTER_ENV), extra_conf=conf,
                              scratch=stack_mod.job_scratch(view.checkpoint_dir))
        ready = args.ready_file
        return run(spark, kafka, view, stop=stop_on_signals(),
                   on_started=(lambda: ready.write_text("started")) if ready else None,
                   metrics=JobMetricsSettings.from_env(args.environ))


def _cmd_serve(args: argparse.Namespace) -> int:
    from serving.app import serve

    serve(ServingSettings.from_env(args.environ), KafkaSettings.from_env(args.environ))
    return 0


# -- verify / dead letters / demo --------------------------------------------------------

def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="compare the store with the SQL recomputed from the log")
    p.add_argument("--sample", type=int, default=None, metavar="N",
                   help="check N random users instead of all")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="first wait up to this long for the view to catch up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--entries", type=_count("--entries", 1, "entries"), default=None,
                   metavar="N",
                   help="check only the first N entries of each timeline (its first pages; "
                        "default: the whole cached timeline)")
    p.add_argument("--workers", type=_count("--workers", 1, "processes"), default=None,
                   metavar="N",
                   help="processes reading the served timelines beside the recomputation "
                        "(default: one per core)")
    p.set_defaults(func=_cmd_verify)


def _count(flag: str, least: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least``, else a message naming ``flag``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = least - 1
        if n < least:
            msg = f"{flag} takes a count of {what}, at least {least}; got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return n
    return parse


def _cmd_verify(args: argparse.Namespace) -> int:
    from infra.checks.verify import verify
    from views.stores import store_from_url

    kafka, view = KafkaSettings.from_env(args.environ), ViewSettings.from_env(args.environ)
    if not kafka.bootstrap:
        log.error("%s is not set and no stack is up: run 'fanout up' first", BOOTSTRAP_ENV)
        return 2
    # Reader processes reopen the store (one per core) when it is read in process.
    opener = functools.partial(store_from_url, view.store_url, cap=view.timeline_cap)
    with store_from_url(view.store_url, cap=view.timeline_cap) as store:
        result = verify(kafka, store, view.timeline_cap, sample=args.sample, wait=args.wait,
                        seed=args.seed, progress=True, entries=args.entries, opener=opener,
                        workers=args.workers, lateness=view.lateness_ms())
    print(result.render())
    return 0 if result.ok else 1


def _add_dead_letters(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dead-letters", help="list changelog records that failed validation")
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(func=_cmd_dead_letters)


def _cmd_dead_letters(args: argparse.Namespace) -> int:
    from views.stores import store_from_url

    view = ViewSettings.from_env(args.environ)
    with store_from_url(view.store_url, cap=view.timeline_cap) as store:
        letters = store.dead_letters(args.limit)
    for d in letters:
        raw = d.raw[:80].decode("utf-8", "replace")
        print(f"{d.topic}[{d.partition}]@{d.offset}: {d.reason} | {raw}")
    print(f"{len(letters)} dead letter(s) shown")
    return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the whole pipeline end to end on local defaults")
    p.add_argument("--users", type=int, default=2_000)
    p.add_argument("--follows", type=int, default=30_000)
    p.add_argument("--tweets", type=int, default=20_000)
    p.add_argument("--celebrity-threshold", type=int, default=300)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--verify-entries", default=100, metavar="N",
                   type=_count("--verify-entries", 0, "entries (0: whole timelines)"),
                   help="verify the first N entries of every user's home timeline (default "
                        "100, the first pages a client reads: about 10 s here; 0: whole "
                        "timelines, as `fanout verify` does, about 40 s)")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from infra.demo import demo

    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
