"""Names of the ``fanout`` command's own environment variables, and a run directory's views.

The other packages' names and shared defaults live with their settings
(:mod:`ingest.settings`, :mod:`views.settings`, :mod:`serving.settings`); this module
declares the ones only ``infra`` reads: where the run directory is, where the API of a
stack answers, and which Spark master the job runs on. Nothing here reads the
environment: the ``fanout`` entry point does, and hands the result down.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from views.settings import (
    CHECKPOINTS,
    DEFAULT_CHECKPOINT_DIR,
    DEFAULT_STORE_URL,
    ViewSettings,
    sqlite_url,
)

__all__ = ("API_URL_ENV", "HOSTS_ENV", "HOSTS_NET_ENV", "RUN_DIR_ENV", "SPARK_DRIVER_HOST_ENV",
           "SPARK_DRIVER_MEMORY_ENV", "SPARK_JAVA_OPTIONS_ENV", "SPARK_MASTER_ENV",
           "run_dir_views")

RUN_DIR_ENV: Final = "FANOUT_RUN_DIR"
API_URL_ENV: Final = "FANOUT_API_URL"
SPARK_MASTER_ENV: Final = "FANOUT_SPARK_MASTER"
#: ``on``: a new multi-node stack runs each node on a host of its own (``fanout up
#: --hosts``, :mod:`infra.hosts`); the subnet of those hosts (default: a free
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
