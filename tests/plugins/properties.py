"""Hypothesis's settings for the whole suite: no per-example deadline.

The property tests run on two workers beside JVMs starting and compacting on two
cores, where one trivial example can take 300 ms once and 0.1 ms when Hypothesis
tries it again; its default 200 ms deadline then fails the test as "flaky" for a
pause that says nothing about the code. Speed is measured in ``benchmarks/``, never
asserted in a test (docs/style.md); each test's own ``pytest.mark.timeout`` still
bounds a test that hangs.
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("fanout", deadline=None)
settings.load_profile("fanout")
