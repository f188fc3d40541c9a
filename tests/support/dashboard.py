"""The Grafana dashboard's file and what its PromQL expressions select.

:func:`metric_names` is a PromQL tokenizer enough for dashboards: the series an
expression names, not its functions, labels or windows; :func:`walk_panels` visits
nested panels. Used by the dashboard's own checks (``tests/infra/test_dashboard.py``)
and by the whole-stack metrics test, which scrapes a running stack for the same series.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from tests.support.paths import ROOT

INFRA = ROOT / "infra"
DASHBOARD = INFRA / "grafana" / "fanout.json"
#: Exported by the live verifier (``infra/checks/verifier.py``; ``test_the_verifier_exports_them``).
FROM_THE_VERIFIER = {"fanout_verify_divergent", "fanout_verify_checked",
                     "fanout_verify_consistent_within_ratio"}
#: PromQL words that read like series names: aggregations' modifiers and set operators.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
             "offset", "and", "or", "unless", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The series an expression selects (a PromQL tokenizer enough for dashboards)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings may hold any character
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for found in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        called = text[found.end():].lstrip().startswith("(")
        if not called and found.group().lower() not in _KEYWORDS:
            names.add(found.group())
    return names


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels") or [])
