"""Running the Cassandra store's statements: requests built in bulk, and one failure policy.

Every read and write of :class:`~views.stores.cassandra.store.CassandraStore` runs here:
a list of ops (a statement name and its values) becomes requests — one statement, or an
unlogged batch of a partition's statements, small partitions of one replica set packed
(:func:`cql.units`) — serialized by their columns' types without binding
(:func:`requests`), and :func:`execute` runs them concurrently.

**Retries.** Every write is an upsert or delete keyed by its primary key at an explicit
timestamp, so running one again writes the same cells. :func:`execute` runs a request
that failed transiently — a timeout, too few replicas, a lost connection, no node
answering — again, with backoff (doubling to 15 s), for up to ``retry_s`` seconds, with a log line
per attempt (the one policy of :func:`ingest.retry.within`); then, or at once for any
other failure, it raises :class:`StoreError`. The
store's ``retry_s`` is that one parameter: 0 (the API's reads, the driver's batches)
fails at the first failure; the executor sink's tasks wait out the URL's ``retry``
(120 s by default: long enough for a node to restart), after which Spark may run the
task again, which is as safe. :func:`retrying` opens a store under the same policy.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final, TypeVar

from cassandra import CoordinationFailure, OperationTimedOut, Timeout, Unavailable
from cassandra.cluster import NoHostAvailable
from cassandra.concurrent import execute_concurrent
from cassandra.connection import ConnectionException
from cassandra.query import BatchStatement, BatchType
from tenacity import Retrying

from ingest.retry import Say, attempts, within
from views.errors import StoreError
from views.stores.cassandra import statements as cql
from views.stores.cassandra.rows import Rows

log = logging.getLogger(__name__)

#: Backoff before the second run; doubled per attempt, capped at ``_BACKOFF_MAX``.
_BACKOFF_S: Final = 0.2
_BACKOFF_MAX: Final = 15.0
#: Failures worth running a statement again for: the node was slow, short of
#: replicas or unreachable. Anything else (a bad request) fails at once.
TRANSIENT: Final = (OperationTimedOut, Timeout, Unavailable, CoordinationFailure,
                    NoHostAvailable, ConnectionException)

_T = TypeVar("_T")


def transient(exc: BaseException) -> bool:
    """Whether a failed request is worth running again (see :data:`TRANSIENT`)."""
    return isinstance(exc, TRANSIENT)


class _Failed(Exception):
    """Some requests of one run of :func:`execute` failed: which, and the first failure."""

    def __init__(self, failed: list[tuple[int, BaseException]], ran: int) -> None:
        super().__init__(failed[0][1])
        self.failed, self.ran, self.first = failed, ran, failed[0][1]


def _policy(retry_s: float, say: Say) -> Retrying:
    """:func:`ingest.retry.within` for Cassandra: transient failures, from 0.2 s doubling."""
    return within(retry_s, first=_BACKOFF_S, most=_BACKOFF_MAX, say=say,
                  transient=lambda exc: transient(exc.first if isinstance(exc, _Failed) else exc))


def execute(session: Any, requests: Sequence[Any], names: Sequence[str], *, profile: object,
            concurrency: int, retry_s: float) -> list[Rows]:
    """Run ``requests`` concurrently; each one's rows, in order (module docstring: retries).

    ``names``: what each request runs, for the log and the error. A run again runs only
    the requests that failed.
    """
    results: list[Rows] = [[] for _ in requests]
    pending = list(range(len(requests)))

    def run() -> None:
        nonlocal pending
        outcomes = execute_concurrent(session, [requests[i] for i in pending],
                                      concurrency=concurrency, raise_on_first_error=False,
                                      execution_profile=profile)
        failed: list[tuple[int, BaseException]] = []
        for i, (ok, value) in zip(pending, outcomes, strict=True):
            if ok:
                results[i] = all_rows(value)
            else:
                failed.append((i, value))
        if failed:
            ran, pending = len(pending), [i for i, _ in failed]
            raise _Failed(failed, ran)

    def say(attempt: int, exc: BaseException, pause: float, left: float) -> None:
        assert isinstance(exc, _Failed)
        log.warning("Cassandra: %d of %d requests failed (attempt %d, e.g. %s: %s); "
                    "running them again in %.1fs (giving up after %.0fs)", len(exc.failed),
                    exc.ran, attempt, names[exc.failed[0][0]], exc.first, pause, retry_s)

    def gave_up(exc: _Failed, tried: int) -> StoreError:
        msg = (f"Cassandra: {len(exc.failed)} of {exc.ran} requests failed after "
               f"{tried} attempt(s) in {retry_s:.0f}s, e.g. {names[exc.failed[0][0]]}: "
               f"{exc.first}")
        if retry_s:
            msg += "; start the job again (`fanout up`) once the cluster answers"
        return StoreError(msg)

    if retry_s <= 0:
        # No budget (the API's reads): the policy would give up at the first failure
        # too; building it costs ~23 us a call, on the read path's every request.
        try:
            run()
        except _Failed as exc:
            raise gave_up(exc, 1) from exc.first
        return results
    policy = _policy(retry_s, say)
    try:
        policy(run)
    except _Failed as exc:
        raise gave_up(exc, attempts(policy)) from exc.first
    return results


def retrying(what: str, call: Callable[[], _T], retry_s: float) -> _T:
    """``call()``, run again while it fails transiently, for up to ``retry_s`` (as requests are)."""

    def say(attempt: int, exc: BaseException, pause: float, left: float) -> None:
        log.warning("Cassandra: %s failed (attempt %d: %s); trying again in %.1fs "
                    "(giving up after %.0fs)", what, attempt, exc, pause, retry_s)

    return _policy(retry_s, say)(call)


def requests(groups: list[list[int]], ops: Sequence[cql.Op], prepared: dict[str, Any],
             protocol: int) -> list[tuple[Any, tuple[Any, ...]]]:
    """One request per group of :func:`cql.units`: its statement, or an unlogged batch.

    A batch's statements are serialized here by their columns' types
    (:func:`_serializers`), not bound one by one: binding builds a statement object a row
    and cost the executor sink ~8 µs a row, most of its client CPU.
    """
    out: list[tuple[Any, tuple[Any, ...]]] = []
    for group in groups:
        if len(group) == 1:
            name, params = ops[group[0]]
            out.append((prepared[name], params))
            continue
        rows: list[tuple[bool, bytes, list[bytes | None]]] = []
        for i in group:
            name, params = ops[i]
            statement = prepared[name]
            rows.append((True, statement.query_id,
                         [None if v is None else serialize(v, protocol)
                          for serialize, v in zip(_serializers(statement), params,
                                                  strict=True)]))
        first = prepared[ops[group[0]][0]]
        out.append((_batch(rows, [rows[0][2][i] for i in first.routing_key_indexes or ()]), ()))
    return out


def _batch(rows: list[Any], routing: list[bytes | None]) -> BatchStatement:
    """An unlogged batch of serialized statements, routed to the first one's replicas.

    The rows go in as the driver's own :meth:`BatchStatement.add` leaves them once it
    has bound a statement: ``(prepared, query id, serialized values)``.
    """
    batch = BatchStatement(batch_type=BatchType.UNLOGGED)
    batch._statements_and_parameters = rows  # noqa: SLF001  (what add() fills)
    batch.is_idempotent = True  # upserts and deletes at explicit timestamps
    if routing and all(part is not None for part in routing):
        batch.routing_key = routing
    return batch


@functools.lru_cache(maxsize=512)
def _serializers(statement: Any) -> tuple[Callable[[Any, int], bytes], ...]:
    """The serializer of each bind marker of a prepared statement, from its column types."""
    return tuple(c.type.serialize for c in statement.column_metadata)


_BIGINT: Final = struct.Struct(">q")  # a bigint partition key as the routing key's bytes


def replica_of(cluster: Any, keyspace: str) -> Callable[[Any], Hashable] | None:
    """A partition key's replicas, from the driver's token map (None: no token map).

    Every batched table has a bigint partition key (or a constant one); memoized.
    """
    token_map = getattr(cluster.metadata, "token_map", None)
    if token_map is None:
        return None
    token_class = token_map.token_class

    @functools.lru_cache(maxsize=65536)
    def replicas(key: Any) -> Hashable:
        if not isinstance(key, int):
            return None
        token = token_class.from_key(_BIGINT.pack(key))
        return frozenset(token_map.get_replicas(keyspace, token))

    return replicas


def all_rows(result: Any) -> Rows:
    """A result set's rows, its first page as the driver holds it (no loop in Python).

    A result with more pages is iterated: the pages after the first are fetched as
    its rows are consumed.
    """
    return list(result) if result.has_more_pages else result.current_rows


def unbatch(groups: list[list[int]], results: list[Rows], n: int) -> list[Rows]:
    """Each op's rows, in the order of the ops, from the results of its group's request."""
    rows: list[Rows] = [[] for _ in range(n)]
    for group, result in zip(groups, results, strict=True):
        if len(group) == 1:
            rows[group[0]] = result
    return rows
