"""The API as the tests run it: served over real HTTP, with tokens, read back from Kafka.

The app runs as in production — uvicorn on a random loopback port (:func:`running`)
with its real middleware — against a temporary SQLite store and, where a test needs
one, the session's Kafka node; what it produced is read back from the topics
(:func:`read_record`, :func:`activity_records`). Used by the read API's, the write
path's, auth's, the metrics' and the schema fuzz's tests.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from confluent_kafka import Consumer, TopicPartition
from fastapi import FastAPI

from infra import webclient
from ingest.consistency import decode_token
from ingest.events import ACTIVITY, Activity, Event, decode
from ingest.settings import KafkaSettings
from serving.app import create_app
from serving.callers import mint
from serving.reads import FastPath
from serving.settings import ServingSettings
from views.kafka_offsets import consumer_config
from views.stores.sqlite import SQLiteStore

SECRET = "test-secret-0123456789abcdef"


@contextmanager
def running(app: FastAPI, deadline_s: float = 15.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free loopback port; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", http="httptools"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _wait_until_answering(base, server, thread, time.monotonic() + deadline_s)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=deadline_s)
        sock.close()
    assert not thread.is_alive(), f"uvicorn at {base} did not stop within {deadline_s}s"


def _wait_until_answering(base: str, server: uvicorn.Server, thread: threading.Thread,
                          deadline: float) -> None:
    while time.monotonic() < deadline:
        if not thread.is_alive():
            pytest.fail(f"uvicorn at {base} exited before serving (see its log)")
        if server.started:
            try:
                webclient.get(f"{base}/healthz", timeout=1.0)
                return
            except httpx.TransportError:
                pass
        time.sleep(0.02)
    pytest.fail(f"uvicorn at {base} did not answer /healthz before the deadline")



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
            webclient.client(base_url=base, timeout=30) as client:
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


def activity_records(kafka: KafkaSettings, want: int, wait_s: float = 15.0) -> list[Activity]:
    """Every record of the activity topic, once ``want`` arrived (then 1 s more)."""
    consumer = Consumer(consumer_config(kafka.bootstrap))
    topic = kafka.topic(ACTIVITY)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(kafka.partitions)])
        out: list[Activity] = []
        deadline = time.monotonic() + wait_s
        quiet_until = None
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                if len(out) >= want:
                    quiet_until = quiet_until or time.monotonic() + 1.0
                    if time.monotonic() > quiet_until:
                        break
                continue
            assert message.error() is None, message.error()
            event = decode(ACTIVITY, message.key(), message.value())
            assert isinstance(event, Activity)
            out.append(event)
        return out
    finally:
        consumer.close()


class CountingFastPath(FastPath):
    """The app's fast path, counting the reads it answered."""

    in_stack = 0

    async def answer(self, *args):  # noqa: ANN002, ANN201
        answer = await super().answer(*args)
        self.in_stack += answer is not None
        return answer


def counting_fast_path(app: FastAPI) -> CountingFastPath:
    """``app``'s fast path, made to count its answers."""
    fast = app.state.fast_path
    fast.__class__ = CountingFastPath
    return fast


def exchange(base: str, raw: bytes, responses: int, settle: float = 2.0
             ) -> tuple[list[bytes], bool]:
    """Send ``raw`` on one connection: its first ``responses`` answers; whether it closed
    within ``settle`` seconds of the last."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        buffer, out = b"", []
        while len(out) < responses:
            head_end = buffer.find(b"\r\n\r\n")
            if head_end >= 0:
                head = buffer[:head_end].decode("latin-1")
                length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")
                               if line.lower().startswith("content-length:")), 0)
                end = head_end + 4 + length
                if len(buffer) >= end:
                    out.append(buffer[:end])
                    buffer = buffer[end:]
                    continue
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(out)} of {responses} answers"
            buffer += chunk
        assert buffer == b""
        sock.settimeout(settle)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
    return out, closed


def raw_get(path: str, *lines: str, version: str = "1.1") -> bytes:
    """A GET request as the bytes a client sends, with ``lines`` as its headers."""
    return "\r\n".join([f"GET {path} HTTP/{version}", "Host: t", *lines, "", ""]).encode()


def without_date(response: bytes) -> bytes:
    """A raw answer without its ``date`` header, the one line two servers may differ in."""
    return b"\r\n".join(line for line in response.split(b"\r\n")
                        if not line.lower().startswith(b"date:"))
