"""Topic layout: create the changelog topics and check they are co-partitioned.

The join relies on one author's tweets and follower edges sitting in the same
partition number of every topic (DESIGN §3), which holds only if all topics have the
same partition count. :func:`create_topics` makes the three topics (idempotently) and
then checks exactly that, so a mismatch fails loudly at start instead of silently
splitting the join. ``users`` is a compacted profile changelog.

A broker with ``auto.create.topics.enable`` (Kafka's default; the local node turns it
off) creates, with its default partition count, any topic named in a metadata
request that allows it (a producer's, or AdminClient.list_topics(topic)): create the
topics before anything produces, and list metadata here without naming topics so
that the check never creates one.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ingest.errors import BrokerUnavailable, IngestError
from ingest.events import ACTIVITY, TOPICS, USERS
from ingest.settings import KafkaSettings

log = logging.getLogger(__name__)

_TOPIC_CONFIG: Final = {USERS: {"cleanup.policy": "compact"},
                         ACTIVITY: {"cleanup.policy": "compact"}}


class TopicLayoutError(IngestError):
    """The changelog topics are missing or not co-partitioned."""


def create_topics(settings: KafkaSettings, admin_timeout: float = 15.0) -> int:
    """Create the changelog topics if absent; return their common partition count.

    Raises :class:`TopicLayoutError` when the topics exist with different partition
    counts, and :class:`~ingest.errors.BrokerUnavailable` when the broker does not
    answer within ``admin_timeout`` seconds.
    """
    if not settings.bootstrap:
        msg = "KafkaSettings.bootstrap is empty: run `fanout up` or set KAFKA_BOOTSTRAP"
        raise TopicLayoutError(msg)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    deadline = time.monotonic() + admin_timeout
    _create(admin, settings, deadline)
    counts = _await_partition_counts(admin, settings, deadline)
    return check_copartitioned(counts, settings.partitions)


def check_copartitioned(counts: dict[str, int], expected: int) -> int:
    """The one partition count shared by every topic in ``counts``, or raise."""
    distinct = set(counts.values())
    if len(distinct) != 1:
        shown = ", ".join(f"{topic}={n}" for topic, n in sorted(counts.items()))
        msg = (f"topics are not co-partitioned ({shown}): every changelog topic needs the "
               f"same partition count, or one author's events land in different partitions")
        raise TopicLayoutError(msg)
    (count,) = distinct
    if count != expected:
        log.warning("topics have %d partitions, not the configured %d; using %d",
                    count, expected, count)
    return count


def durability(replication: int) -> dict[str, str]:
    """Topic config for ``replication`` copies.

    With more than one, an acks=all write needs a majority in sync (2 of 3), so an
    acknowledged record survives any one broker's loss, and writes stop rather than
    land on a lone replica.
    """
    if replication < 2:
        return {}
    return {"min.insync.replicas": str(replication // 2 + 1)}


def _create(admin: AdminClient, settings: KafkaSettings, deadline: float) -> None:
    new = [NewTopic(settings.topic(t), settings.partitions, settings.replication,
                    config=_TOPIC_CONFIG.get(t, {}) | durability(settings.replication))
           for t in TOPICS]
    futures = admin.create_topics(new, request_timeout=_remaining(deadline))
    for topic, future in futures.items():
        try:
            future.result(timeout=_remaining(deadline))
            log.info("created topic %s with %d partitions", topic, settings.partitions)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                msg = f"could not create topic {topic} on {settings.bootstrap}: {exc}"
                raise TopicLayoutError(msg) from exc
        except TimeoutError as exc:
            msg = f"broker {settings.bootstrap} did not answer create_topics in time"
            raise BrokerUnavailable(msg) from exc


def _await_partition_counts(admin: AdminClient, settings: KafkaSettings,
                            deadline: float) -> dict[str, int]:
    """Partition count of every topic, once metadata shows all of them."""
    wanted = settings.physical_topics()
    while True:
        try:
            topics = admin.list_topics(timeout=_remaining(deadline)).topics
        except KafkaException as exc:
            msg = f"broker {settings.bootstrap} did not answer list_topics: {exc}"
            raise BrokerUnavailable(msg) from exc
        missing = [t for t in wanted if t not in topics or not topics[t].partitions]
        if not missing:
            return {t: len(topics[t].partitions) for t in wanted}
        if time.monotonic() >= deadline:
            msg = f"topics {missing} still absent from metadata after create_topics"
            raise TopicLayoutError(msg)
        time.sleep(0.05)


def _remaining(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())
