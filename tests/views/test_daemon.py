"""The job's Python daemon: workers forked with their modules loaded, never beside a thread."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from views.daemon import NO_THREADS, PRELOAD

ROOT = Path(__file__).resolve().parents[2]


def _daemon_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NO_THREADS}
    return env | {"PYTHONPATH": str(ROOT)} | extra


def _run(code: str, **extra: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], env=_daemon_env(**extra), cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip()


def test_a_python_worker_of_the_session_is_forked_from_the_daemon_with_the_job_loaded(spark):
    def origin(batches):
        import os
        import sys

        loaded = ",".join(sorted(name for name in sys.modules if name.startswith("views.")))
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
            parent = cmdline.read().replace(b"\0", b" ").decode()
        for _ in batches:
            yield pa.RecordBatch.from_pydict({"parent": [parent], "loaded": [loaded]})

    rows = spark.range(0, 2, 1, 2).mapInArrow(origin, "parent string, loaded string").collect()
    assert all("-m views.daemon" in row.parent for row in rows), rows
    # Nothing of this test's function needs the join; the daemon had loaded it.
    assert all("views.processor" in row.loaded.split(",") for row in rows), rows


def test_the_preload_leaves_the_daemon_one_thread():
    shown = _run("from views.daemon import preload, threads\n"
                 "import sys\n"
                 "print(preload(), threads(), all(m in sys.modules for m in "
                 f"{PRELOAD!r}))")
    assert shown == "None 1 True"


def test_imports_that_start_a_thread_are_refused():
    shown = _run("from views.daemon import preload\nprint(preload())",
                 JE_ARROW_MALLOC_CONF="background_thread:true")
    assert shown == "2 threads after the imports, not one"


def test_a_refused_preload_runs_pyspark_s_own_daemon():
    # stdin at its end: the daemon writes its port, finds the JVM gone and stops.
    out = subprocess.run([sys.executable, "-m", "views.daemon", "pyspark.worker"],
                         env=_daemon_env(JE_ARROW_MALLOC_CONF="background_thread:true"),
                         cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                         timeout=120, check=False)
    assert "running PySpark's own daemon" in out.stderr.decode()
    assert len(out.stdout) == 4  # the port, as PySpark's daemon writes it
