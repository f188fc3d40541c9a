"""The Spark driver's class archive (infra.services.class_archive, infra.services.archive_builder): keyed,
trained, checked, used."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import pytest

from infra.services import archive_builder
from infra.services.archive_builder import ClassArchiveError, build
from infra.services.class_archive import (
    ARCHIVE_ENV,
    CACHE_ENV,
    archive_key,
    archive_path,
    driver_option,
)
from infra.services.spark import class_archive_path

JAVA = shutil.which("java")
pytestmark = [pytest.mark.skipif(JAVA is None, reason="needs a java on PATH"), pytest.mark.long]


def test_the_sessions_driver_jvm_maps_the_archive_when_one_is_cached(spark):
    # First in the module: the fixture below points the cache elsewhere while it lives.
    path = class_archive_path()
    jvms = [p for p in psutil.Process().children(recursive=True)
            if p.name() == "java" and "org.apache.spark.deploy.SparkSubmit" in p.cmdline()]
    assert jvms
    if path is None or not path.is_file():
        pytest.skip("no class archive cached here (`fanout class-archive` builds it)")
    for jvm in jvms:
        assert f"-XX:SharedArchiveFile={path}" in jvm.cmdline()
        mapped = {m.path for m in jvm.memory_maps()}
        assert str(path) in mapped, "the JVM was given the archive but did not map it"


def _jars(root: Path) -> list[Path]:
    jars = root / "jars"
    jars.mkdir(parents=True, exist_ok=True)
    for name in ("a.jar", "b.jar"):
        (jars / name).write_bytes(name.encode())
    return sorted(jars.glob("*.jar"))


def test_the_key_changes_with_a_jar_the_options_and_nothing_else(tmp_path: Path):
    java = Path(JAVA or "")
    jars = _jars(tmp_path)
    key = archive_key(java, jars, "-Xmx1g")
    assert archive_key(java, list(reversed(jars)), "-Xmx1g") == key
    assert archive_key(java, jars, "-Xmx2g") != key
    assert archive_key(java, jars[:1], "-Xmx1g") != key
    jars[0].write_bytes(b"a newer jar")
    assert archive_key(java, jars, "-Xmx1g") != key


def test_the_driver_is_offered_only_an_archive_made_for_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(ARCHIVE_ENV, raising=False)
    java, home = Path(JAVA or ""), tmp_path
    _jars(home)
    assert driver_option(java, home, [], "-Xmx1g") == ""  # none built
    path = archive_path(java, home, [], "-Xmx1g")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert driver_option(java, home, [], "-Xmx1g") == f"-XX:SharedArchiveFile={path}"
    assert driver_option(java, home, [], "-Xmx2g") == ""  # another heap: another key
    (home / "jars" / "c.jar").write_bytes(b"c")
    assert driver_option(java, home, [], "-Xmx1g") == ""  # a jar more: another key
    monkeypatch.setenv(ARCHIVE_ENV, "off")
    assert driver_option(java, home, [], "-Xmx1g") == ""
    monkeypatch.setenv(ARCHIVE_ENV, "/elsewhere/mine.jsa")
    assert driver_option(java, home, [], "-Xmx1g") == "-XX:SharedArchiveFile=/elsewhere/mine.jsa"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An archive trained in a JVM of its own (one small query), in a cache of the test's."""
    cache = tmp_path_factory.mktemp("class-archive")
    saved = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(cache)
    try:
        target = class_archive_path()
        assert target is not None
        family = target.name.rsplit("-", 1)[0]
        (cache / f"{family}-0123456789abcdef0123.jsa").write_bytes(b"stale")  # older jars
        (cache / "spark-driver-00000000-0123456789abcdef0123.jsa").write_bytes(b"another")
        path, built = build(workload="session")
        assert built
        yield path
    finally:
        if saved is None:
            del os.environ[CACHE_ENV]
        else:
            os.environ[CACHE_ENV] = saved


def test_a_built_archive_is_the_one_the_driver_gets_and_replaces_its_installs_stale_ones(
        trained: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ARCHIVE_ENV, raising=False)
    assert trained == class_archive_path()
    assert trained.stat().st_size > 10 * 2**20  # Spark's classes, parsed
    # Another install's archive (another SPARK_HOME) stays.
    assert sorted(p.name for p in trained.parent.glob("*.jsa")) == sorted(
        [trained.name, "spark-driver-00000000-0123456789abcdef0123.jsa"])
    assert build() == (trained, False)  # cached: not trained again


def test_a_jvm_that_cannot_map_the_archive_fails_the_check(trained: Path, tmp_path: Path):
    # The check's -Xshare:on is what keeps a bad archive out of the cache.
    broken = tmp_path / "broken.jsa"
    broken.write_bytes(trained.read_bytes()[:4096])
    with pytest.raises(ClassArchiveError, match="failed"):
        archive_builder._child(["--check"], tmp_path, "-Xshare:on", archive=broken)
    archive_builder._child(["--check"], tmp_path, "-Xshare:on", archive=trained)
