"""An in-memory model of the Cassandra semantics the Cassandra store relies on.

Not a database: a checker. It parses the exact CQL text the store prepares — the
small subset fanout uses — against the tables of ``views/stores/cql/*.cql`` and
rejects what Cassandra would reject (unknown columns, a missing primary-key part, a
wrong number or type of bound values, a clustering slice that is not a prefix).
Executing, it keeps per-cell write timestamps and applies Cassandra's rules:
last write wins by timestamp, a deletion wins a tie, row and clustering-range
tombstones shadow what is older or as old, rows come back in clustering order.

It lets the contract suite run the store's real code — phases, timestamps, trims,
lookups, the driver's ``execute_concurrent`` and the asyncio bridge — when no
cluster is at hand. It cannot vouch for what only a server knows (its CQL grammar
beyond this subset, consistency, paging across nodes, performance): the
``cassandra`` backend, run with ``FANOUT_CASSANDRA_HOSTS``, does.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cassandra.cluster import ResultSet

from views.stores.schema import VERSION_TABLE, load_steps

INT64 = (-(2**63), 2**63 - 1)
INT32 = (-(2**31), 2**31 - 1)
_CLOCK = itertools.count(time.time_ns() // 1000)


class ModelError(Exception):
    """What a Cassandra node would answer with InvalidRequest."""


@dataclass
class Table:
    name: str
    columns: dict[str, str]
    partition: tuple[str, ...]
    clustering: tuple[str, ...]
    descending: frozenset[str]
    rows: dict[tuple, dict[tuple, dict[str, tuple[Any, int]]]] = field(default_factory=dict)
    row_deletions: dict[tuple, int] = field(default_factory=dict)
    range_deletions: dict[tuple, list[tuple[Callable[[tuple], bool], int]]] = field(
        default_factory=dict)

    @property
    def key(self) -> tuple[str, ...]:
        return self.partition + self.clustering

    def deletion(self, pk: tuple, ck: tuple) -> int:
        ranges = [ts for covers, ts in self.range_deletions.get(pk, ()) if covers(ck)]
        return max([self.row_deletions.get((pk, ck), -(2**63)), *ranges])

    def live(self, pk: tuple, ck: tuple) -> dict[str, Any] | None:
        """The row's live cells (key columns included), or None if nothing is live."""
        cells = self.rows.get(pk, {}).get(ck)
        if cells is None:
            return None
        dead = self.deletion(pk, ck)
        values = {c: v for c, (v, ts) in cells.items() if ts > dead}
        if not values:
            return None
        values.pop("\0marker", None)
        return {**dict(zip(self.key, pk + ck, strict=True)), **values}

    def ordered(self, pk: tuple) -> list[tuple]:
        def sort_key(ck: tuple) -> tuple:
            return tuple(-v if c in self.descending else v
                         for c, v in zip(self.clustering, ck, strict=True))
        return sorted(self.rows.get(pk, {}), key=sort_key)


def parse_table(statement: str) -> Table:
    m = re.match(r"CREATE TABLE IF NOT EXISTS (\w+) \(", statement)
    if m is None:
        raise ModelError(f"not a CREATE TABLE the model knows: {statement}")
    name, end = m.group(1), _closing(statement, m.end() - 1)
    body, options = statement[m.end():end], statement[end + 1:].removeprefix(" WITH ")
    columns, partition, clustering = {}, (), ()
    for part in re.split(r",\s*(?![^()]*\))", body):
        words = part.split()
        if words[:2] == ["PRIMARY", "KEY"]:
            keys = re.fullmatch(r"PRIMARY KEY \(\((.*?)\)(?:, (.*))?\)", part.strip())
            assert keys is not None, part
            partition = tuple(k.strip() for k in keys.group(1).split(","))
            clustering = tuple(k.strip() for k in (keys.group(2) or "").split(",") if k.strip())
        else:
            columns[words[0]] = words[1]
            if words[2:4] == ["PRIMARY", "KEY"]:
                partition = (words[0],)
    order = re.search(r"CLUSTERING ORDER BY \((.*?)\)", options or "")
    desc = frozenset(c.split()[0] for c in (order.group(1).split(",") if order else ())
                     if c.split()[1] == "DESC")
    return Table(name, columns, partition, clustering, desc)


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis that closes the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ModelError(f"unbalanced parentheses: {text}")


