"""Reposts against posts only: timeline rows written and freshness, in one run.

    .venv/bin/python benchmarks/bench_reposts.py --rate 200 --seconds 40 --repost-share 0.4

A synthetic graph is loaded first (not timed). Then two phases at the same open-loop
rate, each caught up before the next starts so that no micro-batch spans both:

1. **posts only**: every write is a post by a random author;
2. **with reposts**: a share of the writes (``--repost-share``) are reposts, each of a
   tweet of the first phase by someone the reposter follows (a repost follows the
   graph, as on Twitter and Bluesky); the rest are posts as before.

A repost is an entry of the reposter (DESIGN §4b), so it is fanned out to the
reposter's followers like a post: the benchmark reports what that costs in timeline
rows per write, and what it does to freshness (write → visible, known exactly per
write from the applied offsets after each commit, as in ``bench_freshness.py``).
Writes benchmarks/results/reposts.json.
"""

from __future__ import annotations

import random
import sys
import time
from collections import defaultdict
from collections.abc import Sequence

from bench_freshness import lags, produce, record_commits
from harness import ROOT, argument_parser, save
from pipeline import percentile, pipeline

sys.path.insert(0, str(ROOT))

from ingest.events import Event, Follow, Post, Repost  # noqa: E402
from ingest.generator import generate  # noqa: E402
from ingest.producer import ChangelogProducer  # noqa: E402

POST_BASE = 3_000_000_000_000
REPOST_BASE = 4_000_000_000_000


def _graph(users: int, follows: int) -> tuple[list[Event], dict[int, list[int]]]:
    """The graph's events and each user's followees."""
    events = [e for e in generate(users, follows, 0, seed=11).events()]
    followees: dict[int, set[int]] = defaultdict(set)
    for e in events:
        if isinstance(e, Follow):
            (followees[e.follower_id].add if e.active else followees[e.follower_id].discard)(
                e.followee_id)
    return events, {u: sorted(f) for u, f in followees.items() if f}


def _phase(pipe, name: str, rate: float, writes: Sequence[Event]) -> dict:
    previous = pipe.sink.on_batch
    commits = record_commits(pipe)
    first = len(pipe.batch_log)
    sent = produce(pipe, rate, writes)
    pipe.wait_caught_up(timeout=600, progress=False)
    pipe.sink.on_batch = previous
    batches = pipe.batch_log[first:]
    seen = lags(sent, commits)
    adds = sum(b["timeline_adds"] for b in batches)
    reposts = sum(isinstance(e, Repost) for e in writes)
    return {"phase": name, "writes": len(writes), "reposts": reposts,
            "timeline_adds": adds, "adds_per_write": round(adds / max(1, len(writes)), 2),
            "visible": len(seen),
            "freshness_s": {q: round(percentile(seen, p), 3) for q, p in
                            (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1.0))},
            "batches": len(batches),
            "batch_s_p50": round(percentile([b["seconds"] for b in batches], .5), 3)}


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="reposts", users=20_000, follows=200_000)
    ap.add_argument("--rate", type=float, default=200.0, help="writes per second")
    ap.add_argument("--seconds", type=float, default=40.0, help="per phase")
    ap.add_argument("--repost-share", type=float, default=0.4,
                    help="share of the second phase's writes that are reposts")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    graph, followees = _graph(args.users, args.follows)
    total = int(args.rate * args.seconds)
    now = int(time.time() * 1000)
    authors = [rng.randint(1, args.users) for _ in range(total)]
    posts = [Post(POST_BASE + i, a, now + i, f"post {i}") for i, a in enumerate(authors)]
    by_author: dict[int, list[int]] = defaultdict(list)
    for post in posts:
        by_author[post.author_id].append(post.tweet_id)
    reposters = [u for u, fs in followees.items() if any(f in by_author for f in fs)]
    mixed: list[Event] = []
    for i in range(total):
        if rng.random() < args.repost_share:
            user = rng.choice(reposters)
            author = rng.choice([f for f in followees[user] if f in by_author])
            mixed.append(Repost(REPOST_BASE + i, user, rng.choice(by_author[author]), author,
                                now + total + i))
        else:
            mixed.append(Post(POST_BASE + total + i, rng.randint(1, args.users),
                              now + total + i, f"post {total + i}"))
    with pipeline(celebrity_threshold=1000) as pipe:
        with ChangelogProducer(pipe.kafka) as producer:
            for event in graph:
                producer.send(event)
            producer.flush(120)
        pipe.wait_caught_up(timeout=900)
        phases = [_phase(pipe, "posts only", args.rate, posts),
                  _phase(pipe, "with reposts", args.rate, mixed)]
    base, with_reposts = phases
    result = {"phases": phases, "settings": vars(args),
              "adds_per_write_ratio": round(with_reposts["adds_per_write"]
                                            / max(base["adds_per_write"], 1e-9), 3),
              "freshness_p99_ratio": round(with_reposts["freshness_s"]["p99"]
                                           / max(base["freshness_s"]["p99"], 1e-9), 3)}
    for p in phases:
        f = p["freshness_s"]
        print(f"{p['phase']:>13}: {p['writes']} writes ({p['reposts']} reposts) → "
              f"{p['timeline_adds']} timeline rows ({p['adds_per_write']}/write); "
              f"write → visible p50 {f['p50']}s p99 {f['p99']}s max {f['max']}s; "
              f"{p['batches']} batches, p50 {p['batch_s_p50']}s")
    print(f"with reposts / posts only: rows per write ×{result['adds_per_write_ratio']}, "
          f"p99 freshness ×{result['freshness_p99_ratio']}")
    print(f"written to {save(args.name, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
