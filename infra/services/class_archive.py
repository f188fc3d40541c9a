"""Which class-data-sharing archive of its classes the Spark driver maps (dynamic AppCDS).

A cold Spark JVM spends the first seconds of a job loading, parsing and verifying the
classes of Spark, its Kafka source and the state store, one at a time on one thread,
while the other core waits: in a cold 397k-event backlog, building the query took
~1.0 s, the first offsets ~0.5 s and planning ~1.0 s before any record was read
(benchmarks/RESULTS.md). An archive holds those classes already parsed and verified,
mapped into the JVM at start; with it the same steps took ~0.4, ~0.4 and ~0.5 s.

This module says which archive a driver maps: :func:`driver_option` gives the Spark
driver ``-XX:SharedArchiveFile`` when an archive made for this exact JVM, these jars
and these JVM options is in the cache (the file name is a digest of them,
:func:`archive_key`): anything else changed, the key differs and Spark starts as it
would without one. ``FANOUT_CLASS_ARCHIVE=off`` starts without it; a path uses that
file. Only the driver's JVM takes it (in local mode it is the executor too); a
cluster's executors start as Spark starts them. :mod:`infra.services.spark` asks it for the
option; :mod:`infra.services.archive_builder` trains and checks the archive it names.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

#: ``off`` (no archive), a path (that archive), or unset (the cache's, when it holds one).
ARCHIVE_ENV: Final = "FANOUT_CLASS_ARCHIVE"
#: Where the archives are kept (default ``~/.cache/fanout/class-archive``).
CACHE_ENV: Final = "FANOUT_CLASS_ARCHIVE_CACHE"
OFF: Final = "off"


def cache_root() -> Path:
    """Where the archives are kept: ``FANOUT_CLASS_ARCHIVE_CACHE`` or the user's cache."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "fanout" / "class-archive"


def archive_key(java: Path, jars: Iterable[Path], options: str) -> str:
    """What an archive is valid for: the JVM, every jar on the class path, the options.

    A jar is known by its path, size and modification time, the JVM by its library's
    (a JDK update replaces it). The JVM checks the class path itself when it maps an
    archive; the key keeps a stale one from being offered at all.
    """
    digest = hashlib.sha256()
    home = java.resolve().parent.parent
    libjvm = home / "lib" / "server" / "libjvm.so"
    for path in (java.resolve(), libjvm if libjvm.exists() else java.resolve()):
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    for jar in sorted(jars):
        stat = jar.stat()
        digest.update(f"{jar}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    digest.update(options.encode())
    return digest.hexdigest()[:20]


def driver_jars(spark_home: Path, extra: Sequence[Path]) -> list[Path]:
    """The jars the driver's JVM loads from: ``$SPARK_HOME/jars`` and ``spark.jars``."""
    return [*sorted((spark_home / "jars").glob("*.jar")), *extra]


def archive_path(java: Path, spark_home: Path, extra_jars: Sequence[Path], options: str,
                 root: Path | None = None) -> Path:
    """The archive's file for this JVM, Spark's jars, ``extra_jars`` and ``options``."""
    key = archive_key(java, driver_jars(spark_home, extra_jars), options)
    return (root or cache_root()) / f"{_family(spark_home)}-{key}.jsa"


def _family(spark_home: Path) -> str:
    """The name shared by the archives of one ``SPARK_HOME`` (one install of PySpark).

    A new archive replaces its family's older ones and leaves other installs' alone.
    """
    return "spark-driver-" + hashlib.sha256(str(spark_home.resolve()).encode()).hexdigest()[:8]


def driver_option(java: Path | None, spark_home: Path, extra_jars: Sequence[Path],
                  options: str) -> str:
    """``-XX:SharedArchiveFile=…`` for the driver when an archive is there, else ``""``."""
    setting = os.environ.get(ARCHIVE_ENV, "").strip()
    if setting.lower() == OFF or java is None:
        return ""
    if setting:
        return f"-XX:SharedArchiveFile={setting}"
    try:
        path = archive_path(java, spark_home, extra_jars, options)
    except OSError:
        return ""
    return f"-XX:SharedArchiveFile={path}" if path.is_file() else ""
