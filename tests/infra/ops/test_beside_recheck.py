"""``rebuild --beside``'s second look at divergent users (``infra.ops.beside._recheck``).

A real broker holds the log; the view is a SQLite store built by the pure join, whose
applied offsets are set by hand, and which moves on (applies the rest of the log)
while the users are read again, as a live view does.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from infra.checks.verify import VerifyResult, served
from infra.ops import beside
from infra.stack.stack import StackError
from ingest.events import Follow, Post
from ingest.generator import generate
from ingest.settings import KafkaSettings
from tests.support.changelog import produce
from views.changelog import read_changelog
from views.delta import Delta
from views.join import DAY_MS, JoinConfig
from views.local import LocalJoin
from views.pointer import ViewRecord
from views.settings import LATENESS_DAYS_ENV, ViewSettings
from views.stores.sqlite import SQLiteStore

CAP = 30
MINUTE_MS = 60_000


class Moving(SQLiteStore):
    """A store that applies ``later`` (events, then offsets) at its ``at``-th offsets read."""

    def __init__(self, path: Path, at: set[int], later: list) -> None:
        super().__init__(path, cap=CAP)
        self.at, self.later, self.reads = at, later, 0

    def applied_offsets(self):
        self.reads += 1
        if self.reads in self.at and self.later:
            self.later.pop(0)()
        return super().applied_offsets()


def _offsets(store: SQLiteStore, until: dict[tuple[str, int], int]) -> None:
    store.apply([Delta.source_offset(t, p, end - 1) for (t, p), end in until.items() if end])


@pytest.fixture
def log_(kafka_settings: KafkaSettings):
    produce(kafka_settings, generate(40, 400, 300, seed=5).events())
    whole = read_changelog(kafka_settings)
    half = {tp: end // 2 for tp, end in whole.ends.items()}
    return whole, half, read_changelog(kafka_settings, until=half), \
        read_changelog(kafka_settings, since=half)


def _view(tmp_path: Path, log_, at: set[int]) -> tuple[Moving, list[int]]:
    whole, half, first, rest = log_
    store = Moving(tmp_path / "v.sqlite", at, []).open()
    join = LocalJoin(JoinConfig.with_ratio(CAP, 100), store)
    join.run(first.events)
    _offsets(store, half)

    def go_on() -> None:
        join.run(rest.events)
        _offsets(store, whole.ends)

    store.later = [go_on]
    users = sorted({e.follower_id for e in whole.events if hasattr(e, "follower_id")})
    return store, users


def test_a_view_that_commits_every_few_user_reads_is_compared_group_by_group(
        tmp_path, kafka_settings, log_, monkeypatch):
    # A batch commits after every 10th user read: reading every user at once never
    # sees one position, groups of 8 mostly do. The first commit applies the rest of
    # the log, so groups are compared at two positions.
    store, users = _view(tmp_path, log_, at=set())
    assert len(users) > 24
    commits = [store.later.pop(0)] + [
        lambda k=k: store.apply([Delta.source_offset("tweets", 99, k)]) for k in range(1000)]
    reads = [0]

    def read(*args):
        reads[0] += 1
        if reads[0] % 10 == 0:
            commits.pop(0)()
        return served(*args)

    monkeypatch.setattr(beside, "served", read)
    result = VerifyResult(divergent=len(users), divergent_users=list(users))
    beside._recheck(kafka_settings, store, CAP, result)
    assert (result.divergent, result.samples) == (0, [])
    assert reads[0] > len(users), "some group should have been read again"
    store.close()


def test_a_user_the_view_got_wrong_stays_divergent(tmp_path, kafka_settings, log_):
    store, users = _view(tmp_path, log_, at={3})
    victim = users[-1]

    def lose_newest() -> None:  # behind the join's back, once the view is at the end
        entry_id, created_at, actor, *_ = served(store, victim, CAP)[0]
        store.apply([Delta.timeline_remove(victim, entry_id, actor, created_at)])

    store.later.append(lose_newest)
    store.at.add(4)
    result = VerifyResult(divergent=len(users), divergent_users=list(users))
    beside._recheck(kafka_settings, store, CAP, result)
    assert result.divergent_users == [victim]
    store.close()


def test_a_page_torn_between_two_batches_once_does_not_count(tmp_path, kafka_settings, log_,
                                                             monkeypatch):
    # Cassandra shows a batch row by row: one read of a user may assemble rows of two
    # batches and match the log at neither position. The next read does not.
    store, users = _view(tmp_path, log_, at=set())
    store.later.pop(0)()
    victim, torn = users[-1], [1]

    def read(store_, user, cap):
        page = served(store_, user, cap)
        if user == victim and torn[0]:
            torn[0] -= 1
            return page[1:]
        return page

    monkeypatch.setattr(beside, "served", read)
    result = VerifyResult(divergent=len(users), divergent_users=list(users))
    beside._recheck(kafka_settings, store, CAP, result)
    assert (result.divergent, result.divergent_users, torn) == (0, [], [0])
    store.close()


def test_a_view_that_commits_during_every_read_is_reported(tmp_path, kafka_settings, log_,
                                                           monkeypatch):
    monkeypatch.setattr(beside, "_STILL_READS", 3)
    store, users = _view(tmp_path, log_, at=set(range(2, 200)))
    # Then a commit at every read (of a partition no record is in).
    store.later += [lambda k=k: store.apply([Delta.source_offset("tweets", 99, k)])
                    for k in range(200)]
    result = VerifyResult(divergent=len(users), divergent_users=list(users))
    with pytest.raises(StackError, match="committed a batch during every one of 3 reads"):
        beside._recheck(kafka_settings, store, CAP, result)
    store.close()


def test_the_new_view_is_checked_under_its_own_lateness_bound(tmp_path, kafka_settings):
    # The view's job drops a post five minutes late under its bound of one minute. Its
    # check must apply the same bound: under the default (days), the post's author's
    # followers would look divergent, the view being right.
    events = list(generate(40, 400, 300, seed=6).events())
    newest = max(e.created_at for e in events)
    author = Counter(e.followee_id for e in events
                     if isinstance(e, Follow) and e.active).most_common(1)[0][0]
    tweet_id = max(e.tweet_id for e in events if isinstance(e, Post)) + 1
    events += [Post(tweet_id, author, newest + 600_000, "on time"),
               Post(tweet_id + 1, author, newest + 300_000, "five minutes late")]
    produce(kafka_settings, events)
    store = SQLiteStore(tmp_path / "v.sqlite", cap=CAP).open()
    LocalJoin(JoinConfig.with_ratio(CAP, 100, lateness=MINUTE_MS), store).run(events)
    _offsets(store, read_changelog(kafka_settings).ends)
    target = ViewRecord(2, f"sqlite:///{tmp_path / 'v.sqlite'}", str(tmp_path / "ck"))
    own = ViewSettings.from_env({LATENESS_DAYS_ENV: repr(MINUTE_MS / DAY_MS)})
    assert own.lateness_ms() == MINUTE_MS
    said: list[str] = []
    result = beside._check(kafka_settings, store, target, own, None, said.append)
    assert (result.divergent, result.late) == (0, 1), said
    default = beside._check(kafka_settings, store, target, ViewSettings.from_env({}), None,
                            said.append)
    assert default.divergent > 0
    store.close()


class RowByRow(Moving):
    """A view whose batches show row by row, before their offsets commit (Cassandra's)."""

    atomic_batches = False


def test_a_page_with_rows_of_the_next_batch_matches_at_the_next_position_read(
        tmp_path, kafka_settings, log_, monkeypatch):
    # The rest of the log is applied, but its offsets commit only once three groups were
    # read: those groups match the log at the position the next groups are read at, and
    # only the last group waits for a commit (none comes).
    whole, half, first, rest = log_
    store = RowByRow(tmp_path / "v.sqlite", set(), []).open()
    join = LocalJoin(JoinConfig.with_ratio(CAP, 100), store)
    join.run(first.events)
    _offsets(store, half)
    join.run(rest.events)
    users = sorted({e.follower_id for e in whole.events if hasattr(e, "follower_id")})
    assert len(users) > 4 * beside._GROUP
    reads, waits = [0], []

    def read(*args):
        reads[0] += 1
        if reads[0] == 3 * beside._GROUP + 1:
            _offsets(store, whole.ends)
        return served(*args)

    def next_commit(store_, applied):
        waits.append(applied)
        return None

    monkeypatch.setattr(beside, "served", read)
    monkeypatch.setattr(beside, "_next_commit", next_commit)
    result = VerifyResult(divergent=len(users), divergent_users=list(users))
    beside._recheck(kafka_settings, store, CAP, result)
    assert (result.divergent, result.samples) == (0, [])
    assert waits == [{tp: end - 1 for tp, end in whole.ends.items() if end}]
    store.close()
