"""ruff and mypy over the whole project, as part of the suite (STYLE §12)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)


def test_ruff_is_clean():
    out = _run("ruff", "check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.timeout(600)
def test_mypy_is_clean():
    out = _run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr
