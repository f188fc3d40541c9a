"""The Maven jar cache: Apache Kafka, Apache Cassandra and Spark's Kafka connector.

This module owns where the JVM services' jars come from (DESIGN §9, §10). Each
:class:`JarSet` is one Maven artifact at a pinned version; :func:`resolve` copies it
and its runtime dependencies from Maven Central into ``<cache>/<name>-<version>/``
once (a throwaway pom and ``maven-dependency-plugin:copy-dependencies``, the plugin
pinned because Maven 3.8's default is old), and every later call reuses that folder
offline. The install step fills the cache, so nothing downloads at test time: ``make``
fetches every set with ``python -m infra.services.jars`` (this module needs only the
standard library) while the packages install. What pyspark ships is left out of the
connector's class path when it is used (:func:`classpath`), not when it is fetched.
The cache is ``FANOUT_JAR_CACHE``, by default ``~/.cache/fanout/jars``; a folder is
complete only once its ``.complete`` marker is written, so an interrupted download is
redone, never half-used.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Final
from xml.sax.saxutils import escape

from infra.errors import InfraError
from infra.services.process import run_saying

log = logging.getLogger(__name__)

DEPENDENCY_PLUGIN: Final = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_COMPLETE: Final = ".complete"


class JarError(InfraError):
    """A jar set is not in the cache and cannot be fetched here."""


@dataclass(frozen=True)
class JarSet:
    """One pinned Maven artifact (plus extras) whose runtime classpath we cache."""

    name: str
    artifacts: tuple[str, ...]
    #: Artifact ids (jar name prefixes) left out.
    exclude: tuple[str, ...] = ()
    #: A Python package whose ``jars/`` folder the host JVM already loads (pyspark):
    #: every artifact found there, at whatever version, is left out so none clashes.
    provided_by: str = ""

    @property
    def version(self) -> str:
        return self.artifacts[0].rsplit(":", 1)[1]

    @property
    def folder(self) -> str:
        return f"{self.name}-{self.version}"


KAFKA: Final = JarSet("kafka", (
    "org.apache.kafka:kafka_2.13:4.1.1",
    # Kafka logs through slf4j 1.7; this routes it into log4j2 (its own distribution
    # ships the same binding), else the broker's log is silent.
    "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3",
))
CASSANDRA: Final = JarSet("cassandra", ("org.apache.cassandra:cassandra-all:5.0.6",))
#: Spark's own Kafka source, at exactly the pyspark version (pyproject pins 4.2.0).
#: What pyspark ships (Scala, Hadoop, lz4, snappy, slf4j, spark-tags...) is left out,
#: which leaves the connector, spark-token-provider-kafka, kafka-clients, commons-pool2.
SPARK_KAFKA: Final = JarSet("spark-kafka", (
    "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",), provided_by="pyspark")
SETS: Final = {s.name: s for s in (KAFKA, CASSANDRA, SPARK_KAFKA)}


def cache_root() -> Path:
    """The jar cache folder (``FANOUT_JAR_CACHE`` or ``~/.cache/fanout/jars``)."""
    configured = os.environ.get("FANOUT_JAR_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "fanout" / "jars"


def cached(jars: JarSet, root: Path | None = None) -> Path | None:
    """The folder of ``jars`` if it is complete in the cache, else None. No I/O beyond stat."""
    folder = (root or cache_root()) / jars.folder
    return folder if (folder / _COMPLETE).exists() else None


def classpath(jars: JarSet, root: Path | None = None) -> list[Path]:
    """The cached jars of ``jars``; raise :class:`JarError` saying how to fetch them."""
    folder = cached(jars, root)
    if folder is None:
        msg = (f"the {jars.name} jars ({', '.join(jars.artifacts)}) are not in the jar cache "
               f"{root or cache_root()}: run `make install` (or `fanout jars`) once with "
               "access to Maven Central")
        raise JarError(msg)
    provided = _provided_artifacts(jars)
    return sorted(p for p in folder.glob("*.jar")
                  if not _excluded(p.name, jars) and artifact_id(p.name) not in provided)


def resolve(jars: JarSet, root: Path | None = None) -> Path:
    """Fetch ``jars`` into the cache unless they are there; return the folder."""
    root = root or cache_root()
    done = cached(jars, root)
    if done is not None:
        return done
    mvn = shutil.which("mvn")
    if mvn is None:
        msg = ("Maven (`mvn`) is needed once to fetch the Kafka and Cassandra jars from Maven "
               "Central: on Debian/Ubuntu `sudo apt-get install -y maven`")
        raise JarError(msg)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{jars.name}-") as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(_pom(jars))
        out = work / "jars"
        log.info("fetching %s from Maven Central into %s", ", ".join(jars.artifacts), root)
        result = run_saying(
            [mvn, "-B", "-q", "-f", str(work / "pom.xml"), f"{DEPENDENCY_PLUGIN}:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputDirectory={out}"],
            f"fetching the {jars.name} jars", capture=True, timeout=1800)
        if result.returncode != 0 or not any(out.glob("*.jar")):
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
            msg = (f"could not fetch {', '.join(jars.artifacts)} with Maven (exit "
                   f"{result.returncode}); it needs Maven Central once. Maven said:\n{tail}")
            raise JarError(msg)
        (out / _COMPLETE).write_text("\n".join(jars.artifacts) + "\n")
        folder = root / jars.folder
        shutil.rmtree(folder, ignore_errors=True)
        out.rename(folder)
    return folder


def _excluded(name: str, jars: JarSet) -> bool:
    return any(name.startswith(prefix) for prefix in jars.exclude)


#: ``<artifact id>-<version>.jar``; a version starts with ``<digits>.<digits>``, so
#: ``spark-sql-kafka-0-10_2.13-4.2.0.jar`` is ``spark-sql-kafka-0-10_2.13``.
_JAR_NAME: Final = re.compile(r"^(.+?)-\d+(?:\.\d+)+[^-]*(?:-[^-]+)?\.jar$")


def artifact_id(jar_name: str) -> str:
    """The Maven artifact id of a jar file named by ``copy-dependencies``."""
    match = _JAR_NAME.match(jar_name)
    return match.group(1) if match else jar_name.removesuffix(".jar")


def _provided_artifacts(jars: JarSet) -> set[str]:
    if not jars.provided_by:
        return set()
    spec = find_spec(jars.provided_by)
    if spec is None or spec.origin is None:
        msg = f"the {jars.name} jars need the {jars.provided_by} package, which is not installed"
        raise JarError(msg)
    return {artifact_id(p.name) for p in (Path(spec.origin).parent / "jars").glob("*.jar")}


def _pom(jars: JarSet) -> str:
    deps = "".join(
        "<dependency><groupId>{}</groupId><artifactId>{}</artifactId>"
        "<version>{}</version></dependency>".format(*map(escape, a.split(":")))
        for a in jars.artifacts)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0'
            "</modelVersion><groupId>fanout</groupId><artifactId>jar-cache</artifactId>"
            "<version>1</version><packaging>pom</packaging>"
            f"<dependencies>{deps}</dependencies></project>")


def register(sub: argparse._SubParsersAction) -> None:
    """``fanout jars``: fill the cache (the install step runs it)."""
    p = sub.add_parser("jars", help="fetch the Kafka, Cassandra and Spark-Kafka jars into the "
                                    "cache (env FANOUT_JAR_CACHE; default ~/.cache/fanout/jars)")
    p.add_argument("names", nargs="*", default=[], metavar="NAME",
                   help=f"which sets, of {', '.join(SETS)} (default: all)")
    p.set_defaults(func=_cmd_jars)


def _cmd_jars(args: argparse.Namespace) -> int:
    unknown = sorted(set(args.names) - set(SETS))
    if unknown:
        msg = f"no jar set named {', '.join(unknown)}: choose from {', '.join(SETS)}"
        raise JarError(msg)
    for name in args.names or SETS:
        folder = resolve(SETS[name])
        print(f"{name}: {folder} ({len(list(folder.glob('*.jar')))} jars)")
    return 0


if __name__ == "__main__":
    # `make` runs this with the system's Python while uv fills the virtualenv: the
    # standard library only (no `fanout` yet), the command's output and exit status.
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        sys.exit(_cmd_jars(argparse.Namespace(names=sys.argv[1:])))
    except JarError as exc:
        print(f"fanout jars: {exc}", file=sys.stderr)
        sys.exit(1)
