"""The ``fanout generate`` and ``fanout replay`` subcommands.

``infra/cli.py`` owns the ``fanout`` command; it calls :func:`register` with its
subparsers and then ``args.func(args)``, which returns the exit code: 0 when every
event was acknowledged, 1 when some failed or the run was cut short, 2 when it could
not start (bad arguments, no broker). Settings are built here, at the entry point,
from flags that fall back to the environment variables of ``KafkaSettings`` in
``args.environ``: the process's environment, over the run directory's stack's when
``fanout`` runs the command.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import numpy as np

from ingest import generator, history, social
from ingest.errors import BrokerUnavailable, IngestError
from ingest.events import Event, UserUpsert
from ingest.producer import ChangelogProducer
from ingest.replay import DryRunProducer, Sink, replay
from ingest.settings import BOOTSTRAP_ENV, KafkaSettings

log = logging.getLogger(__name__)

NO_BROKER = ("no broker to replay into: run `fanout up` first (it starts a local "
             f"Kafka node), or set {BOOTSTRAP_ENV}, or pass --bootstrap HOST:PORT")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``generate`` and ``replay`` to the ``fanout`` command's subparsers."""
    _add_generate(subparsers)
    _add_replay(subparsers)


def resolve_bootstrap(args: argparse.Namespace) -> str:
    """The broker to produce to: ``--bootstrap``, else ``$KAFKA_BOOTSTRAP``.

    The single hook for finding a broker; raises :class:`BrokerUnavailable` with what
    to do when there is none.
    """
    return _with_broker(args).bootstrap


def _with_broker(args: argparse.Namespace) -> KafkaSettings:
    kafka = KafkaSettings.from_env(args.environ, bootstrap=args.bootstrap,
                                   topic_prefix=args.topic_prefix)
    if not kafka.bootstrap:
        raise BrokerUnavailable(NO_BROKER)
    return kafka


def run_generate(args: argparse.Namespace) -> int:
    """``fanout generate``: write a synthetic history directory."""
    started = time.monotonic()
    try:
        made = generator.generate(
            args.users, args.follows, args.tweets, args.seed, celebrities=args.celebrities,
            celebrity_share=args.celebrity_share, zipf_exponent=args.zipf_exponent,
            delete_ratio=args.delete_ratio, unfollow_ratio=args.unfollow_ratio,
            start_ms=args.start, span_ms=_span_ms(args), mix=record_mix(args))
        if args.readers is not None:
            generator.add_reads(made, args.readers, args.start, _span_ms(args))
    except ValueError as exc:
        print(f"fanout generate: {exc}")
        return 2
    manifest = generator.write(made, Path(args.out))
    counts = ", ".join(f"{k} {v:,}" for k, v in made.counts().items())
    print(f"wrote {manifest.parent} in {time.monotonic() - started:.1f}s: {counts}")
    return 0


def run_replay(args: argparse.Namespace) -> int:
    """``fanout replay``: produce history files into the changelogs."""
    paths = [Path(p) for p in args.paths]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(f"fanout replay: no such file or directory: {', '.join(missing)}")
        return 2
    report = history.ReadReport()
    try:
        sink = _sink(args)
    except IngestError as exc:
        print(f"fanout replay: {exc}")
        return 2
    try:
        streams, total = _plan(paths, args, report)
        summary = replay(history.merge_by_time(*streams), sink, args.speedup,
                         progress=not args.no_progress, report=report, total=total,
                         flush_timeout=args.flush_timeout,
                         max_failures=args.max_failures if args.max_failures >= 0 else None)
    except (IngestError, OSError, ValueError) as exc:
        print(f"fanout replay: {exc}")
        return 2
    finally:
        if isinstance(sink, ChangelogProducer):
            sink.close(timeout=1.0)
    print(summary.render())
    if report.examples or report.out_of_order:
        print("input problems:\n" + report.render())
    return 0 if summary.ok else 1


# -- replay planning ---------------------------------------------------------------

#: How long a replay's records may wait for a broker that went away (seconds).
REPLAY_OUTAGE_S: Final = 300.0


def _sink(args: argparse.Namespace) -> Sink:
    if args.dry_run:
        return DryRunProducer()
    kafka = _with_broker(args)
    # A replay is a batch job: it waits out a broker restart (`fanout down`/`up`, a
    # crash) of up to REPLAY_OUTAGE_S instead of failing the deliveries in flight.
    producer = ChangelogProducer(kafka, backpressure_timeout=REPLAY_OUTAGE_S,
                                 **{"message.timeout.ms": int(REPLAY_OUTAGE_S * 1000)})
    producer.start()
    return producer


