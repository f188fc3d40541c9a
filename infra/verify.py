"""``fanout verify``: the live store against the DESIGN's SQL recomputed from the logs.

The changelogs are read in batch from the beginning (``views.changelog``), folded
into :class:`~views.reference.Reference` and evaluated as §4b's query — newest first
(``home_fast``), which is property-tested equal to the literal SQL and some 15 times
cheaper per user on a 20,000-user history with 300,000 posts. Each user's served
timeline — read page by page through ``serving.timeline``, the same path the API uses
(cache, celebrity entries, read-time fallback, then blocks, mutes, deleted accounts
and originals, reply visibility, one entry per original) — must equal the query's
first ``N`` entries, field by field: entry id, time, actor, original tweet and its
author. Checked users: every user the log says follows someone, plus every user the
store holds anything for (stale rows count as divergence), minus deleted accounts,
whose timelines are not served.
"""

from __future__ import annotations

import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ingest.progress import progress as progress_bar
from ingest.settings import KafkaSettings
from serving.errors import NotFound
from serving.timeline import home_top
from views.changelog import Changelog, read_changelog
from views.reference import HomeRow, Reference
from views.stores.base import Store

log = logging.getLogger(__name__)


@dataclass
class VerifyResult:
    """Outcome of one verification."""

    users_checked: int = 0
    divergent: int = 0
    samples: list[str] = field(default_factory=list)
    events: int = 0
    invalid: int = 0
    lagging_partitions: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.divergent == 0 and not self.lagging_partitions

    def render(self) -> str:
        lines = [f"verify: {self.users_checked} users checked, {self.divergent} divergent "
                 f"({self.events} events, {self.invalid} invalid records, "
                 f"{self.seconds:.1f}s)"]
        if self.lagging_partitions:
            lines.append("  view is behind the log on: " + ", ".join(self.lagging_partitions))
        lines += [f"  {s}" for s in self.samples]
        return "\n".join(lines)


def lagging(store: Store, ends: dict[tuple[str, int], int]) -> list[str]:
    """Partitions whose last record the store has not applied yet."""
    applied = store.applied_offsets()
    return [f"{t}[{p}] applied {applied.get((t, p), -1)} of {end - 1}"
            for (t, p), end in sorted(ends.items())
            if end > 0 and applied.get((t, p), -1) < end - 1]


def wait_caught_up(store: Store, ends: dict[tuple[str, int], int], timeout: float) -> bool:
    """Wait (bounded) until the store has applied every record up to ``ends``."""
    deadline = time.monotonic() + timeout
    while lagging(store, ends):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
    return True


def verify(kafka: KafkaSettings, store: Store, cap: int, *, sample: int | None = None,
           wait: float = 0.0, seed: int = 0, max_samples: int = 5,
           progress: bool = False) -> VerifyResult:
    """Compare served timelines with the recomputed query; see the module docstring."""
    start = time.perf_counter()
    log_ = read_changelog(kafka)
    if wait > 0 and not wait_caught_up(store, log_.ends, wait):
        log.warning("view did not catch up within %.0fs", wait)
    result = compare(log_, store, cap, sample=sample, seed=seed, max_samples=max_samples,
                     progress=progress)
    result.lagging_partitions = lagging(store, log_.ends)
    result.seconds = time.perf_counter() - start
    return result


#: Users whose served timelines are read at once: the reads wait on the store (a
#: Cassandra round trip each page), so they overlap; the recomputation stays serial.
READERS = 8


def compare(log_: Changelog, store: Store, cap: int, *, sample: int | None = None,
            seed: int = 0, max_samples: int = 5, progress: bool = False) -> VerifyResult:
    """Compare without reading Kafka (the log already read); ``progress`` draws a bar."""
    log.info("recomputing the view from %d events", len(log_.events))
    ref = Reference().add(log_.events)
    users = sorted((set(ref.users()) | set(store.home_users())) - ref.deleted_accounts)
    if sample is not None and sample < len(users):
        users = sorted(random.Random(seed).sample(users, sample))
    result = VerifyResult(events=len(log_.events), invalid=sum(log_.invalid.values()))

    def served(user: int) -> list[HomeRow] | str:
        try:
            entries = home_top(store, user, cap)
        except NotFound as exc:
            return f"not served: {exc}"
        return [HomeRow(e.tweet_id, e.created_at, e.author_id, e.original_id,
                        e.original_author) for e in entries]

    with (ThreadPoolExecutor(READERS) as pool,
          progress_bar(total=len(users), desc="verify", unit="user",
                       disable=not progress) as bar):
        for user, got in zip(users, pool.map(served, users), strict=True):
            want = ref.home_fast(user, cap)
            result.users_checked += 1
            bar.update()
            if got != want:
                result.divergent += 1
                if len(result.samples) < max_samples:
                    result.samples.append(_describe(user, want, got))
    return result


def _describe(user: int, want: list[HomeRow], got: list[HomeRow] | str) -> str:
    """What differs, by entry id first, then field by field."""
    if isinstance(got, str):
        return f"user {user}: expected {len(want)} entries, {got}"
    head = f"user {user}: expected {len(want)} entries, served {len(got)}"
    wanted, served = {r.entry_id: r for r in want}, {r.entry_id: r for r in got}
    missing = [t for t in wanted if t not in served][:5]
    extra = [t for t in served if t not in wanted][:5]
    if missing or extra:
        return f"{head}; missing {missing}, unexpected {extra}"
    for i, (w, g) in enumerate(zip(want, got, strict=False)):
        if w != g:
            return f"{head}; entry {i} should be {tuple(w)}, served {tuple(g)}"
    return f"{head}; the same entries, some repeated"
