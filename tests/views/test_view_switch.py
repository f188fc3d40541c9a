"""Changing a view's settings is refused on its checkpoint; the API switches views whole.

No Spark and no broker: the settings fingerprint kept beside a checkpoint
(:mod:`views.fingerprint`) against a job asked for other settings, and the API
(uvicorn over real SQLite stores built by the in-process join) following a view
pointer file (:mod:`views.pointer`, :mod:`serving.switch`) from one store to
another while a client keeps reading. The whole rebuild beside a live stack is
``tests/stack/test_beside.py``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from unittest.mock import MagicMock

from pyspark.sql import SparkSession

from infra import webclient
from ingest.events import Follow, Post, UserUpsert
from ingest.settings import KafkaSettings
from serving.app import create_app
from serving.settings import ServingSettings
from tests.support.api import running
from tests.support.process import wait_for
from views import fingerprint, job, pointer
from views.join import JoinConfig
from views.local import LocalJoin
from views.pointer import Pointer, ViewRecord
from views.settings import ViewSettings
from views.stores.sqlite import SQLiteStore

T0 = 1_700_000_000_000


def _view(tmp_path: Path, **changes: object) -> ViewSettings:
    return ViewSettings(store_url=f"sqlite:///{tmp_path / 'v.sqlite'}",
                        checkpoint_dir=tmp_path / "checkpoints", **changes)


def _started(path: Path) -> None:
    (path / "offsets").mkdir(parents=True)
    (path / "offsets" / "0").write_text("{}")


def test_a_setting_the_checkpoint_cannot_take_is_refused_naming_the_rebuild_beside(
        tmp_path, caplog):
    view = _view(tmp_path, timeline_cap=60)
    assert fingerprint.refusal(view, job.checkpoint_path(view)) is None  # nothing there yet
    fingerprint.record(view)
    _started(job.checkpoint_path(view))
    assert fingerprint.refusal(view, job.checkpoint_path(view)) is None  # same settings
    # Speed settings may change on a running view.
    faster = _view(tmp_path, timeline_cap=60, trigger_seconds=2.0, max_records_per_batch=10)
    assert fingerprint.refusal(faster, job.checkpoint_path(faster)) is None
    other = _view(tmp_path, timeline_cap=80)
    refused = fingerprint.refusal(other, job.checkpoint_path(other))
    assert refused is not None
    assert "timeline_cap 60 -> 80" in refused
    assert "`fanout rebuild --beside --timeline-cap 80`" in refused
    assert "FANOUT_TIMELINE_CAP=60" in refused and "layout" not in refused.split("(")[-1]
    spark = MagicMock(spec_set=SparkSession)
    caplog.set_level(logging.ERROR, logger="views.job")
    code = job.run(spark, KafkaSettings(bootstrap="127.0.0.1:1"), other, threading.Event())
    assert code == job.EXIT_SETTINGS and "fanout rebuild --beside" in caplog.text
    assert not spark.mock_calls and not (tmp_path / "v.sqlite").exists()


def test_a_setting_left_at_its_default_is_taken_from_the_checkpoints_record(tmp_path):
    """A checkpoint built when the default was 64 key buckets resumes on a version whose
    default is 16, unless the job is asked for another count."""
    built = _view(tmp_path, key_buckets=64)
    fingerprint.record(built)
    _started(job.checkpoint_path(built))
    later = _view(tmp_path)  # nothing given: today's defaults
    assert "key_buckets" not in later.model_fields_set
    resumed = fingerprint.adopted(later)
    assert resumed.key_buckets == 64 and resumed.timeline_cap == later.timeline_cap
    assert job.checkpoint_path(resumed) == job.checkpoint_path(built)
    assert fingerprint.refusal(resumed, job.checkpoint_path(resumed)) is None
    asked = fingerprint.adopted(_view(tmp_path, key_buckets=later.key_buckets))
    assert asked.key_buckets == later.key_buckets != 64
    refused = fingerprint.refusal(asked, job.checkpoint_path(asked))
    assert refused is not None and "key_buckets 64 -> " in refused
    assert fingerprint.adopted(_view(tmp_path / "elsewhere")) == _view(tmp_path / "elsewhere")


def test_other_partitioning_beside_a_checkpoint_without_a_fingerprint_is_refused(tmp_path):
    """A directory from before fingerprints: a job with other key buckets would start
    an empty checkpoint beside the old one and replay the log onto its store."""
    old = _view(tmp_path, key_buckets=64)
    _started(job.checkpoint_path(old))
    assert fingerprint.refusal(old, job.checkpoint_path(old)) is None  # resumes: adopted
    new = _view(tmp_path, key_buckets=32)
    refused = fingerprint.refusal(new, job.checkpoint_path(new))
    assert refused is not None and "fanout rebuild --beside" in refused
    assert "state-v" in refused and "b64" in refused


def _store(path: Path, tweet: int) -> str:
    """A store where user 1 follows author 10, who posted ``tweet``."""
    store = SQLiteStore(path, cap=50).open()
    try:
        LocalJoin(JoinConfig(cap=50, promote_at=1000, demote_below=999), store).run(
            [Follow(1, 10, T0), UserUpsert(10, "ten", "Ten", T0),
             Post(tweet, 10, T0 + 1, f"tweet {tweet}")])
    finally:
        store.close()
    return f"sqlite:///{path}"


def test_the_api_switches_every_request_at_once_to_the_view_the_pointer_names(tmp_path):
    """Both stores were built by the same batches: same page versions, so a page cache
    keyed without the view would keep serving the old store's page."""
    a, b = _store(tmp_path / "a.sqlite", 100), _store(tmp_path / "b.sqlite", 200)
    path = tmp_path / "view.json"
    pointer.write(path, Pointer(ViewRecord(0, a, str(tmp_path / "ca"), {})))
    settings = ServingSettings(store_url="sqlite:///nowhere", view_file=path, auth=False,
                               activity_every_s=0)
    seen: list[str] = []
    stop = threading.Event()
    with running(create_app(settings)) as base:

        def read() -> None:
            with webclient.client(base_url=base, timeout=10) as client:
                while not stop.is_set():
                    body = client.get("/v1/users/1/home").json()
                    seen.append(",".join(e["tweet_id"] for e in body["entries"]))

        reader = threading.Thread(target=read)
        reader.start()
        wait_for(lambda: seen, 30, "a first read of the old view")
        pointer.write(path, Pointer(ViewRecord(1, b, str(tmp_path / "cb"), {}),
                                    ViewRecord(0, a, str(tmp_path / "ca"), {}), 1))
        deadline = time.monotonic() + 10
        while pointer.serving_workers(path).get(os.getpid(), {}).get("switch") != 1:
            assert time.monotonic() < deadline, "the API did not acknowledge the switch"
            time.sleep(0.01)
        acknowledged = len(seen)  # the next read but one began after the acknowledgement
        wait_for(lambda: len(seen) >= acknowledged + 2, 30, "two reads after the switch")
        stop.set()
        reader.join()
        health = webclient.get(f"{base}/healthz").json()
    assert health["store"] == b
    assert set(seen) == {"100", "200"}, set(seen)  # never empty, never a mix
    first_new = seen.index("200")
    assert all(s == "200" for s in seen[first_new:]), "a read went back to the old view"
    assert seen[-1] == "200"
