"""``python -m serving``: run the read API; flags fall back to the environment (docs/style.md §6)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from ingest.settings import KafkaSettings, SettingsError
from serving.app import serve
from serving.settings import AUTH_SECRET_ENV, ServingSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m serving", description="Serve fanout's home timelines over HTTP; "
        f"with auth on, the secret is ${AUTH_SECRET_ENV}.")
    ServingSettings.add_flags(parser, "host", "port", "max_page", "workers", "access_log",
                              "auth", store_url="--store")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Parse flags, build the settings objects, serve until interrupted."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    try:
        settings = ServingSettings.from_env(os.environ, **vars(args))
        kafka = KafkaSettings.from_env(os.environ)
    except SettingsError as exc:
        msg = f"python -m serving: {exc}"
        raise SystemExit(msg) from None
    serve(settings, kafka)


if __name__ == "__main__":
    main()
