"""The SPARK_HOME fanout starts Spark from: pip's PySpark without its source zips."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa

from infra.services.spark_home import LEFT_OUT, lean_home, package_home


def _package(root: Path) -> Path:
    """A folder shaped like pip's PySpark: scripts, jars, the zips under python/lib."""
    package = root / "site-packages" / "pyspark"
    for name in ("bin", "jars", "sbin", "python/lib"):
        (package / name).mkdir(parents=True)
    (package / "bin" / "spark-class").write_text("#!/bin/sh\n")
    (package / "__init__.py").write_text("")
    (package / "python" / "lib" / "pyspark.zip").write_bytes(b"PK")
    return package


def test_a_python_worker_of_the_session_imports_the_installed_pyspark_not_its_zip(spark):
    def where(batches):
        import sys

        import pyspark

        for _ in batches:
            zips = [p for p in sys.path if p.endswith(".zip")]
            yield pa.RecordBatch.from_pydict({"file": [pyspark.__file__],
                                              "zips": [",".join(zips)]})

    rows = spark.range(0, 2, 1, 2).mapInArrow(where, "file string, zips string").collect()
    assert {row.file for row in rows} == {str(package_home() / "__init__.py")}
    # Spark still names the zips; they are not where it looks, so nothing comes from them.
    assert all(not Path(z).exists() for row in rows for z in row.zips.split(",") if z)


def test_the_lean_home_links_everything_of_pyspark_but_its_python_folder(tmp_path):
    package = _package(tmp_path)
    home = lean_home(package, tmp_path / "cache")
    assert home.parent == tmp_path / "cache"
    assert {p.name for p in home.iterdir()} == {"bin", "jars", "sbin", "__init__.py"}
    assert LEFT_OUT == {"python"}
    assert all(p.is_symlink() and p.resolve() == (package / p.name).resolve()
               for p in home.iterdir())
    assert (home / "bin" / "spark-class").read_text() == "#!/bin/sh\n"
    assert not (home / "python" / "lib" / "pyspark.zip").exists()


def test_the_lean_home_is_made_once_and_remade_when_pyspark_changes(tmp_path):
    package = _package(tmp_path)
    home = lean_home(package, tmp_path / "cache")
    made = home.stat().st_ino
    assert lean_home(package, tmp_path / "cache") == home
    assert home.stat().st_ino == made
    (package / "examples").mkdir()  # an upgrade brought a folder the home does not link
    assert lean_home(package, tmp_path / "cache") == home
    assert (home / "examples").is_symlink()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [home.name]  # no drafts left


def test_a_lean_home_that_cannot_be_made_leaves_spark_to_pips_pyspark(tmp_path, caplog):
    package = _package(tmp_path)
    (tmp_path / "not-a-folder").write_text("")
    with caplog.at_level(logging.WARNING, logger="infra.services.spark_home"):
        assert lean_home(package, tmp_path / "not-a-folder" / "cache") == package
    assert "could not make a SPARK_HOME without them" in caplog.text


def test_two_installs_of_pyspark_get_homes_of_their_own(tmp_path):
    one, two = _package(tmp_path / "a"), _package(tmp_path / "b")
    assert lean_home(one, tmp_path / "cache") != lean_home(two, tmp_path / "cache")