# -- statements ----------------------------------------------------------------------------------

_VALUE = r"\?|-?\d+|true|false|''"


@dataclass
class Statement:
    """A parsed statement: what it does, on which table, with which bound values."""

    text: str
    kind: str
    table: str
    columns: list[str] = field(default_factory=list)
    values: list[str] = field(default_factory=list)
    where: list[tuple[tuple[str, ...], str, tuple[str, ...]]] = field(default_factory=list)
    limit: str | None = None
    timestamp: str | None = None
    if_not_exists: bool = False
    distinct: bool = False
    is_idempotent: bool = False

    @property
    def markers(self) -> int:
        parts = [*self.values, *(v for _, _, vs in self.where for v in vs),
                 self.limit or "", self.timestamp or ""]
        return sum(p == "?" for p in parts)


def parse(text: str) -> Statement:
    for pattern, build in _GRAMMAR:
        m = re.fullmatch(pattern, text)
        if m is not None:
            return build(text, m)
    raise ModelError(f"statement outside the model's CQL subset: {text}")


def _where(clause: str | None) -> list[tuple[tuple[str, ...], str, tuple[str, ...]]]:
    out = []
    for cond in filter(None, (clause or "").split(" AND ")):
        single = re.fullmatch(rf"(\w+) (=) ({_VALUE}|'\w+')", cond)
        multi = re.fullmatch(r"\(([\w, ]+)\) (<=|<|>=|>) \(([?, ]+)\)", cond)
        if single:
            out.append(((single.group(1),), "=", (single.group(3),)))
        elif multi:
            cols = tuple(c.strip() for c in multi.group(1).split(","))
            vals = tuple(v.strip() for v in multi.group(3).split(","))
            out.append((cols, multi.group(2), vals))
        else:
            raise ModelError(f"condition outside the model's subset: {cond}")
    return out


def _split(text: str) -> list[str]:
    return [p.strip() for p in text.split(",")]


_GRAMMAR: list[tuple[str, Callable[[str, re.Match], Statement]]] = [
    (r"INSERT INTO ([\w.]+) \((.+?)\) VALUES \((.+?)\)(?: USING TIMESTAMP (\?))?( IF NOT EXISTS)?",
     lambda t, m: Statement(t, "insert", m[1], _split(m[2]), _split(m[3]), timestamp=m[4],
                            if_not_exists=bool(m[5]))),
    (r"UPDATE (\w+) USING TIMESTAMP (\?) SET (.+) WHERE (.+)",
     lambda t, m: Statement(t, "update", m[1], [a.split(" = ")[0] for a in _split(m[3])],
                            [a.split(" = ")[1] for a in _split(m[3])], _where(m[4]),
                            timestamp=m[2])),
    (r"DELETE FROM (\w+) USING TIMESTAMP (\?) WHERE (.+)",
     lambda t, m: Statement(t, "delete", m[1], where=_where(m[3]), timestamp=m[2])),
    (r"SELECT (DISTINCT )?(.+?) FROM ([\w.]+)(?: WHERE (.+?))?(?: LIMIT (\?))?",
     lambda t, m: Statement(t, "select", m[3], _split(m[2]), where=_where(m[4]), limit=m[5],
                            distinct=bool(m[1]))),
]


# -- the cluster and its sessions ------------------------------------------------------------------

