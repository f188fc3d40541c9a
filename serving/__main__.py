"""``python -m serving``: run the read API; flags fall back to the environment (docs/style.md §6)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from ingest.settings import KafkaSettings
from serving.app import serve
from serving.settings import AUTH_SECRET_ENV, ServingSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m serving",
                                     description="Serve fanout's home timelines over HTTP.")
    env = ServingSettings.env_help
    parser.add_argument("--host", help=f"interface to bind ({env('host')})")
    parser.add_argument("--port", type=int, help=f"TCP port ({env('port')})")
    parser.add_argument("--store", dest="store_url",
                        help=f"store URL, sqlite:///path or cassandra://hosts/keyspace "
                             f"({env('store_url')})")
    parser.add_argument("--max-page", dest="max_page", type=int,
                        help=f"largest page a request may ask for ({env('max_page')})")
    parser.add_argument("--workers", type=int,
                        help=f"API processes sharing the port, 0: one per core ({env('workers')})")
    parser.add_argument("--access-log", dest="access_log", action=argparse.BooleanOptionalAction,
                        help=f"log every request ({env('access_log')})")
    parser.add_argument("--auth", dest="auth", action=argparse.BooleanOptionalAction,
                        help=f"require bearer tokens for writes and home timelines "
                             f"({env('auth')}; the secret is ${AUTH_SECRET_ENV})")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Parse flags, build the settings objects, serve until interrupted."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    serve(ServingSettings(**{k: v for k, v in vars(args).items() if v is not None}),
          KafkaSettings())


if __name__ == "__main__":
    main()
