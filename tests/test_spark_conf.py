"""The Spark settings fanout starts its session with (infra.spark.session_conf)."""

from __future__ import annotations

import pytest

from infra.settings import SPARK_DRIVER_MEMORY_ENV
from infra.spark import DRIVER_MEMORY, JIT_OPTIONS, session_conf


def test_the_driver_heap_is_1g_unless_fanout_spark_driver_memory_says(
        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(SPARK_DRIVER_MEMORY_ENV, raising=False)
    assert session_conf(2)["spark.driver.memory"] == DRIVER_MEMORY == "1g"
    monkeypatch.setenv(SPARK_DRIVER_MEMORY_ENV, "2g")
    conf = session_conf(2)
    assert conf["spark.driver.memory"] == "2g"
    assert JIT_OPTIONS in conf["spark.driver.extraJavaOptions"]
    assert conf["spark.sql.shuffle.partitions"] == "2"