class ModelCluster:
    """Keyspaces of tables; sessions share it, as clients share a cluster."""

    def __init__(self, page_size: int = 5000) -> None:
        self.keyspaces: dict[str, dict[str, Table]] = {}
        self.page_size = page_size
        self.executed: list[tuple[str, tuple]] = []
        # Callbacks run on another thread, as on the driver's I/O thread: run inline,
        # execute_concurrent would recurse once per statement.
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cql-model-io")

    def session(self) -> ModelSession:
        return ModelSession(self)

    def shutdown(self) -> None:
        """What a store's close() calls: the model outlives stores, so nothing."""

    def close(self) -> None:
        self.io.shutdown(wait=True)


class ModelSession:
    """The part of ``cassandra.cluster.Session`` the store and the schema step use."""

    def __init__(self, cluster: ModelCluster) -> None:
        self.cluster = cluster
        self.keyspace: str | None = None

    def set_keyspace(self, keyspace: str) -> None:
        if keyspace not in self.cluster.keyspaces:
            raise ModelError(f"keyspace {keyspace} does not exist")
        self.keyspace = keyspace

    def prepare(self, text: str) -> Statement:
        statement = parse(text)
        if not statement.table.startswith("system_schema."):
            _check(self._table(statement.table), statement)
        return statement

    def execute(self, query: Statement | str, params: Sequence[Any] = (), **_: Any) -> ResultSet:
        future = self.execute_async(query, params)
        return ResultSet(future, future.page)

    def execute_async(self, query: Statement | str, params: Sequence[Any] = (),
                      **_: Any) -> ModelFuture:
        if isinstance(query, str):
            rows = self._ddl(query) if query.startswith("CREATE") else None
            if rows is None:
                return self.execute_async(self.prepare(query), params)
            return ModelFuture(rows, self.cluster)
        self.cluster.executed.append((query.text, tuple(params)))
        return ModelFuture(self._run(query, tuple(params)), self.cluster)

    def _ddl(self, text: str) -> list:
        if text.startswith("CREATE KEYSPACE"):
            name = text.split()[5]
            self.cluster.keyspaces.setdefault(name, {})
            return []
        if text.startswith("CREATE TABLE"):
            table = parse_table(text)
            self._tables().setdefault(table.name, table)
            return []
        return None  # type: ignore[return-value]

    def _tables(self, keyspace: str | None = None) -> dict[str, Table]:
        name = keyspace or self.keyspace
        if name is None or name not in self.cluster.keyspaces:
            raise ModelError(f"no keyspace {name!r}")
        return self.cluster.keyspaces[name]

    def _table(self, name: str) -> Table:
        keyspace, _, table = name.rpartition(".")
        tables = self._tables(keyspace or None)
        if table not in tables:
            raise ModelError(f"unconfigured table {name}")
        return tables[table]

    def _run(self, s: Statement, params: tuple) -> list[tuple]:
        if len(params) != s.markers:
            raise ModelError(f"{s.markers} bind markers, {len(params)} values: {s.text}")
        if s.table.startswith("system_schema."):
            return self._system(s, params)
        table = self._table(s.table)
        bound = _Binder(table, params)
        return _EXECUTE[s.kind](table, s, bound)

    def _system(self, s: Statement, params: tuple) -> list[tuple]:
        keyspace = params[0]
        if s.table.endswith("keyspaces"):
            return [(keyspace,)] if keyspace in self.cluster.keyspaces else []
        tables = self.cluster.keyspaces.get(keyspace, {})
        return [("schema_version",)] if "schema_version" in tables else []


class ModelFuture:
    """What ``execute_concurrent``, ``ResultSet`` and the asyncio bridge use of a
    ``ResponseFuture``: already complete, pages of ``page_size`` rows."""

    _col_names = None
    _col_types = None
    _continuous_paging_session = None
    is_schema_agreed = True

    def __init__(self, rows: list[tuple], cluster: ModelCluster) -> None:
        size = cluster.page_size
        self._pages = [rows[i:i + size] for i in range(0, len(rows), size)] or [[]]
        self._index = 0
        self._io = cluster.io
        self._callbacks: list[tuple[Callable, tuple]] = []

    @property
    def page(self) -> list[tuple]:
        return self._pages[self._index]

    @property
    def has_more_pages(self) -> bool:
        return self._index + 1 < len(self._pages)

    def start_fetching_next_page(self) -> None:
        self._index += 1
        for fn, args in list(self._callbacks):
            self._io.submit(fn, self.page, *args)

    def result(self) -> ResultSet:
        return ResultSet(self, self.page)

    def add_callbacks(self, callback: Callable, errback: Callable, callback_args: tuple = (),
                      callback_kwargs: dict | None = None, errback_args: tuple = (),
                      errback_kwargs: dict | None = None) -> None:
        self._callbacks.append((callback, callback_args))
        self._io.submit(callback, self.page, *callback_args)

    def clear_callbacks(self) -> None:
        self._callbacks = []


