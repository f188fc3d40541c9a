"""infra has one exception root, and the ``fanout`` command prints it without a traceback."""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
from pathlib import Path

import pytest

import infra
from infra import cli
from infra.errors import InfraError


def test_every_infra_exception_is_an_infra_error() -> None:
    found = []
    for module in pkgutil.walk_packages(infra.__path__, "infra."):
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.startswith("infra."):
                found.append(cls)
    assert len(found) >= 7, found  # InfraError, LoadRunError and one per service
    assert [c for c in found if not issubclass(c, InfraError)] == []


def test_cli_prints_an_infra_error_without_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.ERROR):
        assert cli.main(["--run-dir", str(tmp_path), "jars", "bogus"]) == 1
    assert "no jar set named bogus" in caplog.text
    assert all(r.exc_info is None for r in caplog.records)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
