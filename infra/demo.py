"""``fanout demo`` (``make demo``): the whole pipeline end to end, then stopped.

Starts the stack in a fresh run directory, generates a small synthetic history with
the social mix (:data:`ingest.social.SOCIAL`: replies, reposts and their undos,
blocks, mutes and a few account deletions beside posts, deletes and follows),
replays it into the changelogs as fast as possible, waits (with progress) until the
view job has applied every record, prints the busiest user's home timeline and one
entry of each kind (post, reply, repost) fetched over HTTP, one post arriving live on
a follower's home stream (``GET …/home/stream``: posted over HTTP, the ``add`` event
timed from the 202), the result of ``verify`` (every user's first ``--verify-entries``
entries; 0: whole timelines), and stops everything — also when a step fails.
"""

from __future__ import annotations

import argparse
import functools
import queue
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from infra import webclient
from infra.checks.checker import sse_events
from infra.checks.verify import end_offsets, lagging, verify
from infra.errors import InfraError
from infra.services.process import HEARTBEAT_S
from infra.stack.launch import up
from infra.stack.stack import Stack, down
from ingest.generator import generate, write
from ingest.history import iter_events
from ingest.producer import ChangelogProducer
from ingest.progress import progress as progress_bar
from ingest.replay import replay
from ingest.settings import KafkaSettings
from ingest.social import SOCIAL
from serving.callers import USER_HEADER
from serving.settings import AUTH_ENV
from views.settings import CELEBRITY_THRESHOLD_ENV
from views.stores import store_from_url
from views.stores.base import Store

#: The kinds of timeline entry the demo shows one of (DESIGN §4b).
KINDS: Final = ("post", "reply", "repost")
#: Users whose first home page is searched for an entry of each kind, busiest first.
SEARCHED: Final = 50
#: How long the demo waits for the live event of its post (seconds).
LIVE_TIMEOUT_S: Final = 60.0


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
    made = clock.step(f"generate {args.users:,} users, {args.follows:,} follows and "
                      f"{args.tweets:,} posts, with replies, reposts, blocks, mutes and "
                      "account deletions",
                      lambda: generate(args.users, args.follows, args.tweets, seed=args.seed,
                                       mix=SOCIAL))
    write(made, history)
    print("history: " + ", ".join(f"{k} {n:,}" for k, n in made.counts().items() if n))
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
        if not clock.step("post over HTTP and watch it arrive on a follower's live stream",
                          lambda: live_event(stack.api_url, store)):
            return 1
        # As `fanout verify` reads: in a process per core, each reopening the store.
        opener = functools.partial(store_from_url, stack.store_url, cap=store.cap)
        depth = args.verify_entries or None
        what = f"the first {depth} entries of" if depth else "the whole of"
        result = clock.step(f"verify {what} every home timeline against the SQL",
                            lambda: verify(kafka, store, store.cap, opener=opener,
                                           progress=True, entries=depth))
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
    with progress_bar(total=total, desc="view applied", unit="rec", unit_scale=True,
                      log_interval=HEARTBEAT_S) as bar:
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


def _show_timelines(stack: Stack, store: Store, entries: int = 5) -> None:
    """The busiest reader's newest entries, then one entry of each kind over HTTP."""
    busiest = readers_busiest_first(store)
    with webclient.client(base_url=stack.api_url, timeout=10) as client:
        for user in busiest:
            answer = client.get(f"/v1/users/{user}/home", params={"limit": entries})
            if answer.status_code == 200:  # else a deleted account: the next one
                body = answer.json()
                print(f"\nGET /v1/users/{user}/home?limit={entries}  (follows "
                      f"{len(store.followees(user))}, next_cursor {body.get('next_cursor')})")
                print("\n".join("  " + describe(e, store) for e in body["entries"]))
                break
        found = one_of_each(client, busiest[:SEARCHED])
    print("\none entry of each kind, from the served home timelines:")
    for kind in KINDS:
        if kind in found:
            reader, e = found[kind]
            print(f"  {kind:<7} in user {reader}'s home: {describe(e, store)}")
        else:
            print(f"  {kind:<7} none in the first page of the {SEARCHED} busiest readers")


