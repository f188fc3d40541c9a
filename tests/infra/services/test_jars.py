"""The jar fetch runs before the packages are installed (infra.services.jars).

``make`` fetches the jars with ``python -m infra.services.jars`` while uv installs
the packages, so that module and what it imports must need the
standard library alone; run here with site-packages switched off (``-S``).
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT


def _bare(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a Python without site-packages, the repository importable."""
    prelude = f"import sys; sys.path.insert(0, {str(ROOT)!r}); sys.argv[1:] = {list(args)!r}; "
    return subprocess.run([sys.executable, "-S", "-c", prelude + code], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_jar_fetch_imports_the_standard_library_alone():
    done = _bare("import infra.services.jars as j; print(sorted(j.SETS))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['cassandra', 'kafka', 'spark-kafka']"


def test_a_wrong_set_name_says_which_there_are_without_a_traceback():
    done = _bare("import runpy; runpy.run_module('infra.services.jars', run_name='__main__')",
                 "kafka", "nope")
    assert done.returncode == 1
    assert done.stderr.strip() == ("fanout jars: no jar set named nope: choose from kafka, "
                                   "cassandra, spark-kafka")