def _plan(paths: list[Path], args: argparse.Namespace, report: history.ReadReport
          ) -> tuple[list[Iterable[Event]], int | None]:
    """The event streams to merge, and their total size when it is known."""
    streams: list[Iterable[Event]] = []
    total: int | None = 0
    for path in (p for p in paths if not history.is_edge_list(p)):
        streams.append(history.iter_events(path, report))
        total = _add(total, _known_size(path))
    edges = [p for p in paths if history.is_edge_list(p)]
    if edges:
        more, size = _edge_streams(edges, args, report)
        streams += more
        total = _add(total, size)
    return streams, total


def _edge_streams(paths: list[Path], args: argparse.Namespace, report: history.ReadReport
                  ) -> tuple[list[Iterable[Event]], int]:
    """Edge lists with synthetic times, plus profiles and activity made for their graph."""
    started = time.monotonic()
    censuses = [history.census(p, id_offset=args.id_offset) for p in paths]
    start, span = _window(censuses, args)
    lo, hi = generator.activity_window(start, span)
    times = [history.EdgeTimes.spread(c.edges, lo, hi) for c in censuses]
    streams: list[Iterable[Event]] = [
        history.iter_events(p, report, t, id_offset=args.id_offset)
        for p, t in zip(paths, times, strict=True)]
    counts: dict[int, int] = {}
    for c in censuses:
        for user, n in c.follower_counts.items():
            counts[user] = counts.get(user, 0) + n
    mix = record_mix(args)
    # Activity along the graph needs its edges: one more pass, with the replay's times.
    edges = None if mix.posts_only else _edges(paths, times, args.id_offset)
    made = generator.for_graph(counts, args.generate_tweets, args.seed,
                               delete_ratio=args.delete_ratio, start_ms=start, span_ms=span,
                               mix=mix, edges=edges)
    if args.no_profiles:
        made.users = [u for u in made.users if not isinstance(u, UserUpsert)]
    streams.append(made.events())
    generated = len(made.users) + len(made.follows) + len(made.tweets)
    edge_count = sum(c.edges for c in censuses)
    log.info("edge lists: %d users, %d edges, generated %d events in %.1fs",
             len(counts), edge_count, generated, time.monotonic() - started)
    return streams, edge_count + generated


def _edges(paths: list[Path], times: list[history.EdgeTimes], id_offset: int
           ) -> generator.FollowEdges:
    parts = [history.follow_edges(p, t, id_offset=id_offset)
             for p, t in zip(paths, times, strict=True)]
    return generator.FollowEdges(*(np.concatenate([getattr(e, f.name) for e in parts])
                                   for f in fields(generator.FollowEdges)))


def _window(censuses: list[history.GraphCensus], args: argparse.Namespace
            ) -> tuple[int, int]:
    """``(start_ms, span_ms)`` of generated content: the files' own times if they have them."""
    timed = [c for c in censuses if c.timed and c.first_ms is not None]
    if timed and len(timed) == len(censuses):
        first = min(c.first_ms for c in timed if c.first_ms is not None)
        last = max(c.last_ms for c in timed if c.last_ms is not None)
        return first, max(last - first + 1, 1000)
    return args.start, _span_ms(args)


def _known_size(path: Path) -> int | None:
    manifest = path / generator.MANIFEST
    if path.is_dir() and manifest.exists():
        return sum(json.loads(manifest.read_text())["counts"].values())
    if path.is_file() and path.suffix != ".gz":
        with path.open("rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return None


def _add(total: int | None, size: int | None) -> int | None:
    return None if total is None or size is None else total + size


# -- arguments ---------------------------------------------------------------------


def _add_generate(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate", help="write a synthetic history (users, follows, tweets) to a directory",
        description="Write users.jsonl, follows.jsonl, tweets.jsonl and manifest.json: "
                    "a power-law follow graph, tweets by follower count, some deletes and "
                    "unfollows. Deterministic for a given --seed.")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write")
    p.add_argument("--users", type=_positive, default=10_000, help="(default: %(default)s)")
    p.add_argument("--follows", type=_count, default=100_000, help="(default: %(default)s)")
    p.add_argument("--tweets", type=_count, default=100_000, help="(default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    p.add_argument("--celebrities", type=_count, default=None, metavar="K",
                   help="users with outsized follower counts (default: one per 2,000 users)")
    p.add_argument("--celebrity-share", type=_ratio, default=0.2,
                   help="share of all follow edges pointing at celebrities (default: %(default)s)")
    p.add_argument("--zipf-exponent", type=float, default=0.9,
                   help="exponent of the followee popularity law (default: %(default)s)")
    p.add_argument("--unfollow-ratio", type=_ratio, default=0.05,
                   help="unfollows per follow (default: %(default)s)")
    p.add_argument("--readers", type=_ratio, default=None, metavar="SHARE",
                   help="also write home-timeline reads (activity.jsonl, what inactive users "
                        "are derived from): everyone reads once after signing up, and this "
                        "share of the users keeps reading about daily (default: no reads)")
    _add_time_window(p)
    _add_mix(p, "social")
    p.set_defaults(func=run_generate)


def _add_replay(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "replay", help="produce history files into the changelog topics",
        description="Replay generator directories, .jsonl files, CSV files of records or "
                    "of edges, or SNAP edge lists (optionally gzipped) in event-time order. "
                    "Edge lists get synthetic times spread over the window, user profiles, "
                    "and with --generate-tweets N, N posts by follower-weighted authors; "
                    "with --mix social, also replies, reposts, blocks, mutes and account "
                    "deletions drawn along their graph.")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--speedup", type=_positive_float, default=None, metavar="X",
                   help="pace at the original inter-event times divided by X "
                        "(default: as fast as possible)")
    p.add_argument("--generate-tweets", type=_count, default=0, metavar="N",
                   help="for edge lists: generate N posts (replies included) by "
                        "follower-weighted authors")
    p.add_argument("--no-profiles", action="store_true",
                   help="for edge lists: do not generate user profiles")
    p.add_argument("--id-offset", type=_count, default=0, metavar="N",
                   help="for edge lists: add N to every node id; use 1 for a 0-based "
                        "graph (most SNAP graphs), whose node 0 is otherwise an invalid "
                        "id (default: 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of generated content")
    KafkaSettings.add_flags(p, "bootstrap", "topic_prefix")
    p.add_argument("--flush-timeout", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="how long to wait for acknowledgements at the end (default: 60)")
    p.add_argument("--max-failures", type=int, default=1_000, metavar="N",
                   help="stop once more than N deliveries failed, -1: never (default: 1000)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--dry-run", action="store_true",
                   help="read, validate and encode everything, but send nothing")
    _add_time_window(p)
    _add_mix(p, "posts")
    p.set_defaults(func=run_replay, environ=os.environ)


