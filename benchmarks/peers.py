"""The home-timeline view on two peer engines: Pathway (incremental) and DuckDB (batch).

    python3.11 benchmarks/peers.py --setup                  # make .venv-peers (once)
    .venv-peers/bin/python benchmarks/peers.py --selftest 3000
    .venv-peers/bin/python benchmarks/peers.py --engine pathway --events EVENTS.jsonl \\
        --out result.json [--batch 10000] [--threads 1]
    .venv-peers/bin/python benchmarks/peers.py --engine pathway-cap --events EVENTS.jsonl \\
        --out result.json [--cap 800] [--batch 10000]
    .venv-peers/bin/python benchmarks/peers.py --engine duckdb --events EVENTS.jsonl \\
        --out result.json [--cap 800] [--every 10000]

What a user might pick instead of fanout, run on the same events: the view of DESIGN §4
(every user's followees' live tweets, newest first, ``LIMIT N``) kept by

- ``pathway``: Pathway's natural formulation, the join without a cap. The events are
  streamed into one Python connector in file order, one commit (one Pathway time) per
  ``--batch`` events; in the dataflow the latest op per follow edge wins (``max`` of
  ``seq*2+live``), posts and deletes are grouped by tweet id, live tweets are the posts
  minus the deletes, and follows ⋈ live tweets is the view. Its rows are collected by
  ``pw.io.subscribe``. Checked against the uncapped view.
- ``pathway-cap``: the same, then the exact top ``--cap`` per user, the way Pathway's
  own stdlib takes a top k (``hybrid_index``): ``groupby(user)`` with a
  ``sorted_tuple`` reducer and a deterministic UDF that slices it. Each user's
  timeline is one row, a tuple of tweet ids.
- ``duckdb``: a batch engine. Every ``--every`` events the new events are loaded into
  tables (live follow edges, tweets, deleted ids) and the capped view is recomputed
  whole with ``CREATE OR REPLACE TABLE home AS ... QUALIFY row_number() OVER
  (PARTITION BY user ORDER BY t DESC, tweet_id DESC) <= N``.

``seconds`` runs from the first event handed to the engine to the final view
materialized: building the engine's input (connector rows, DataFrames) is included;
imports, reading and parsing the JSONL file, and the check are not. Records that do
not touch the view (``"op": "other"``) count in ``events`` but are not handed to the
engines. ``--threads`` sets Pathway's workers (``PATHWAY_THREADS``) and DuckDB's
``threads``; both default to 1. ``peak_rss_mb`` is the process's peak RSS when the
engine is done (the parsed events included, the check not).

Each final view is compared, as a set of (user, tweet_id) rows, with :func:`brute`, a
plain-Python recomputation (untimed), so that a fast wrong answer does not count.

Input, one JSON object per line, in the order to apply them (event time):
``{"op": "follow"|"unfollow", "follower", "followee", "t"}``,
``{"op": "post"|"delete", "tweet_id", "author", "t"}`` or ``{"op": "other"}``. The
latest op per (follower, followee) in file order wins; a delete marks its tweet id
deleted for good, even before the post; duplicates are set semantics (a duplicated post
is the same post).

Neither engine is a product dependency: they live in their own virtualenv
``.venv-peers`` (the ``peers`` extra of pyproject.toml names the versions), made by
``--setup`` or :func:`ensure_venv`. This file imports no project module and, at module
level, nothing but the standard library, so ``benchmarks/bench_peers.py`` can import
:func:`ensure_venv` and run the engines here in a subprocess.

Flink SQL, the third peer, reads the events from Kafka rather than from a file, and
has a virtualenv of its own: ``benchmarks/peers_flink.py`` (it checks its view with
:func:`brute` too).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

ROOT: Final = Path(__file__).resolve().parent.parent
VENV: Final = ".venv-peers"
REQUIREMENTS: Final = ("pathway==0.33.0", "duckdb==2.0.0")
ENGINES: Final = ("pathway", "pathway-cap", "duckdb")
PROGRESS_EVERY: Final = 50_000

FOLLOW: Final = 0
UNFOLLOW: Final = 1
POST: Final = 2
DELETE: Final = 3
OTHER: Final = 4
_OPS: Final = {"follow": FOLLOW, "unfollow": UNFOLLOW, "post": POST, "delete": DELETE,
               "other": OTHER}


class Event(NamedTuple):
    """One input line: ``a, b`` are (follower, followee) or (tweet_id, author)."""

    kind: int
    a: int
    b: int
    t: int


Row = tuple[int, int]  # (user, tweet_id)


@dataclass
class Result:
    engine: str
    events: int
    applied: int
    seconds: float
    events_per_s: float
    view_rows: int
    equal_to_brute: bool
    mismatches: int
    threads: int
    version: str
    peak_rss_mb: float
    cap: int
    batch: int
    #: Pathway: times (commits) the subscription saw end; DuckDB: recomputes of ``home``.
    steps: int
    #: Pathway only: from ``pw.run`` called to the first event fed (not in ``seconds``).
    startup_s: float = 0.0


# --- the virtualenv ---------------------------------------------------------------


def venv_python(root: Path = ROOT, venv: str = VENV) -> Path:
    """The interpreter of ``root``'s peer virtualenv (whether or not it exists yet)."""
    return root / venv / "bin" / "python"


