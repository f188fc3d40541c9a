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

from infra.errors import InfraError
from views.settings import (
    CHECKPOINTS,
    DEFAULT_CHECKPOINT_DIR,
    DEFAULT_STORE_URL,
    ViewSettings,
    sqlite_url,
)

__all__ = ("API_URL_ENV", "JOB_NICE_ENV", "RUN_DIR_ENV", "SPARK_MASTER_ENV", "job_nice",
           "run_dir_views")

RUN_DIR_ENV: Final = "FANOUT_RUN_DIR"
API_URL_ENV: Final = "FANOUT_API_URL"
SPARK_MASTER_ENV: Final = "FANOUT_SPARK_MASTER"
#: The view job's niceness under ``fanout up`` (its Spark JVM and Python workers
#: inherit it): on a box it shares with the API, reads get the CPU first and the job
#: takes what they leave. 0 runs it at the API's priority.
JOB_NICE_ENV: Final = "FANOUT_JOB_NICE"
DEFAULT_JOB_NICE: Final = 10


def job_nice(environ: Mapping[str, str]) -> int:
    """The job's niceness from ``environ`` (0–19; see :data:`JOB_NICE_ENV`)."""
    raw = environ.get(JOB_NICE_ENV, str(DEFAULT_JOB_NICE))
    try:
        value = int(raw)
    except ValueError:
        msg = f"{JOB_NICE_ENV} must be a whole number 0-19, got {raw!r}"
        raise InfraError(msg) from None
    if not 0 <= value <= 19:
        msg = f"{JOB_NICE_ENV} must be 0-19, got {value}"
        raise InfraError(msg)
    return value


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
