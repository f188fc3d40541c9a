"""Home reads are appended to the activity log (inactive users, DESIGN §4b), over HTTP.

The API serves from a real store and produces to a real broker; the records are read
back from the ``activity`` topic. At most one record per user and interval, never
one for a reader of someone's own tweets, and none when turned off.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.api import activity_records, bearer, open_store, serve, settings
from views.stores.sqlite import SQLiteStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = open_store(tmp_path)
    yield store
    store.close()


def _read(client: httpx.Client, user: int, path: str = "home") -> None:
    response = client.get(f"/v1/users/{user}/{path}",
                          headers=bearer(user))
    assert response.status_code == 200, response.text


def test_home_reads_append_one_record_per_user_and_interval(store, kafka_settings):
    before = int(time.time() * 1000)
    with serve(settings(store), store, kafka_settings) as client:
        for user in (5, 5, 6, 5):
            _read(client, user)
        _read(client, 7, "tweets")  # an author page is not a home read
        records = activity_records(kafka_settings, want=2)
        metrics = client.get("/metrics").text
    assert sorted(r.user_id for r in records) == [5, 6]
    assert all(before <= r.created_at <= int(time.time() * 1000) for r in records)
    assert 'fanout_activity_records_total{outcome="sent"} 2.0' in metrics


def test_a_short_interval_appends_again(store, kafka_settings):
    with serve(settings(store, activity_every_s=0.2), store, kafka_settings) as client:
        _read(client, 5)
        time.sleep(0.4)
        _read(client, 5)
        records = activity_records(kafka_settings, want=2)
    assert [r.user_id for r in records] == [5, 5]
    assert records[0].created_at < records[1].created_at


def test_reads_are_not_logged_when_turned_off(store, kafka_settings):
    with serve(settings(store, activity_every_s=0), store, kafka_settings) as client:
        _read(client, 5)
        assert "fanout_activity_records" not in client.get("/metrics").text
    assert activity_records(kafka_settings, want=1, wait_s=2.0) == []