def _venv_ready(python: Path, requirements: Sequence[str] = REQUIREMENTS) -> bool:
    check = ("import importlib.metadata as m, sys; "
             f"sys.exit(0 if [m.version(p.split('==')[0]) for p in {list(requirements)!r}]"
             f" == [p.split('==')[1] for p in {list(requirements)!r}] else 1)")
    return python.exists() and subprocess.run([str(python), "-c", check],
                                              capture_output=True).returncode == 0


def ensure_venv(root: Path = ROOT, venv: str = VENV,
                requirements: Sequence[str] = REQUIREMENTS) -> Path:
    """Make ``root/.venv-peers`` with Pathway and DuckDB if it is not there; its python.

    Created with ``python3.11 -m venv`` (or this interpreter if it is a 3.11) and
    filled by pip from PyPI; an existing venv with the right versions is left alone.
    ``venv`` and ``requirements`` make another peer's virtualenv the same way
    (``peers_flink.py``'s ``.venv-flink``).
    """
    python = venv_python(root, venv)
    if _venv_ready(python, requirements):
        return python
    if not python.exists():
        base = "python3.11" if sys.version_info[:2] != (3, 11) else sys.executable
        subprocess.run([base, "-m", "venv", str(root / venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *requirements], check=True)
    return python


# --- input and the check ----------------------------------------------------------


def read_events(path: Path) -> list[Event]:
    """The events of a JSONL file, in file order (``ValueError`` on a malformed line)."""
    events: list[Event] = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                kind = _OPS[record["op"]]
                if kind in (FOLLOW, UNFOLLOW):
                    event = Event(kind, int(record["follower"]), int(record["followee"]),
                                  int(record["t"]))
                elif kind in (POST, DELETE):
                    event = Event(kind, int(record["tweet_id"]), int(record["author"]),
                                  int(record["t"]))
                else:
                    event = Event(OTHER, 0, 0, 0)
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not an event: {exc!r}") from exc
            events.append(event)
    return events


def brute(events: Sequence[Event], cap: int) -> set[Row]:
    """The final view recomputed in plain Python: (user, tweet_id) rows, ``cap`` 0 = all."""
    edges: dict[tuple[int, int], bool] = {}
    posts: dict[int, tuple[int, int]] = {}
    deleted: set[int] = set()
    for kind, a, b, t in events:
        if kind in (FOLLOW, UNFOLLOW):
            edges[a, b] = kind == FOLLOW
        elif kind == POST:
            posts.setdefault(a, (b, t))
        elif kind == DELETE:
            deleted.add(a)
    by_author: dict[int, list[tuple[int, int]]] = {}
    for tweet_id, (author, t) in posts.items():
        if tweet_id not in deleted:
            by_author.setdefault(author, []).append((t, tweet_id))
    timelines: dict[int, list[tuple[int, int]]] = {}
    for (follower, followee), live in edges.items():
        if live and followee in by_author:
            timelines.setdefault(follower, []).extend(by_author[followee])
    rows: set[Row] = set()
    for user, entries in timelines.items():
        if cap:
            entries = sorted(entries, reverse=True)[:cap]
        rows.update((user, tweet_id) for _, tweet_id in entries)
    return rows


def _progress(engine: str, done: int, total: int, started: float) -> None:
    print(f"{engine}: {done:,}/{total:,} events ({time.perf_counter() - started:.1f} s)",
          file=sys.stderr, flush=True)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class Run(NamedTuple):
    """What an engine hands back: its final view, timing and version."""

    rows: set[Row]
    seconds: float
    steps: int
    version: str
    peak_rss_mb: float
    startup_s: float = 0.0


# --- Pathway ----------------------------------------------------------------------


def run_pathway(events: Sequence[Event], cap: int, batch: int, threads: int) -> Run:
    """Stream ``events`` into Pathway, one commit per ``batch``; the view, capped if ``cap``."""
    os.environ["PATHWAY_THREADS"] = str(threads)
    import pathway as pw

    engine = "pathway-cap" if cap else "pathway"
    clock: dict[str, float] = {}

    class EventSchema(pw.Schema):
        kind: int
        a: int
        b: int
        t: int
        seq: int

    class Feed(pw.io.python.ConnectorSubject):
        """The view-relevant events in file order, a commit every ``batch`` events."""

        def run(self) -> None:
            clock["first_event"] = time.perf_counter()
            for seq, (kind, a, b, t) in enumerate(events, 1):
                if kind != OTHER:
                    self.next(kind=kind, a=a, b=b, t=t, seq=seq)
                if seq % batch == 0:
                    self.commit()
                if seq % PROGRESS_EVERY == 0:
                    _progress(f"{engine} (fed)", seq, len(events), clock["first_event"])
            self.commit()

        @property
        def _deletions_enabled(self) -> bool:
            return False

    log = pw.io.python.read(Feed(), schema=EventSchema, autocommit_duration_ms=None,
                            name="events")
    # Follow edges: the latest op in file order wins; seq*2 + 1 for a follow, + 0 for
    # an unfollow, so the max of the codes is the latest op and its parity is liveness.
    latest = (log.filter(log.kind <= UNFOLLOW)
              .groupby(pw.this.a, pw.this.b)
              .reduce(follower=pw.this.a, followee=pw.this.b,
                      code=pw.reducers.max(pw.this.seq * 2 + 1 - pw.this.kind)))
    follows = latest.filter(latest.code % 2 == 1)
    posts = (log.filter(log.kind == POST).groupby(pw.this.a)
             .reduce(tweet_id=pw.this.a, author=pw.reducers.min(pw.this.b),
                     t=pw.reducers.min(pw.this.t)))
    deletes = log.filter(log.kind == DELETE).groupby(pw.this.a).reduce(tweet_id=pw.this.a)
    live = posts.difference(deletes)  # same grouping key, same ids: an anti-join
    joined = follows.join(live, follows.followee == live.author).select(
        user=follows.follower, tweet_id=live.tweet_id, t=live.t)

    # The callbacks' parameter names are Pathway's: it passes them by keyword.
    times = [0]
    multiset: dict[Row, int] = {}
    timelines: dict[int, tuple[int, ...]] = {}

    def on_time_end(time: int) -> None:
        times[0] += 1

    if cap:
        @pw.udf(deterministic=True)
        def top(items: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
            return tuple(-tweet_id for _, tweet_id in items[:cap])

        grouped = joined.groupby(joined.user).reduce(
            user=pw.this.user,
            items=pw.reducers.sorted_tuple(pw.make_tuple(-pw.this.t, -pw.this.tweet_id)))
        capped = grouped.select(user=grouped.user, top=top(grouped.items))

        def on_timeline(key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
            # A user's row is replaced: the retraction and the addition may come in
            # either order within one time, so only retract the value still held.
            if is_addition:
                timelines[row["user"]] = row["top"]
            elif timelines.get(row["user"]) == row["top"]:
                del timelines[row["user"]]

        pw.io.subscribe(capped, on_timeline, on_time_end=on_time_end)
    else:
        def on_row(key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
            entry = (row["user"], row["tweet_id"])
            count = multiset.get(entry, 0) + (1 if is_addition else -1)
            if count:
                multiset[entry] = count
            else:
                del multiset[entry]

        pw.io.subscribe(joined, on_row, on_time_end=on_time_end)

    called = time.perf_counter()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE, terminate_on_error=True,
           default_logging=False)
    done = time.perf_counter()
    peak = _peak_rss_mb()
    if cap:
        rows = {(user, tweet_id) for user, top_ids in timelines.items() for tweet_id in top_ids}
    else:
        assert all(count == 1 for count in multiset.values()), "a view row held twice"
        rows = set(multiset)
    first = clock.get("first_event", called)
    return Run(rows, done - first, times[0], pw.__version__, peak, first - called)


# --- DuckDB -----------------------------------------------------------------------

_DUCK_SCHEMA: Final = """
CREATE TABLE follows (follower BIGINT, followee BIGINT);   -- live edges only
CREATE TABLE tweets (tweet_id BIGINT, author BIGINT, t BIGINT);
CREATE TABLE deletes (tweet_id BIGINT);
"""

_DUCK_LOAD: Final = """
CREATE OR REPLACE TEMP TABLE chunk_edges AS
    SELECT follower, followee, arg_max(live, seq) AS live FROM edge_ops GROUP BY ALL;
DELETE FROM follows USING chunk_edges c
    WHERE follows.follower = c.follower AND follows.followee = c.followee;
INSERT INTO follows SELECT follower, followee FROM chunk_edges WHERE live;
INSERT INTO tweets
    SELECT tweet_id, arg_min(author, seq), arg_min(t, seq) FROM post_ops
    WHERE tweet_id NOT IN (SELECT tweet_id FROM tweets) GROUP BY tweet_id;
INSERT INTO deletes
    SELECT DISTINCT tweet_id FROM delete_ops
    WHERE tweet_id NOT IN (SELECT tweet_id FROM deletes);
"""


def duck_view_sql(cap: int) -> str:
    """DESIGN §4 for every user at once: a window function in place of ``LIMIT :N``."""
    limit = (f"QUALIFY row_number() OVER (PARTITION BY f.follower "
             f"ORDER BY t.t DESC, t.tweet_id DESC) <= {int(cap)}") if cap else ""
    return f"""
CREATE OR REPLACE TABLE home AS
    SELECT f.follower AS user_id, t.tweet_id, t.t
    FROM tweets t JOIN follows f ON f.followee = t.author
    WHERE t.tweet_id NOT IN (SELECT tweet_id FROM deletes)
    {limit}
"""


def _chunks(events: Sequence[Event], every: int) -> Iterator[tuple[int, Sequence[Event]]]:
    for start in range(0, len(events), every):
        yield start, events[start:start + every]


def run_duckdb(events: Sequence[Event], cap: int, every: int, threads: int) -> Run:
    """Load ``events`` ``every`` at a time into DuckDB, recomputing the view after each."""
    import duckdb
    import numpy as np
    import pandas as pd

    con = duckdb.connect(":memory:")
    con.execute(f"SET threads = {int(threads)}")
    con.execute(_DUCK_SCHEMA)
    view_sql = duck_view_sql(cap)

    def frame(columns: dict[str, list[int]]) -> pd.DataFrame:
        return pd.DataFrame({name: np.asarray(values, dtype=np.int64)
                             for name, values in columns.items()})

    steps = 0
    started = time.perf_counter()
    for start, chunk in _chunks(events, every):
        edges: dict[str, list[int]] = {"follower": [], "followee": [], "live": [], "seq": []}
        posts: dict[str, list[int]] = {"tweet_id": [], "author": [], "t": [], "seq": []}
        dels: dict[str, list[int]] = {"tweet_id": []}
        for seq, (kind, a, b, t) in enumerate(chunk, start):
            if kind in (FOLLOW, UNFOLLOW):
                edges["follower"].append(a)
                edges["followee"].append(b)
                edges["live"].append(kind == FOLLOW)
                edges["seq"].append(seq)
            elif kind == POST:
                posts["tweet_id"].append(a)
                posts["author"].append(b)
                posts["t"].append(t)
                posts["seq"].append(seq)
            elif kind == DELETE:
                dels["tweet_id"].append(a)
        edge_frame = frame(edges).astype({"live": bool})
        con.register("edge_ops", edge_frame)
        con.register("post_ops", frame(posts))
        con.register("delete_ops", frame(dels))
        con.execute(_DUCK_LOAD)
        con.execute(view_sql)
        steps += 1
        done = start + len(chunk)
        if done // PROGRESS_EVERY != start // PROGRESS_EVERY:
            _progress("duckdb", done, len(events), started)
    if not events:
        con.execute(view_sql)
    seconds = time.perf_counter() - started
    peak = _peak_rss_mb()
    users, tweet_ids = con.execute("SELECT user_id, tweet_id FROM home").fetchnumpy().values()
    rows = set(zip(users.tolist(), tweet_ids.tolist(), strict=True))
    view_rows = con.execute("SELECT count(*) FROM home").fetchone()
    assert view_rows is not None and view_rows[0] == len(rows), "home holds a row twice"
    return Run(rows, seconds, steps, duckdb.__version__, peak)


# --- one engine, one result -------------------------------------------------------


def measure(engine: str, events: Sequence[Event], cap: int, batch: int, every: int,
            threads: int) -> Result:
    """Run ``engine`` on ``events`` and check its final view against :func:`brute`."""
    if engine == "duckdb":
        run, view_cap, step = run_duckdb(events, cap, every, threads), cap, every
    else:
        view_cap = cap if engine == "pathway-cap" else 0
        run, step = run_pathway(events, view_cap, batch, threads), batch
    expected = brute(events, view_cap)
    mismatches = len(run.rows ^ expected)
    return Result(engine=engine, events=len(events),
                  applied=sum(1 for event in events if event.kind != OTHER),
                  seconds=round(run.seconds, 3),
                  events_per_s=round(len(events) / run.seconds, 1) if run.seconds else 0.0,
                  view_rows=len(run.rows), equal_to_brute=mismatches == 0,
                  mismatches=mismatches, threads=threads, version=run.version,
                  peak_rss_mb=round(run.peak_rss_mb, 1), cap=view_cap, batch=step,
                  steps=run.steps, startup_s=round(run.startup_s, 3))


def summary(result: Result) -> str:
    """The one line printed per run."""
    verdict = "equal to brute" if result.equal_to_brute else f"{result.mismatches} MISMATCHES"
    cap = f"cap {result.cap}" if result.cap else "no cap"
    return (f"{result.engine} {result.version}: {result.events:,} events in "
            f"{result.seconds:.2f} s = {result.events_per_s:,.0f} events/s, {cap}, "
            f"{result.view_rows:,} rows, {verdict}, {result.threads} thread(s), "
            f"{result.steps} steps, peak RSS {result.peak_rss_mb:,.0f} MB")


# --- the self-test ----------------------------------------------------------------


def random_events(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` small random events that hit every rule of the view.

    Few users and tweet ids, so that there are repeated follows and unfollows of one
    edge, unfollows before any follow, duplicated posts, deletes before their post and
    posts after their delete; coarse times, so that ties fall to the tweet id.
    """
    rng = random.Random(seed)
    users = max(4, n // 40)
    tweet_ids = max(4, n // 5)
    authors: dict[int, tuple[int, int]] = {}
    records: list[dict[str, Any]] = []
    for i in range(n):
        t = 1_704_067_200_000 + (i // 4) * 1000
        roll = rng.random()
        if roll < 0.35:
            op = "follow" if rng.random() < 0.8 else "unfollow"
            follower, followee = rng.randint(1, users), rng.randint(1, users)
            records.append({"op": op, "follower": follower, "followee": followee, "t": t})
        elif roll < 0.8:
            tweet_id = rng.randint(1, tweet_ids)
            author, created = authors.setdefault(tweet_id, (rng.randint(1, users), t))
            records.append({"op": "post", "tweet_id": tweet_id, "author": author,
                            "t": created})
        elif roll < 0.9:
            tweet_id = rng.randint(1, tweet_ids)  # posted or not (yet)
            author, _ = authors.setdefault(tweet_id, (rng.randint(1, users), t))
            records.append({"op": "delete", "tweet_id": tweet_id, "author": author, "t": t})
        else:
            records.append({"op": "other"})
    return records


def selftest(n: int) -> int:
    """All engines on ``n`` random events, each in its own process; 0 if all agree."""
    runs = [("pathway", []), ("pathway", ["--threads", "2"]), ("pathway-cap", []),
            ("duckdb", []), ("duckdb", ["--cap", "0"])]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in random_events(n)))
        step = str(max(1, n // 7))
        for engine, extra in runs:
            out = Path(tmp) / "result.json"
            args = [sys.executable, __file__, "--engine", engine, "--events", str(path),
                    "--out", str(out), "--cap", "3", "--batch", step, "--every", step, *extra]
            subprocess.run(args, check=True)
            result = json.loads(out.read_text())
            if not result["equal_to_brute"] or result["view_rows"] == 0:
                failed += 1
    print(f"selftest: {len(runs) - failed} passed, {failed} failed")
    return 1 if failed else 0


# --- the command line -------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true",
                        help=f"make {VENV} at the repo root with {' '.join(REQUIREMENTS)}")
    parser.add_argument("--selftest", type=int, metavar="N",
                        help="run every engine on N random events and check them")
    parser.add_argument("--engine", choices=ENGINES)
    parser.add_argument("--events", type=Path, help="JSONL events in the order to apply them")
    parser.add_argument("--out", type=Path, help="where to write the result JSON")
    parser.add_argument("--cap", type=int, default=800, help="N of LIMIT N; 0 = no cap")
    parser.add_argument("--batch", type=int, default=10_000, help="Pathway: events per commit")
    parser.add_argument("--every", type=int, default=10_000,
                        help="DuckDB: events between recomputes")
    parser.add_argument("--threads", type=int, default=1,
                        help="Pathway workers (PATHWAY_THREADS) / DuckDB threads")
    args = parser.parse_args(argv)
    if args.setup:
        print(ensure_venv())
        return 0
    if args.selftest is not None:
        if args.selftest < 1:
            parser.error("--selftest needs N >= 1")
        return selftest(args.selftest)
    if args.engine is None or args.events is None or args.out is None:
        parser.error("--engine, --events and --out are required (or --setup / --selftest)")
    if args.cap < 0 or args.batch < 1 or args.every < 1 or args.threads < 1:
        parser.error("--cap >= 0, --batch, --every and --threads >= 1")
    try:
        events = read_events(args.events)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    result = measure(args.engine, events, args.cap, args.batch, args.every, args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(result), indent=2) + "\n")
    print(summary(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
