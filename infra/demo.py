"""``fanout demo`` (``make demo``): the whole pipeline end to end, then stopped.

Starts the stack in a fresh run directory, generates a small synthetic history,
replays it into the changelogs as fast as possible, waits (with progress) until the
view job has applied every record, prints a few home timelines fetched over HTTP and
the result of ``verify``, and stops everything — also when a step fails.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import httpx

from infra.errors import InfraError
from infra.launch import up
from infra.stack import Stack, down
from infra.verify import lagging, verify
from ingest.generator import generate, write
from ingest.history import iter_events
from ingest.producer import ChangelogProducer
from ingest.progress import progress as progress_bar
from ingest.replay import replay
from ingest.settings import KafkaSettings
from serving.settings import AUTH_ENV
from views.settings import CELEBRITY_THRESHOLD_ENV
from views.stores import store_from_url
from views.stores.base import Store


def demo(args: argparse.Namespace) -> int:
    """Run the demo; 0 when verify finds no divergent user."""
    run_dir = Path(args.run_dir) / "demo"
    down(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    clock = _Clock()
    # Auth off: the demo reads timelines over HTTP without minting tokens.
    env = {CELEBRITY_THRESHOLD_ENV: str(args.celebrity_threshold), AUTH_ENV: "off"}
    stack = clock.step("start broker, view job and API", lambda: up(run_dir, extra_env=env))
    try:
        return _run(args, stack, run_dir, clock)
    finally:
        clock.step("stop everything", lambda: down(run_dir))
        print(clock.render())


def _run(args: argparse.Namespace, stack: Stack, run_dir: Path, clock: _Clock) -> int:
    kafka = KafkaSettings(bootstrap=stack.bootstrap, partitions=stack.partitions,
                          topic_prefix=stack.topic_prefix)
    history = run_dir / "history"
    clock.step(f"generate {args.users:,} users, {args.follows:,} follows, {args.tweets:,} tweets",
               lambda: write(generate(args.users, args.follows, args.tweets, seed=args.seed),
                             history))
    with ChangelogProducer(kafka) as producer:
        summary = clock.step("replay into Kafka", lambda: replay(iter_events(history), producer))
    print(summary.render())
    if not summary.ok or summary.events == 0:
        print("the replay did not deliver the history: stopping")
        return 1
    store = store_from_url(stack.store_url).open()
    try:
        clock.step("wait for the view job to catch up", lambda: catch_up(kafka, store))
        _show_timelines(stack, store)
        result = clock.step("verify against the SQL",
                            lambda: verify(kafka, store, store.cap))
        print(result.render())
        if result.users_checked == 0:
            print("verify checked no user: the view is empty")
            return 1
        print(f"store rows: {store.counts()}; celebrities: {len(store.celebrities())}")
    finally:
        store.close()
    return 0 if result.ok else 1


def catch_up(kafka: KafkaSettings, store: Store, timeout: float = 600.0) -> None:
    """Wait, with a progress bar, until the view has applied every record now in Kafka."""
    ends = end_offsets(kafka)
    total = sum(ends.values())
    deadline = time.monotonic() + timeout
    with progress_bar(total=total, desc="view applied", unit="rec", unit_scale=True) as bar:
        while lagging(store, ends):
            applied = store.applied_offsets()
            bar.n = sum(min(applied.get(tp, -1) + 1, end) for tp, end in ends.items())
            bar.refresh()
            if time.monotonic() > deadline:
                msg = f"the view did not catch up within {timeout:.0f}s"
                raise InfraError(msg)
            time.sleep(0.5)
        bar.n = total
        bar.refresh()


def end_offsets(kafka: KafkaSettings) -> dict[tuple[str, int], int]:
    """The end offset of every (logical topic, partition) of the changelogs."""
    from views.kafka_offsets import EndOffsets

    offsets = EndOffsets(kafka.bootstrap)
    tps = offsets.topic_partitions(kafka.physical_topics())
    return {(kafka.logical(t), p): end for (t, p), end in offsets.ends(tps).items()}


def _show_timelines(stack: Stack, store: Store, users: int = 3, entries: int = 5) -> None:
    busiest = sorted(store.home_users(), key=lambda u: -len(store.followees(u)))[:users]
    with httpx.Client(base_url=stack.api_url, timeout=10) as client:
        for user in busiest:
            body = client.get(f"/v1/users/{user}/home", params={"limit": entries}).json()
            print(f"\nGET /v1/users/{user}/home?limit={entries}  (follows "
                  f"{len(store.followees(user))}, next_cursor {body.get('next_cursor')})")
            for e in body["entries"]:
                tweet = e["tweet"]
                author = tweet["author"].get("handle") or tweet["author"]["id"]
                actor = e["actor"].get("handle") or e["actor"]["id"]
                how = f"@{actor} reposted @{author}" if e["kind"] == "repost" else f"@{author}"
                print(f"  {e['created_at_iso']}  {how}: {tweet['text'][:70]}")


class _Clock:
    """Times each step and prints it as it goes."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, float]] = []
        self.start = time.perf_counter()

    def step(self, name: str, action):  # noqa: ANN001, ANN201
        print(f"==> {name}", flush=True)
        began = time.perf_counter()
        out = action()
        self.steps.append((name, time.perf_counter() - began))
        return out

    def render(self) -> str:
        rows = [f"  {seconds:7.1f}s  {name}" for name, seconds in self.steps]
        total = time.perf_counter() - self.start
        return "\n".join(["timings:", *rows, f"  {total:7.1f}s  total"])