# -- checking and executing ----------------------------------------------------------------------

def _check(table: Table, s: Statement) -> None:
    named = set(s.columns) - {"count(*)"} | {c for cols, _, _ in s.where for c in cols}
    unknown = named - set(table.columns)
    if unknown:
        raise ModelError(f"undefined column(s) {sorted(unknown)} in {table.name}: {s.text}")
    eq = [cols[0] for cols, op, _ in s.where if op == "="]
    if s.kind == "insert" and not set(table.key) <= set(s.columns):
        raise ModelError(f"INSERT misses primary key parts of {table.name}: {s.text}")
    if s.kind == "update" and (sorted(eq) != sorted(table.key) or set(s.columns) & set(table.key)):
        raise ModelError(f"UPDATE must name the full primary key and set only other columns: "
                         f"{s.text}")
    if s.kind in ("delete", "select") and s.where:
        _check_restrictions(table, s, eq)
    if s.distinct and tuple(s.columns) != table.partition:
        raise ModelError(f"SELECT DISTINCT takes only the partition key: {s.text}")


def _check_restrictions(table: Table, s: Statement, eq: list[str]) -> None:
    if not set(table.partition) <= set(eq):
        raise ModelError(f"partition key of {table.name} not fully restricted: {s.text}")
    clustered = [c for c in eq if c in table.clustering]
    slices = [cols for cols, op, _ in s.where if op != "="]
    prefix = tuple(clustered) + (slices[0] if slices else ())
    if prefix != table.clustering[:len(prefix)] or len(slices) > 1:
        raise ModelError(f"clustering restrictions are not a prefix of "
                         f"{table.clustering}: {s.text}")


class _Binder:
    """Hands out bound values in marker order, checking each against its column type."""

    def __init__(self, table: Table, params: tuple) -> None:
        self.table = table
        self.params = iter(params)

    def value(self, literal: str, column: str | None) -> Any:
        if literal != "?":
            return _LITERALS[literal] if literal in _LITERALS else int(literal)
        value = next(self.params)
        if column is not None:
            _check_type(self.table.columns[column], value, column)
        return value

    def timestamp(self, s: Statement) -> int:
        return int(self.value(s.timestamp, None)) if s.timestamp else next(_CLOCK)


_LITERALS = {"true": True, "false": False, "''": ""}


def _check_type(cql_type: str, value: Any, column: str) -> None:
    ok = {"bigint": lambda v: type(v) is int and INT64[0] <= v <= INT64[1],
          "int": lambda v: type(v) is int and INT32[0] <= v <= INT32[1],
          "text": lambda v: isinstance(v, str), "blob": lambda v: isinstance(v, bytes),
          "boolean": lambda v: isinstance(v, bool),
          "double": lambda v: isinstance(v, float | int)}[cql_type]
    if value is not None and not ok(value):
        raise ModelError(f"{column} is {cql_type}; cannot bind {value!r}")


def _key_of(table: Table, values: dict[str, Any]) -> tuple[tuple, tuple]:
    return (tuple(values[c] for c in table.partition), tuple(values[c] for c in table.clustering))


def _write(table: Table, pk: tuple, ck: tuple, cells: dict[str, Any], ts: int) -> None:
    row = table.rows.setdefault(pk, {}).setdefault(ck, {})
    for column, value in cells.items():
        old = row.get(column)
        if old is None or (ts, _rank(value)) > (old[1], _rank(old[0])):
            row[column] = (value, ts)


