"""What filtering DESIGN §4b at read time costs a home page, per feature.

    .venv/bin/python benchmarks/bench_read_filter.py [--rounds 2000] [--before COMMIT]

Builds one SQLite store through the in-process join (views.local; authors on the
fan-out path, cap 800), with six groups of 200 readers, each following 40 authors
of one kind:

- ``quiet``: authors who only post, and whose posts nobody reposts (the baseline);
- ``posts``: the same, but their posts are what the ``reposts`` authors repost (by
  users the readers do not follow: the newest-appearance check reads the followee
  list to rule them out);
- ``reposts``: authors whose entries are half reposts (of the plain authors' posts,
  so originals repeat across authors and the one-entry-per-original check bites);
- ``replies``: authors of whom 30% of posts are replies to random users (a reply to
  a third user needs the reader's followee list);
- ``relations``: plain authors, of whom each reader blocks 4 and mutes 4 — a fifth
  of the candidates are filtered, so pages need a second, larger batch;
- ``deleted``: plain authors, a tenth of whose accounts are deleted.

For each group it reads first pages (limit 20) round-robin and reports p50/p99 of
what the API does on a page-cache miss: assemble the page (``home_page``) and render
it (:func:`serving.render.hydrated` + orjson), plus the store calls per page. With
``--before COMMIT`` it also times that commit's ``serving/timeline.py`` and
``serving/render.py`` (the read path before §4b: no filter, two hydration reads) on
the same store. Results go to benchmarks/results/read_filter.json.
"""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from harness import ROOT, argument_parser, save
from pipeline import built_store, percentile, scratch, timed_ms

sys.path.insert(0, str(ROOT))

from ingest.events import (  # noqa: E402
    BLOCK,
    MUTE,
    AccountDelete,
    Event,
    Follow,
    Post,
    Relation,
    Repost,
)
from serving.render import hydrated, page_body  # noqa: E402
from serving.timeline import home_page  # noqa: E402
from views.join import JoinConfig  # noqa: E402
from views.local import LocalJoin  # noqa: E402
from views.stores.sqlite import SQLiteStore  # noqa: E402

GROUPS = ("quiet", "posts", "reposts", "replies", "relations", "deleted")
AUTHORS = {g: range(1 + i * 1000, 401 + i * 1000) for i, g in enumerate(GROUPS)}
T0 = 1_700_000_000_000
PER_AUTHOR = 10
FOLLOWS = 40


def build(path: Path, seed: int = 7) -> dict[str, list[int]]:
    """Fill the store; return each group's readers."""
    rng = random.Random(seed)
    store = SQLiteStore(path, cap=800).open()
    join = LocalJoin(JoinConfig(cap=800, promote_at=10**6, demote_below=10**6 - 1), store)
    readers = {g: [100_000 + i * 1000 + r for r in range(200)] for i, g in enumerate(GROUPS)}
    follows = {u: rng.sample(AUTHORS[g], FOLLOWS) for g, us in readers.items() for u in us}
    events: list[Event] = [Follow(u, a, 1) for u, authors in follows.items() for a in authors]
    events += _entries(rng)
    for u in readers["relations"]:
        for i, a in enumerate(follows[u][:8]):
            events.append(Relation(u, a, 2, BLOCK if i < 4 else MUTE))
    events += [AccountDelete(a, T0) for a in AUTHORS["deleted"] if a % 10 == 0]
    for i in range(0, len(events), 50_000):
        join.run(events[i:i + 50_000])
    store.close()
    return readers


def _entries(rng: random.Random) -> list[Event]:
    ids = iter(range(10**12, 10**13))
    out: list[Event] = []
    plain: list[Post] = []
    for group, authors in AUTHORS.items():
        for a in authors:
            for n in range(PER_AUTHOR):
                at = T0 + rng.randrange(10**8)
                if group == "reposts" and n % 2:
                    original = rng.choice(plain)
                    out.append(Repost(next(ids), a, original.tweet_id, original.author_id, at))
                    continue
                reply = rng.choice(range(1, 5001)) if group == "replies" \
                    and rng.random() < 0.3 else 0
                post = Post(next(ids), a, at, f"tweet {n} by {a}", reply if reply != a else 0)
                out.append(post)
                if group == "posts":
                    plain.append(post)
    return out


class Counting:
    """A store whose method calls are counted (snapshot() excluded)."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store, self.calls = store, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not callable(attr) or name == "snapshot":
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


def measure(read: Callable[[int], object], users: list[int], rounds: int) -> dict[str, float]:
    samples = timed_ms(read, users, rounds, warmup=20)
    return {"p50_ms": round(percentile(samples, .5), 3),
            "p99_ms": round(percentile(samples, .99), 3)}


def now_read(store: Any) -> Callable[[int], bytes]:
    def read(user: int) -> bytes:
        page = home_page(store, user, None, 20)
        return page_body(user, hydrated(store, page.entries, page.tweets, page.users),
                         page.next_key)
    return read


def before_read(store: Any, commit: str, work: Path) -> Callable[[int], bytes]:
    timeline, render = (_load(commit, name, work) for name in ("timeline", "render"))

    def read(user: int) -> bytes:
        page = timeline.home_page(store, user, None, 20)
        rows = render.live_rows(store, page.entries)
        return render.page_body(user, [render.entry_dict(t, u) for t, u in rows],
                                page.next_key)
    return read


def _load(commit: str, name: str, work: Path) -> ModuleType:
    source = subprocess.run(["git", "show", f"{commit}:serving/{name}.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    path = work / f"before_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"before_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argument_parser(__doc__.split("\n\n")[0], name="read_filter", rounds=2000)
    ap.add_argument("--before", help="a commit whose read path to time too (e.g. 750cb06)")
    args = ap.parse_args()
    with scratch("fanout-filter-") as work:
        path = work / "v.sqlite"
        store, readers = built_store(path, build)
        result: dict[str, Any] = {"rounds": args.rounds, "limit": 20, "groups": {}}
        for group, users in readers.items():
            counting = Counting(store)
            for user in users:
                now_read(counting)(user)
            row: dict[str, Any] = {"now": measure(now_read(store), users, args.rounds),
                                   "calls_per_page": {k: round(v / len(users), 2) for k, v
                                                      in sorted(counting.calls.items())}}
            if args.before:
                row["before"] = measure(before_read(store, args.before, work), users,
                                        args.rounds)
            result["groups"][group] = row
            before = f"  before p50 {row['before']['p50_ms']:.3f}ms" if args.before else ""
            print(f"{group:>9}: p50 {row['now']['p50_ms']:.3f}ms "
                  f"p99 {row['now']['p99_ms']:.3f}ms"
                  f"  calls/page {sum(row['calls_per_page'].values()):.1f}{before}")
        store.close()
    print(f"written to {save(args.name, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
