"""Events written into the changelog topics, as the tests' histories are."""

from __future__ import annotations

from collections.abc import Iterable

from ingest.events import Event
from ingest.producer import ChangelogProducer
from ingest.settings import KafkaSettings


def produce(kafka: KafkaSettings, events: Iterable[Event]) -> None:
    """Send ``events`` through the contract's producer; wait for every acknowledgement."""
    with ChangelogProducer(kafka) as producer:
        for event in events:
            producer.send(event)
        assert producer.flush(60) == 0, "records still unacknowledged after 60 s"
