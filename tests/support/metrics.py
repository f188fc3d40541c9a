"""The API's ``/metrics`` as the tests read it, and the batch log they fill to feed it.

:func:`scrape` parses a scrape with prometheus_client's own text parser; :func:`value`
picks one sample by name and labels; :func:`batch` logs a micro-batch (with dead
letters) through :meth:`Store.apply` as the job's sink does. Used by the API's metrics
tests, the multi-worker ones and the dashboard's.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from views.delta import Delta
from views.stores.sqlite import SQLiteStore

HOME = "/v1/users/{user_id}/home"


def batch(store: SQLiteStore, batch_id: int, event_time: int, dead: int = 0) -> None:
    deltas = [Delta.source_offset("tweets", 0, batch_id * 10, event_time)]
    deltas += [Delta.dead_letter("tweets", 1, batch_id * 100 + i, "bad", b"{")
               for i in range(dead)]
    store.apply(deltas, batch_id=batch_id)


def scrape(client: httpx.Client) -> dict[str, list[Sample]]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(response.text)}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{name} {labels}: {found}"
    return found[0]
