"""Store backends behind one contract, picked by URL.

``sqlite:///path/to/file.sqlite`` (embedded default) or
``cassandra://host1,host2[:port]/keyspace`` (production). Backends are imported
lazily so that the SQLite path never needs the Cassandra driver loaded.
"""

from __future__ import annotations

from urllib.parse import urlparse

from views.errors import ViewError
from views.stores.contract import Store


def store_from_url(url: str, cap: int = 800, inactive_days: float = 0.0) -> Store:
    """Build (not open) the store a URL names.

    ``inactive_days`` matters to the writer only (the view job): readers see a
    dormant user's timeline through its horizon whatever they were built with.
    """
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        from views.stores.sqlite import SQLiteStore

        # SQLAlchemy's convention: sqlite:///relative/path, sqlite:////absolute/path.
        path = url.removeprefix("sqlite://").removeprefix("/")
        if not path:
            msg = f"store URL {url!r} has no file path (sqlite:///path/to/file.sqlite)"
            raise ViewError(msg)
        return SQLiteStore(path, cap=cap, inactive_days=inactive_days)
    if parsed.scheme == "cassandra":
        try:
            from views.stores.cassandra import CassandraStore  # type: ignore[import-not-found]
        except ImportError as exc:
            msg = f"the Cassandra store is not available: {exc}"
            raise ViewError(msg) from exc
        return CassandraStore.from_url(  # type: ignore[no-any-return]
            url, cap=cap, inactive_days=inactive_days)
    msg = f"unknown store URL {url!r}: use sqlite:///path or cassandra://hosts/keyspace"
    raise ViewError(msg)