def readers_busiest_first(store: Store) -> list[int]:
    """The store's readers, those following the most first (ties by id)."""
    return sorted(store.home_users(), key=lambda u: (-len(store.followees(u)), u))


def live_event(api_url: str, store: Store, timeout: float = LIVE_TIMEOUT_S) -> bool:
    """Hold the busiest reader's stream, post as one they follow, show the ``add``.

    True when the event of the post arrived within ``timeout`` seconds of its 202.
    """
    reader = next((u for u in readers_busiest_first(store)
                   if store.followees(u) and store.users([u])), None)
    if reader is None:
        print("no reader follows anyone: nothing to stream")
        return False
    hidden = store.relations(reader)
    author = min((u for u in store.followees(reader) if store.users([u])
                  and u not in hidden.blocked and u not in hidden.muted), default=None)
    if author is None:
        print(f"user {reader} sees no one they follow: nothing to stream")
        return False
    events: queue.Queue[dict[str, str]] = queue.Queue()
    done = threading.Event()

    def hold() -> None:
        with webclient.client(base_url=api_url, timeout=timeout) as client, client.stream(
                "GET", f"/v1/users/{reader}/home/stream", params={"limit": 5}) as response:
            for fields in sse_events(response.iter_lines()):
                if fields:
                    events.put(fields)
                if done.is_set():
                    return

    holder = threading.Thread(target=hold, daemon=True, name="demo-stream")
    holder.start()
    try:
        first = events.get(timeout=timeout)  # the page as adds: the stream is open
        print(f"GET /v1/users/{reader}/home/stream?limit=5: open ({first.get('event')} "
              "events of the first page)")
        with webclient.client(base_url=api_url, timeout=10) as client:
            posted = client.post("/v1/tweets", headers={USER_HEADER: str(author)},
                                 json={"text": "hello, live from fanout's demo"})
        accepted = time.monotonic()
        posted.raise_for_status()
        tweet = posted.json()["tweet_id"]
        print(f"POST /v1/tweets as user {author}: {posted.status_code}, tweet {tweet}")
        while (left := accepted + timeout - time.monotonic()) > 0:
            try:
                fields = events.get(timeout=left)
            except queue.Empty:
                break
            data = orjson.loads(fields.get("data", "{}"))
            if fields.get("event") == "add" and data["entry"]["tweet_id"] == tweet:
                print(f"event add on user {reader}'s stream "
                      f"{(time.monotonic() - accepted) * 1000:.0f} ms after the 202: "
                      f"{describe(data['entry'], store)}")
                return True
        print(f"the post's event did not arrive on user {reader}'s stream within {timeout:.0f}s")
        return False
    except queue.Empty:
        print(f"user {reader}'s stream sent nothing within {timeout:.0f}s")
        return False
    finally:
        done.set()


def one_of_each(client: httpx.Client, users: Iterable[int],
                limit: int = 50) -> dict[str, tuple[int, dict[str, Any]]]:
    """The first entry of each of :data:`KINDS` in the users' first home pages.

    A deleted account's home answers 404 and is passed over.
    """
    found: dict[str, tuple[int, dict[str, Any]]] = {}
    for user in users:
        answer = client.get(f"/v1/users/{user}/home", params={"limit": limit})
        if answer.status_code == 200:
            for entry in answer.json()["entries"]:
                found.setdefault(entry["kind"], (user, entry))
        if all(kind in found for kind in KINDS):
            break
    return found


def describe(entry: dict[str, Any], store: Store) -> str:
    """One entry as a line: when, who (reposted whom, or replied to whom), the text."""
    tweet = entry["tweet"]
    author = tweet["author"].get("handle") or tweet["author"]["id"]
    actor = entry["actor"].get("handle") or entry["actor"]["id"]
    how = f"@{author}"
    if entry["kind"] == "repost":
        how = f"@{actor} reposted @{author}"
    elif entry["kind"] == "reply" and tweet.get("in_reply_to_user_id"):
        to = int(tweet["in_reply_to_user_id"])
        profile = store.users([to]).get(to)
        how = f"@{author} replying to @{profile.handle if profile else to}"
    return f"{entry['created_at_iso']}  {how}: {tweet['text'][:70]}"


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
