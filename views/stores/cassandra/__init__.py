"""The Cassandra store (DESIGN §6), one module per part.

- :mod:`~views.stores.cassandra.store`: :class:`CassandraStore`, the contract's
  backend (reads, and a batch written in phases);
- :mod:`~views.stores.cassandra.config`: the ``cassandra://`` URL, its options and
  the driver's policies;
- :mod:`~views.stores.cassandra.statements`: every CQL statement, and the pure step
  from a write plan to bound values;
- :mod:`~views.stores.cassandra.rows`: the reads' queries and row decoders;
- :mod:`~views.stores.cassandra.changes`: the change feed (what each batch changed),
  which the store gives serving's page caches;
- :mod:`~views.stores.cassandra.executor`: requests built from ops, run concurrently
  under one failure policy (retried for the store's ``retry_s``);
- :mod:`~views.stores.cassandra.sink` and :mod:`~views.stores.cassandra.tasks`: the
  executor sink, and what one of its Spark tasks writes through a store;
- :mod:`~views.stores.cassandra.schema` and ``cql/``: the versioned schema steps.

Importing this package loads cassandra-driver, which is why
:func:`views.stores.store_from_url` imports it only for a ``cassandra://`` URL.
"""

from views.stores.cassandra.config import CassandraConfig, parse_url
from views.stores.cassandra.store import CassandraStore

__all__ = ("CassandraConfig", "CassandraStore", "parse_url")
