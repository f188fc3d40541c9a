"""Keyspaces on the test session's Cassandra (``cassandra_hosts``, ``tests/plugins/cassandra.py``).

Each test module (or test) works in a keyspace of its own, created with the store's
schema and dropped at the end, so tests never see each other's rows.
``FANOUT_CASSANDRA_OPTIONS`` adds store URL options for an external cluster (e.g.
``local_dc=dc1&rf=3``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from views.stores.cassandra.config import parse_url
from views.stores.cassandra.schema import apply_schema, connect


def keyspace_url(hosts: str, keyspace: str, options: str = "") -> str:
    """``cassandra://hosts/keyspace?options``, with FANOUT_CASSANDRA_OPTIONS added."""
    extra = "&".join(filter(None, (os.environ.get("FANOUT_CASSANDRA_OPTIONS", ""), options)))
    return f"cassandra://{hosts}/{keyspace}" + (f"?{extra}" if extra else "")


def new_keyspace_name(prefix: str = "fanout_test") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@contextmanager
def fresh_keyspace(hosts: str, options: str = "", *, schema: bool = True) -> Iterator[str]:
    """A new keyspace's store URL (with the schema applied unless ``schema=False``)."""
    url = keyspace_url(hosts, new_keyspace_name(), options)
    config = parse_url(url)
    cluster, session = connect(config, wait=60)
    try:
        if schema:
            apply_schema(session, config.keyspace, config.replication.cql_map())
        yield url
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {config.keyspace}", timeout=120)
        cluster.shutdown()
