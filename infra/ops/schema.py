"""The ``fanout schema apply|status`` command: the store's versioned schema, from a shell.

The steps and how they are applied are the Cassandra store's
(:mod:`views.stores.cassandra.schema`); this module only parses the flags, picks the
store URL (``--store``, else the view settings') and reports. The SQLite store
creates its schema when opened, so ``fanout schema apply`` on an ``sqlite://`` URL
just opens it. The Cassandra package (and its driver) is imported only for a
``cassandra://`` URL: every ``fanout`` command imports this module.
"""

from __future__ import annotations

import argparse
from typing import Any

from views.errors import StoreError
from views.settings import ViewSettings
from views.stores import store_from_url


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``fanout schema apply|status`` to the ``fanout`` command's subparsers."""
    p = sub.add_parser("schema", help="create or check the store's tables (versioned CQL)")
    actions = p.add_subparsers(dest="schema_action", metavar="ACTION")
    for name, func, text in (("apply", _cmd_apply, "apply the missing steps, in order"),
                             ("status", _cmd_status, "list applied and pending steps")):
        a = actions.add_parser(name, help=text)
        a.add_argument("--store", default=None, metavar="URL",
                       help="store URL (env FANOUT_STORE; default sqlite:///run/fanout.sqlite)")
        a.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                       help="retry connecting for up to this long (a cluster still starting)")
        a.set_defaults(func=func)
    p.set_defaults(func=lambda _args: p.print_help() or 2)


def _store_url(args: argparse.Namespace) -> str:
    return str(args.store or ViewSettings.from_env(args.environ).store_url)


def _cmd_apply(args: argparse.Namespace) -> int:
    url = _store_url(args)
    if not url.startswith("cassandra:"):
        store_from_url(url).open().close()
        print(f"{url}: the SQLite store creates its schema when opened; done")
        return 0
    return _with_cluster(url, args.wait, _apply_and_report)


def _cmd_status(args: argparse.Namespace) -> int:
    url = _store_url(args)
    if not url.startswith("cassandra:"):
        print(f"{url}: the SQLite store creates its schema when opened")
        return 0
    return _with_cluster(url, args.wait, _report_status)


def _apply_and_report(session: Any, config: Any) -> int:
    from views.stores.cassandra.schema import applied_versions, apply_schema

    done = apply_schema(session, config.keyspace, config.replication.cql_map())
    applied = applied_versions(session, config.keyspace) or {}
    print(f"keyspace {config.keyspace}: applied {[s.label for s in done] or 'nothing'}; "
          f"at version {max(applied, default=0)}")
    return 0


def _report_status(session: Any, config: Any) -> int:
    from views.stores.cassandra.schema import applied_versions, load_steps, pending

    applied = applied_versions(session, config.keyspace)
    if applied is None:
        print(f"keyspace {config.keyspace} does not exist: run `fanout schema apply`")
        return 1
    todo = pending(load_steps(), applied)
    print(f"keyspace {config.keyspace}: applied {sorted(applied)}, "
          f"pending {[s.label for s in todo] or 'none'}")
    return 1 if todo else 0


def _with_cluster(url: str, wait: float, action: Any) -> int:
    from cassandra import DriverException

    from views.stores.cassandra import parse_url
    from views.stores.cassandra.schema import connect

    try:
        config = parse_url(url)
        cluster, session = connect(config, wait)
    except StoreError as exc:
        print(f"fanout schema: {exc}")
        return 2
    try:
        return int(action(session, config))
    except (StoreError, DriverException) as exc:
        print(f"fanout schema: {exc}")
        return 1
    finally:
        cluster.shutdown()
