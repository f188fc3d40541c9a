"""``python -m serving``: run the read API; flags fall back to the environment (STYLE §6)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from serving.app import serve
from serving.settings import ServingSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m serving",
                                     description="Serve fanout's home timelines over HTTP.")
    parser.add_argument("--host", help="interface to bind (default: $FANOUT_API_HOST "
                                       "or 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (default: $FANOUT_API_PORT or 8080)")
    parser.add_argument("--store", dest="store_url",
                        help="store URL, sqlite:///path or cassandra://hosts/keyspace "
                             "(default: $FANOUT_STORE or sqlite:///run/fanout.sqlite)")
    parser.add_argument("--max-page", dest="max_page", type=int,
                        help="largest page a request may ask for (default: "
                             "$FANOUT_API_MAX_PAGE or 200)")
    parser.add_argument("--access-log", dest="access_log", action=argparse.BooleanOptionalAction,
                        help="log every request (default: $FANOUT_API_ACCESS_LOG or on)")
    parser.add_argument("--auth", dest="auth", action=argparse.BooleanOptionalAction,
                        help="require bearer tokens for writes and home timelines "
                             "(default: $FANOUT_AUTH or on; the secret is "
                             "$FANOUT_AUTH_SECRET)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Parse flags, build the one settings object, serve until interrupted."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    serve(ServingSettings(**{k: v for k, v in vars(args).items() if v is not None}))


if __name__ == "__main__":
    main()
