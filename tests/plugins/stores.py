"""An empty store of each kind, for tests that hold a behaviour on both backends.

``any_store`` is parametrized: a SQLite file in the test's directory, and an empty
keyspace on the session's Cassandra (``page_fresh_ms=0``: every page-token question is
asked of the store), each with a timeline cap of 20.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from views.stores.sqlite import SQLiteStore


@pytest.fixture(params=["sqlite", "cassandra"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        store = SQLiteStore(tmp_path / "any.sqlite", cap=20).open()
        yield store
        store.close()
        return
    from tests.support.cassandra import fresh_keyspace, writing_store

    with fresh_keyspace(request.getfixturevalue("cassandra_hosts"), "page_fresh_ms=0") as url:
        store = writing_store(url, cap=20).open()
        try:
            yield store
        finally:
            store.close()
