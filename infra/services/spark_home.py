"""The ``SPARK_HOME`` fanout starts Spark from: pip's PySpark without its source zips.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and Py4J's zip) first on the path of
every Python process it starts: the executors' daemon and the workers it forks, and the
driver's own helpers (the look-up of Python data sources, transformWithState's set-up
call). pip's PySpark is its own ``SPARK_HOME``, and its zip holds sources only; Python
keeps no bytecode for a zip, so each of those processes compiled PySpark's modules anew,
~0.8 s of CPU against ~0.2 s importing the installed package, whose bytecode pip
compiled. Four of them start before a job's first micro-batch ends, on two cores.

:func:`lean_home` is a folder of links to everything in pip's PySpark but ``python/``:
Spark's scripts and jars are the same files, and its Python processes, finding no zip
where Spark points, import the installed PySpark (the same sources, the same version).
It is made once per PySpark install, under ``~/.cache/fanout/spark-home``. A
``SPARK_HOME`` the user set is left alone, and so is the package when no folder can be
made there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Final

from infra.errors import InfraError

log = logging.getLogger(__name__)

#: Where the lean homes are made, one per PySpark install (``FANOUT_SPARK_HOME_CACHE``).
CACHE_ENV: Final = "FANOUT_SPARK_HOME_CACHE"
#: What of pip's PySpark the lean home leaves out: the source zips Spark's workers import.
LEFT_OUT: Final = frozenset({"python"})


class SparkHomeError(InfraError):
    """PySpark is not installed in this Python."""


def package_home() -> Path:
    """The pyspark package directory: pip's ``SPARK_HOME`` (``bin/``, ``jars/``, the zips)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        msg = "pyspark is not installed in this Python: run `make install`"
        raise SparkHomeError(msg)
    return Path(spec.origin).parent


def cache_root() -> Path:
    """The folder of lean homes (``FANOUT_SPARK_HOME_CACHE`` or ``~/.cache/fanout/spark-home``)."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "fanout" / "spark-home"


def lean_home(package: Path | None = None, root: Path | None = None) -> Path:
    """The lean ``SPARK_HOME`` for ``package`` (pip's PySpark), made if missing.

    Falls back to ``package`` itself, with a warning, when the folder cannot be made
    (a read-only home): Spark then runs as pip installed it, only slower to start.
    """
    package = package or package_home()
    root = root or cache_root()
    home = root / hashlib.sha256(str(package.resolve()).encode()).hexdigest()[:16]
    if _complete(home, package):
        return home
    try:
        root.mkdir(parents=True, exist_ok=True)
        draft = Path(tempfile.mkdtemp(prefix=".draft-", dir=root))
        for entry in sorted(package.iterdir()):
            if entry.name not in LEFT_OUT:
                (draft / entry.name).symlink_to(entry)
        if home.exists() and not _complete(home, package):
            shutil.rmtree(home)  # links to entries the installed PySpark no longer has
        try:
            draft.rename(home)  # atomic: a reader sees no home or a whole one
        except OSError:  # another process made it first
            shutil.rmtree(draft, ignore_errors=True)
        if not _complete(home, package):
            msg = f"{home} does not link {package}"
            raise OSError(msg)
    except OSError as exc:
        log.warning("Spark starts from %s, whose source zips its Python processes compile "
                    "at every start: could not make a SPARK_HOME without them under %s (%s)",
                    package, root, exc)
        return package
    return home


def _complete(home: Path, package: Path) -> bool:
    """Whether ``home`` links every entry of ``package`` but :data:`LEFT_OUT`, and only them."""
    try:
        held = {entry.name: entry for entry in home.iterdir()}
    except OSError:
        return False
    wanted = {entry.name for entry in package.iterdir() if entry.name not in LEFT_OUT}
    return set(held) == wanted and all(
        held[name].is_symlink() and held[name].resolve() == (package / name).resolve()
        for name in wanted)
