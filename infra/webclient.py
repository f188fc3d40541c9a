"""HTTP clients for the stack's endpoints, sharing one TLS context per process.

httpx builds a TLS context for every client it makes, ``httpx.get`` included, and
loads the CA bundle into it: 55 to 100 ms of CPU each on a 2-core box, where a client
given a context made once costs 0.3 ms (``benchmarks/micro``, ``test_http_client``). The stack's commands and checks make clients
by the hundred (``/healthz`` polls while a service starts, a probe or a stream
client per connection, ``fanout status``), so they make them here. The context is
httpx's own default (``SSL_CERT_FILE``, ``SSL_CERT_DIR`` or certifi's bundle), made
on first use, under a lock, so that threads which start together (a stream client per
connection) share it rather than each loading the CA bundle.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any

import httpx

_tls: ssl.SSLContext | None = None
_tls_lock = threading.Lock()


def tls() -> ssl.SSLContext:
    """The process's TLS context, as httpx would make it for ``verify=True``."""
    global _tls  # noqa: PLW0603 - one context per process, made once
    with _tls_lock:
        if _tls is None:
            _tls = httpx.create_ssl_context()
        return _tls


def client(**options: Any) -> httpx.Client:
    """``httpx.Client(**options)`` with the shared TLS context (unless ``verify`` is given)."""
    options.setdefault("verify", tls())
    return httpx.Client(**options)


def get(url: str, **options: Any) -> httpx.Response:
    """``httpx.get`` with the shared TLS context: a new client and connection each call."""
    return _once("GET", url, **options)


def post(url: str, **options: Any) -> httpx.Response:
    """``httpx.post`` with the shared TLS context."""
    return _once("POST", url, **options)


def _once(method: str, url: str, **options: Any) -> httpx.Response:
    with client(timeout=options.pop("timeout", 5.0)) as http:  # httpx's default timeout
        return http.request(method, url, **options)