def _rank(value: Any) -> tuple:
    return (value is not None, repr(value))


def _insert(table: Table, s: Statement, bound: _Binder) -> list[tuple]:
    values = {c: bound.value(v, c) for c, v in zip(s.columns, s.values, strict=True)}
    ts = bound.timestamp(s)
    pk, ck = _key_of(table, values)
    if s.if_not_exists and table.live(pk, ck) is not None:
        return [(False,)]
    cells = {c: v for c, v in values.items() if c not in table.key}
    _write(table, pk, ck, {"\0marker": True, **cells}, ts)
    return [(True,)] if s.if_not_exists else []


def _update(table: Table, s: Statement, bound: _Binder) -> list[tuple]:
    ts = bound.timestamp(s)
    cells = {c: bound.value(v, c) for c, v in zip(s.columns, s.values, strict=True)}
    values = {cols[0]: bound.value(vals[0], cols[0]) for cols, _, vals in s.where}
    pk, ck = _key_of(table, values)
    _write(table, pk, ck, cells, ts)
    return []


def _delete(table: Table, s: Statement, bound: _Binder) -> list[tuple]:
    ts = bound.timestamp(s)
    pk, match = _restriction(table, s, bound)
    fixed = [c for cols, op, _ in s.where if op == "=" for c in cols if c in table.clustering]
    if len(fixed) == len(table.clustering):
        ck = tuple(match.fixed[c] for c in table.clustering)
        table.row_deletions[(pk, ck)] = max(ts, table.row_deletions.get((pk, ck), ts))
    else:
        table.range_deletions.setdefault(pk, []).append((match, ts))
    return []


def _select(table: Table, s: Statement, bound: _Binder) -> list[tuple]:
    if s.where:
        pk, match = _restriction(table, s, bound)
        rows = [r for ck in table.ordered(pk) if match(ck) and (r := table.live(pk, ck))]
    else:
        rows = [r for pk in sorted(table.rows) for ck in table.ordered(pk)
                if (r := table.live(pk, ck))]
    if s.limit:
        rows = rows[:bound.value(s.limit, None)]
    if s.columns == ["count(*)"]:
        return [(len(rows),)]
    if s.distinct:
        return sorted({tuple(r[c] for c in s.columns) for r in rows})
    return [tuple(r.get(c) for c in s.columns) for r in rows]


class _Match:
    """Which clustering keys a WHERE clause selects within its partition."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.fixed: dict[str, Any] = {}
        self.slices: list[tuple[tuple[str, ...], str, tuple]] = []

    def __call__(self, ck: tuple) -> bool:
        values = dict(zip(self.table.clustering, ck, strict=True))
        if any(values[c] != v for c, v in self.fixed.items() if c in values):
            return False
        for cols, op, bound in self.slices:
            have = tuple(values[c] for c in cols)
            if not {"<": have < bound, "<=": have <= bound, ">": have > bound,
                    ">=": have >= bound}[op]:
                return False
        return True


def _restriction(table: Table, s: Statement, bound: _Binder) -> tuple[tuple, _Match]:
    match = _Match(table)
    for cols, op, vals in s.where:
        values = tuple(bound.value(v, c) for c, v in zip(cols, vals, strict=True))
        if op == "=":
            match.fixed[cols[0]] = values[0]
        else:
            match.slices.append((cols, op, values))
    return tuple(match.fixed[c] for c in table.partition), match


_EXECUTE: dict[str, Callable[[Table, Statement, _Binder], list[tuple]]] = {
    "insert": _insert, "update": _update, "delete": _delete, "select": _select}


def new_keyspace_tables() -> list[Table]:
    """The tables ``fanout schema apply`` creates (for tests that inspect the schema)."""
    return [parse_table(s) for step in load_steps() for s in step.statements] + [
        parse_table(VERSION_TABLE)]
