"""The job's Python daemon: PySpark's, with what its workers import loaded before it forks.

Spark runs one daemon per executor (``spark.python.daemon.module``, which
``infra.services.spark.session_conf`` points here) and forks a Python worker from it whenever a
task needs one and none is idle. PySpark's own daemon has nothing a worker needs
loaded: each worker imports PySpark's worker, pandas, pyarrow and the job's modules
after the fork, ~0.5 s of CPU each, and a job's first micro-batch starts several such
workers on its critical path. This daemon imports them once, before it serves, so a
forked worker starts with them in memory (shared with the daemon until written).

PySpark imports after the fork because a process that forks should have no other
thread (a lock another thread held stays locked in the child), and importing numpy
or pyarrow starts one each: OpenBLAS's pool and the background thread of Arrow's
jemalloc. So the daemon asks them not to (``OPENBLAS_NUM_THREADS=1`` and
``JE_ARROW_MALLOC_CONF=background_thread:false``, unless the environment sets them;
the workers inherit both and use neither), and serves only if it is still one thread
after its imports. If it is not, or an import fails, it replaces itself with
PySpark's own daemon, which imports nothing: the workers then start as they would
without this module.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from typing import Final

import psutil

#: What a worker of the job imports: PySpark's worker, the Arrow and pandas it
#: converts with, the decode (``views.connector``) and the join (``views.processor``).
PRELOAD: Final = ("pyspark.worker", "pyarrow", "pandas", "views.connector",
                  "views.processor")
#: Settings that keep those imports from starting threads.
NO_THREADS: Final = {"OPENBLAS_NUM_THREADS": "1",
                     "JE_ARROW_MALLOC_CONF": "background_thread:false"}
#: PySpark's own daemon, which this one falls back to.
PYSPARK_DAEMON: Final = "pyspark.daemon"


def threads() -> int | None:
    """The threads of the calling process; None where unknown."""
    try:
        return psutil.Process().num_threads()
    except psutil.Error:
        return None


def preload() -> str | None:
    """Import :data:`PRELOAD` without starting a thread; why not, if it could not."""
    for name, value in NO_THREADS.items():
        os.environ.setdefault(name, value)
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure means: PySpark's daemon
        return f"importing {name} failed ({type(exc).__name__}: {exc})"
    running = threads()
    if running != 1:
        return f"{running or 'an unknown number of'} threads after the imports, not one"
    return None


def main() -> None:
    """Preload, then serve as PySpark's daemon; or become PySpark's daemon."""
    refused = preload()
    if refused is not None:
        print(f"fanout's Python daemon: {refused}; running PySpark's own daemon "
              "(workers import on their own)", file=sys.stderr, flush=True)
        os.execv(sys.executable,  # noqa: S606 - the interpreter Spark started us with
                 [sys.executable, "-m", PYSPARK_DAEMON, *sys.argv[1:]])
    gc.freeze()  # the imports' objects: out of every collection, the workers' too
    from pyspark.daemon import manager  # noqa: PLC0415

    manager()


if __name__ == "__main__":
    main()
