"""The session's local SparkSession, started once (it is slow to start)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local SparkSession (2 shuffle partitions) with the fanout-kafka source."""
    from infra.services.spark import build_session  # imports pyspark: only when a test needs it

    session = build_session("fanout-tests", shuffle_partitions=2)
    yield session
    session.stop()
