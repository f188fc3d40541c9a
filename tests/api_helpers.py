"""Helpers shared by the tests of the write path, auth, metrics and the schema fuzz.

The app runs as in production — uvicorn on a random loopback port (``running`` from
``tests/test_api.py``) with its real middleware — against a temporary SQLite store
and, where a test needs one, the session's Kafka node.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, TopicPartition

from ingest.consistency import decode_token
from ingest.events import Event, decode
from ingest.settings import KafkaSettings
from serving.app import create_app
from serving.auth import mint
from serving.settings import ServingSettings
from tests.test_api import running
from views.kafka_offsets import consumer_config
from views.stores.sqlite import SQLiteStore

SECRET = "test-secret-0123456789abcdef"


def settings(store: SQLiteStore, **overrides: Any) -> ServingSettings:
    """Auth on with :data:`SECRET`, short waits; ``overrides`` win."""
    base: dict[str, Any] = {"store_url": f"sqlite:///{store.path}", "auth_secret": SECRET,
                            "after_timeout_ms": 400, "write_timeout_ms": 5_000}
    return ServingSettings(**(base | overrides))


@contextmanager
def serve(config: ServingSettings, store: SQLiteStore,
          kafka: KafkaSettings) -> Iterator[httpx.Client]:
    """A client of the app served over real HTTP."""
    with running(create_app(config, store, kafka=kafka)) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        yield client


def bearer(user: int, ttl: int = 600, now: float | None = None,
           secret: str = SECRET) -> dict[str, str]:
    """The Authorization header of a token for ``user``."""
    return {"Authorization": f"Bearer {mint(user, secret.encode(), ttl, now)}"}


def open_store(tmp_path: Path) -> SQLiteStore:
    return SQLiteStore(tmp_path / "store.sqlite", cap=50).open()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unreachable_kafka() -> KafkaSettings:
    return KafkaSettings(bootstrap=f"127.0.0.1:{closed_port()}", partitions=2,
                         topic_prefix="nowhere_")


def assert_error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The JSON error shape: ``error`` and ``message`` strings, nothing else but ``field``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) <= {"error", "message", "field"}, body
    assert isinstance(body["error"], str) and body["error"]
    assert isinstance(body["message"], str) and body["message"]
    return body


def read_record(kafka: KafkaSettings, token: str, deadline_s: float = 15.0) -> tuple[bytes, Event]:
    """The (key, event) of the record a consistency token names, read with assign()."""
    where = decode_token(token)
    consumer = Consumer(consumer_config(kafka.bootstrap))
    try:
        consumer.assign([TopicPartition(kafka.topic(where.topic), where.partition, where.offset)])
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            assert message.offset() == where.offset
            key = message.key() or b""
            return key, decode(where.topic, key, message.value())
    finally:
        consumer.close()
    msg = f"no record at {where} within {deadline_s}s"
    raise AssertionError(msg)
