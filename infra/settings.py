"""Names of the ``fanout`` command's own environment variables, and a run directory's views.

The other packages' names and shared defaults live with their settings
(:mod:`ingest.settings`, :mod:`views.settings`, :mod:`serving.settings`); this module
declares the ones only ``infra`` reads: where the run directory is, where the API of a
stack answers, which Spark master the job runs on, and the live verifier's settings
(``fanout load``'s own are in :mod:`infra.load.settings`, the job submitter's in
:mod:`infra.services.submit`).
Nothing here reads the environment: the ``fanout`` entry point does, and hands the
result down. It sits below every room of ``infra``, so a stack can ask whether it runs
the verifier, or whether its views are stale, without importing the checks or the
view operations.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from pydantic import Field

from ingest.settings import FanoutSettings, env_alias
from views.settings import (
    CHECKPOINTS,
    DEFAULT_CHECKPOINT_DIR,
    DEFAULT_STORE_URL,
    ViewSettings,
    sqlite_url,
)

__all__ = ("API_URL_ENV", "HOSTS_ENV", "HOSTS_NET_ENV", "RUN_DIR_ENV", "SPARK_DRIVER_HOST_ENV",
           "SPARK_DRIVER_MEMORY_ENV", "SPARK_JAVA_OPTIONS_ENV", "SPARK_MASTER_ENV",
           "VERIFIER_ENTRIES_ENV", "VERIFIER_ENV", "VERIFIER_HOST_ENV", "VERIFIER_PORT_ENV",
           "VERIFIER_RATE_ENV", "DEFAULT_VERIFIER_PORT", "VerifierSettings", "run_dir_views",
           "sqlite_path", "stale_views", "verifier_enabled")

RUN_DIR_ENV: Final = "FANOUT_RUN_DIR"
API_URL_ENV: Final = "FANOUT_API_URL"
SPARK_MASTER_ENV: Final = "FANOUT_SPARK_MASTER"
#: ``on``: a new multi-node stack runs each node on a host of its own (``fanout up
#: --hosts``, :mod:`infra.services.hosts`); the subnet of those hosts (default: a free
#: 10.213.K.0/24).
HOSTS_ENV: Final = "FANOUT_HOSTS"
HOSTS_NET_ENV: Final = "FANOUT_HOSTS_NET"
#: The address the Spark driver binds and advertises to executors (default loopback; on
#: hosts the bridge's address, which the executors in their namespaces can reach).
SPARK_DRIVER_HOST_ENV: Final = "FANOUT_SPARK_DRIVER_HOST"
#: The Spark driver JVM's heap (``spark.driver.memory``, e.g. ``1g``); local mode's
#: executor lives in it.
SPARK_DRIVER_MEMORY_ENV: Final = "FANOUT_SPARK_DRIVER_MEMORY"
#: More options for Spark's JVMs, driver and executors (e.g. a Java Flight Recording),
#: after fanout's own.
SPARK_JAVA_OPTIONS_ENV: Final = "FANOUT_SPARK_JAVA_OPTIONS"
#: The live verifier (:mod:`infra.checks.verifier`): whether a stack runs it, how much it
#: checks, and where it is scraped.
VERIFIER_ENV: Final = "FANOUT_VERIFIER"
VERIFIER_RATE_ENV: Final = "FANOUT_VERIFIER_RATE"
VERIFIER_ENTRIES_ENV: Final = "FANOUT_VERIFIER_ENTRIES"
VERIFIER_PORT_ENV: Final = "FANOUT_VERIFIER_PORT"
VERIFIER_HOST_ENV: Final = "FANOUT_VERIFIER_HOST"
DEFAULT_VERIFIER_PORT: Final = 9418


class VerifierSettings(FanoutSettings):
    """Whether the live verifier runs, how much it checks, and where it is scraped."""

    enabled: bool = Field(
        default=True, validation_alias=env_alias(VERIFIER_ENV, "enabled"),
        description="Whether `fanout up` runs the live verifier (off: it does not).")
    rate: float = Field(
        default=2.0, gt=0, le=1000, validation_alias=env_alias(VERIFIER_RATE_ENV, "rate"),
        description="Users compared a second.")
    entries: int = Field(
        default=20, ge=1, validation_alias=env_alias(VERIFIER_ENTRIES_ENV, "entries"),
        description="Entries of each sampled user's first page compared (at most the "
                    "API's FANOUT_API_MAX_PAGE).")
    port: int = Field(
        default=DEFAULT_VERIFIER_PORT, ge=0, le=65535,
        validation_alias=env_alias(VERIFIER_PORT_ENV, "port"),
        description="TCP port of the verifier's Prometheus endpoint (0: any free port).")
    host: str = Field(
        default="127.0.0.1", validation_alias=env_alias(VERIFIER_HOST_ENV, "host"),
        description="Interface the endpoint listens on (0.0.0.0 in a container).")


def verifier_enabled(settings: Mapping[str, str]) -> bool:
    """Whether a stack with these ``FANOUT_*`` settings runs the verifier."""
    return VerifierSettings.from_env(settings).enabled


def run_dir_views(run_dir: Path, environ: Mapping[str, str]) -> ViewSettings:
    """The view settings of the stack in ``run_dir``, from ``environ``.

    A store or checkpoint that ``environ`` leaves at its default is the one in
    ``run_dir`` (``fanout.sqlite``, ``checkpoints/``), not the one in ``./run``.
    """
    view = ViewSettings.from_env(environ)
    moved: dict[str, object] = {}
    if view.store_url == DEFAULT_STORE_URL:
        moved["store_url"] = sqlite_url(run_dir)
    if view.checkpoint_dir == DEFAULT_CHECKPOINT_DIR:
        moved["checkpoint_dir"] = run_dir / CHECKPOINTS
    return view.model_copy(update=moved)


def stale_views(checkpoint: Path, store_url: str) -> list[Path]:
    """Which of a checkpoint directory and a store hold views of some earlier log."""
    found = [checkpoint] if any(checkpoint.glob("*/offsets/*")) else []
    store = sqlite_path(store_url)
    if store is not None and store.exists():
        found.append(store)
    return found


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` store URL; None for any other store."""
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
