"""A monotonic clock as on a freshly booted host, for code that takes 0 for "never"."""

from __future__ import annotations

import pytest


@pytest.fixture
def booted_just_now(monkeypatch: pytest.MonkeyPatch) -> float:
    """``time.monotonic`` as on a host booted a moment ago: it counts from ~0.

    Linux's monotonic clock starts at boot, so code that takes a start value of 0 for
    "never" behaves differently on a fresh CI machine than on one up for days; tests
    that touch such code run under this fixture so the fresh machine's case is the
    one checked, whatever this host's uptime. Returns the offset taken off.
    """
    import time

    real = time.monotonic
    origin = real()
    monkeypatch.setattr(time, "monotonic", lambda: real() - origin)
    return origin
