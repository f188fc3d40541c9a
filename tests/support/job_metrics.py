"""The view job's metrics as the tests feed them: a Spark progress report and batch-log rows.

:data:`PROGRESS` is the JSON of Spark's ``StreamingQueryProgress`` in the shape the
view query reports it (taken from a run of ``views.job.start_query`` on Spark 4, its
state operator's custom metrics trimmed); :func:`progress` renumbers it,
:func:`logged` makes a batch-log row and :func:`samples` reads a Prometheus render
back by name and labels. Used by the job metrics' tests and the dashboard's.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ingest.settings import KafkaSettings
from views.stores.base import BatchInfo

#: When :data:`PROGRESS`'s batch started, in epoch seconds.
STARTED = datetime(2026, 11, 26, 23, 59, 23, 761_000, tzinfo=UTC).timestamp()
QUERY_ID = "0451296f-df98-42fd-ba6b-560af7616ea1"
RUN_ID = "de8a2fe1-53f7-4ff1-8f25-759d61aaed39"
KAFKA = KafkaSettings(bootstrap="127.0.0.1:1", partitions=2, topic_prefix="cap_")
PROGRESS: dict[str, Any] = {
    "id": QUERY_ID, "runId": RUN_ID, "name": "fanout_views",
    "timestamp": "2026-11-26T23:59:23.761Z", "batchId": 1, "batchDuration": 1200,
    "numInputRows": 499, "inputRowsPerSecond": 57.6, "processedRowsPerSecond": 415.8,
    "durationMs": {"addBatch": 917, "commitOffsets": 10, "getBatch": 3, "latestOffset": 16,
                   "queryPlanning": 196, "triggerExecution": 1199, "walCommit": 35},
    "stateOperators": [{
        "operatorName": "transformWithStateInPandasExec", "numRowsTotal": 102,
        "numRowsUpdated": 100, "allUpdatesTimeMs": 797, "numRowsRemoved": 0,
        "allRemovalsTimeMs": 0, "commitTimeMs": 30, "memoryUsedBytes": 2127208,
        "numRowsDroppedByWatermark": 0, "numShufflePartitions": 2, "numStateStoreInstances": 2,
        "customMetrics": {"numMapStateVars": 2, "numValueStateVars": 2,
                          "rocksdbGetCount": 197, "rocksdbSstFileSize": 12251}}],
    "sources": [{
        "description": "KafkaV2[Subscribe[cap_tweets, cap_follows, cap_users, cap_activity]]",
        "startOffset": {"cap_activity": {"0": 0, "1": 0}, "cap_tweets": {"0": 66, "1": 87},
                        "cap_follows": {"0": 136, "1": 180}, "cap_users": {"0": 15, "1": 15}},
        "endOffset": {"cap_activity": {"0": 0, "1": 0}, "cap_tweets": {"0": 132, "1": 174},
                      "cap_follows": {"0": 272, "1": 360}, "cap_users": {"0": 30, "1": 30}},
        "latestOffset": {"cap_activity": {"0": 0, "1": 0}, "cap_tweets": {"0": 220, "1": 290},
                         "cap_follows": {"0": 452, "1": 598}, "cap_users": {"0": 50, "1": 50}},
        "numInputRows": 499, "inputRowsPerSecond": 57.6, "processedRowsPerSecond": 415.8,
        "metrics": {"avgOffsetsBehindLatest": "82.8", "maxOffsetsBehindLatest": "238",
                    "minOffsetsBehindLatest": "0"}}],
    "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
}


def progress(batch_id: int = 1, *, run_id: str = RUN_ID, ends: Any = None,
             ms: int = 1199, rows: int = 499) -> dict[str, Any]:
    """:data:`PROGRESS` as batch ``batch_id`` of run ``run_id``; ``ends``: its endOffset."""
    p = copy.deepcopy(PROGRESS)
    p.update(runId=run_id, batchId=batch_id, numInputRows=rows,
             timestamp=f"2026-11-26T23:59:{22 + batch_id:02d}.761Z")  # batch 1: STARTED
    p["durationMs"]["triggerExecution"] = ms
    if ends is not None:
        p["sources"][0]["endOffset"] = ends
    return p


def samples(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def logged(batch_id: int, rows: int, freshness_ms: int | None) -> BatchInfo:
    """A batch-log row; ``freshness_ms`` None: the batch applied no event with a time."""
    finished = 1_800_000_000_000 + batch_id * 1000
    newest = 0 if freshness_ms is None else finished - freshness_ms
    return BatchInfo(batch_id, finished, rows, 0.01, newest)
