"""The history checker's live-stream clients (:mod:`infra.checks.checker`) against two API apps.

Holders of ``GET …/home/stream`` on two apps over one SQLite store (two API
processes), dropping and resuming at random, while micro-batches of every kind of
write land; :func:`check_streams` finds 0 missed, duplicated and phantom events. And
it does count them: a holder that folds a remove it never had, or misses an add, is
reported.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from infra.checks.checker import StreamHolder, check_streams
from serving.app import create_app
from serving.callers import mint
from tests.support.api import SECRET, running
from tests.support.streams import World, Writes, stream_settings


def test_stream_holders_resuming_across_processes_miss_and_repeat_nothing(tmp_path: Path):
    world = World(tmp_path / "checker.sqlite")
    apps = [create_app(stream_settings(world.path)), create_app(stream_settings(world.path))]
    writes = Writes(random.Random(7))
    with running(apps[0]) as a, running(apps[1]) as b:
        holders = [StreamHolder(url, user, mint(user, SECRET.encode(), 600), limit=limit,
                                drop_every=3, seed=i).start()
                   for i, (url, user, limit) in enumerate(
                       [(a, 2, 3), (b, 2, 3), (a, 3, 5), (b, 4, 4), (a, 4, 1)])]
        try:
            for round_ in range(20):
                world.run(*writes.batch())
                if round_ == 10:
                    world.run(writes.account_delete())
                time.sleep(0.05)  # pacing only: the streams run while the writes land
            report = check_streams(holders, wait=20)
        finally:
            for holder in holders:
                holder.stop()
            for holder in holders:
                holder.join(5)
    assert report.ok, report.render()
    assert report.events > 50 and report.resumes > 0, report.render()
    world.harness.store.close()


def test_what_a_stream_should_not_send_is_counted():
    holder = StreamHolder("http://unused", 2, None, limit=2, drop_every=0)
    entry = {"tweet_id": "9", "created_at": 5}
    holder.take({"event": "add", "data": '{"entry": {"tweet_id": "9", "created_at": 5}}',
                 "id": "x"})
    holder.take({"event": "add", "data": '{"entry": {"tweet_id": "9", "created_at": 5}}'})
    holder.take({"event": "remove", "data": '{"tweet_id": "8"}'})
    assert (holder.tally.duplicated, holder.tally.phantom) == (1, 1)
    assert holder.page() == [entry] and holder.last == "x"
    holder.take({"event": "reset", "data": "{}"})
    assert holder.page() == [] and holder.tally.resets == 1


def test_every_holder_is_read_even_after_the_wait_is_spent(tmp_path: Path):
    """A holder that never matches spends the whole wait; the holder after it is still
    compared with the page ``/home`` serves, not with nothing."""
    world = World(tmp_path / "checker.sqlite")
    with running(create_app(stream_settings(world.path))) as base:
        stuck = StreamHolder(base, 2, mint(2, SECRET.encode(), 600), limit=3, drop_every=0)
        stuck.take({"event": "add", "data": '{"entry": {"tweet_id": "999999", "created_at": 1}}'})
        caught_up = StreamHolder(base, 3, mint(3, SECRET.encode(), 600), limit=3,
                                 drop_every=0).start()
        try:
            deadline = time.monotonic() + 30
            while len(caught_up.page()) < 3:  # user 3's first page, held
                assert time.monotonic() < deadline, "the stream's first page within 30 s"
                time.sleep(0.05)
            report = check_streams([stuck, caught_up], wait=0.5)
        finally:
            caught_up.stop()
            caught_up.join(5)
    assert stuck.tally.phantom == 1 and stuck.tally.missed == 3, report.render()
    assert caught_up.tally.missed == caught_up.tally.phantom == 0, report.render()
    world.harness.store.close()