def _add_mix(p: argparse.ArgumentParser, default: str) -> None:
    s = social.SOCIAL
    g = p.add_argument_group(
        "record mix", "What users do besides posting (DESIGN §4b), drawn along the follow "
                      "graph; each flag below overrides the --mix preset. The social "
                      "figures are in ingest/social.py, with their sources.")
    g.add_argument("--mix", choices=tuple(social.MIXES), default=default,
                   help="posts: posts, deletes and follows only, as before DESIGN §4b; "
                        "social: every record, in realistic proportions "
                        "(default: %(default)s)")
    for name, kind, meaning, social_value in (
            ("replies", _ratio, "share of the posts that are replies", s.replies),
            ("reposts", _nonnegative, "reposts per post", s.reposts),
            ("unrepost-ratio", _ratio, "share of reposts undone", s.unrepost_ratio),
            ("blocks", _nonnegative, "blocks per post", s.blocks),
            ("mutes", _nonnegative, "mutes per post", s.mutes),
            ("unblock-ratio", _ratio, "share of blocks undone", s.unblock_ratio),
            ("unmute-ratio", _ratio, "share of mutes undone", s.unmute_ratio),
            ("account-deletes", _ratio, "share of users whose account is deleted",
             s.account_deletes)):
        g.add_argument(f"--{name}", type=kind, default=None, metavar="X",
                       help=f"{meaning} (social: {social_value:g}, posts: 0)")


def record_mix(args: argparse.Namespace) -> social.RecordMix:
    """The ``--mix`` preset with the flags given over it."""
    given = {f.name: getattr(args, f.name) for f in fields(social.RecordMix)
             if getattr(args, f.name) is not None}
    return replace(social.MIXES[args.mix], **given)


def _add_time_window(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delete-ratio", type=_ratio, default=0.02,
                   help="deletes per generated tweet (default: %(default)s)")
    p.add_argument("--start", type=_start_ms, default=generator.DEFAULT_START_MS,
                   metavar="DATE|MS", help="start of the history, ISO date or epoch ms "
                                           "(default: 2024-01-01)")
    p.add_argument("--span-days", type=_positive_float, default=30.0,
                   help="length of the history in days (default: %(default)s)")


def _span_ms(args: argparse.Namespace) -> int:
    return int(args.span_days * 86_400_000)


def _start_ms(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        msg = f"{text!r} is not an ISO date or epoch ms"
        raise argparse.ArgumentTypeError(msg) from None
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000)


def _count(text: str) -> int:
    value = int(text.replace("_", ""))
    if value < 0:
        msg = "must be >= 0"
        raise argparse.ArgumentTypeError(msg)
    return value


def _positive(text: str) -> int:
    value = _count(text)
    if value < 1:
        msg = "must be >= 1"
        raise argparse.ArgumentTypeError(msg)
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        msg = "must be > 0"
        raise argparse.ArgumentTypeError(msg)
    return value


def _nonnegative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        msg = "must be >= 0"
        raise argparse.ArgumentTypeError(msg)
    return value


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        msg = "must be in [0, 1)"
        raise argparse.ArgumentTypeError(msg)
    return value
